"""Local networks on this machine: the one helper the demo fleet, the browser tests' stack and the
benchmarks start their edges, validators and trainers with.

    prepare_network(root)    real MNIST prepared, a validator identity, ``root/network.json``
    LocalNetwork             what that gives: paths, the manifest, command lines and settings for its nodes
    Fleet                    nodes as processes with their logs under ``<out>/logs`` (stopped newest first)
    validating(...)          a validator judging in a background thread until the block ends
    serve_stack(...)         edge (uvicorn in a thread) + validator until SIGTERM: ``python -m lab stack``
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import httpx

from datasets import mnist
from native_peer.compile_cache import CACHE_ENV
from native_peer.identity import NodeIdentity
from native_peer.storage import StorageConfig
from native_peer.validator import Validator, ValidatorConfig
from native_peer.workloads import network_learners
from protocol.manifests import ExperimentSpec, NetworkManifest
from server.serve import BackgroundEdge
from server.settings import Settings
from tools.networks import mnist_network

__all__ = ["REPO", "Fleet", "LocalNetwork", "free_port", "prepare_network", "serve_stack", "validating"]

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
PYODIDE_DIR = REPO / "var" / "pyodide"
DEFAULT_VALIDATOR = ValidatorConfig()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class LocalNetwork:
    root: Path
    datasets: Path
    network: NetworkManifest

    @property
    def network_path(self) -> Path:
        return self.root / "network.json"

    @property
    def validator_storage(self) -> StorageConfig:
        return StorageConfig(self.root / "validator")

    def edge_settings(self, port: int = 0, **overrides: Any) -> Settings:
        options: dict[str, Any] = {
            "port": port,
            "data_dir": self.root / "edge",
            "datasets_dir": self.datasets,
            "network": self.network_path,
            "pyodide_dir": PYODIDE_DIR,
            **overrides,
        }
        return Settings(**options)

    def edge_argv(self, port: int, *flags: str) -> list[str]:
        settings = self.edge_settings(port)
        return [
            sys.executable, "-m", "server", "--port", str(port), "--data-dir", str(settings.data_dir),
            "--datasets-dir", str(self.datasets), "--network", str(self.network_path),
            "--pyodide-dir", str(settings.pyodide_dir), *flags,
        ]  # fmt: skip

    def validator_argv(self, url: str) -> list[str]:
        return [
            sys.executable, "-m", "native_peer", "validate", "--edge", url, "--network", str(self.network_path),
            "--storage", str(self.validator_storage.root), "--datasets", str(self.datasets),
        ]  # fmt: skip

    def trainer_argv(self, url: str, storage: Path) -> list[str]:
        return [
            sys.executable, "-m", "native_peer", "train", "--edge", url, "--network", str(self.network_path),
            "--storage", str(storage),
        ]  # fmt: skip

    def validator(self, url: str, config: ValidatorConfig = DEFAULT_VALIDATOR) -> Validator:
        return Validator(
            network_learners(self.network), self.network, self.validator_storage, url, self.datasets, config
        )


def prepare_network(
    root: Path,
    *,
    datasets: Path | None = None,
    network: Callable[[bytes], NetworkManifest] = mnist_network,
) -> LocalNetwork:
    """MNIST under ``datasets`` (default ``root/datasets``; prepared once, verified after), a validator
    identity under ``root/validator`` and ``network(validator key)`` written to ``root/network.json``."""
    datasets = datasets or root / "datasets"
    mnist.prepare(datasets)
    identity = NodeIdentity.load_or_create(StorageConfig(root / "validator").identity_path)
    local = LocalNetwork(root, datasets, network(identity.public_key))
    local.network_path.write_text(json.dumps(local.network.to_wire(), indent=1))
    return local


@dataclass
class Fleet:
    """Nodes as processes, each logging to ``<out>/logs/<name>.log``; as a context manager stops them all."""

    out: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, BinaryIO] = field(default_factory=dict)
    _sigterm: Any = field(default=None, repr=False)  # the SIGTERM handler ``__enter__`` replaced

    def log_path(self, name: str) -> Path:
        return self.out / "logs" / f"{name}.log"

    def start(self, name: str, argv: Sequence[str]) -> None:
        """Start node ``name``. The fleet's nodes share one JAX compilation cache of their own
        (``native_peer.compile_cache``), under ``out`` unless ``DTN_COMPILE_CACHE`` (or JAX's own
        ``JAX_COMPILATION_CACHE_DIR``) names one: each run starts with nothing compiled, as a new
        machine does."""
        self.log_path(name).parent.mkdir(parents=True, exist_ok=True)
        self.logs[name] = open(self.log_path(name), "ab")  # noqa: SIM115 - closed in stop()
        env = {CACHE_ENV: str(self.out / "compile-cache"), **os.environ}
        self.processes[name] = subprocess.Popen(
            argv, stdout=self.logs[name], stderr=subprocess.STDOUT, cwd=REPO, env=env
        )

    def stop(self, name: str, timeout_s: float = 20.0) -> int | None:
        process = self.processes.pop(name)
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()
        finally:
            self.logs.pop(name).close()

    def stop_all(self, *, keep: tuple[str, ...] = ()) -> None:
        """Stop every process but ``keep``, newest first (the edge, started first, goes last)."""
        for name in reversed(list(self.processes)):
            if name not in keep:
                self.stop(name)

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}; see {self.log_path(name)}")

    def wait_ready(self, url: str, timeout_s: float = 60.0) -> None:
        """Until ``url`` answers below 500 (every node must stay alive meanwhile)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if httpx.get(url, timeout=2).status_code < 500:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s")

    def start_edge_and_validator(
        self, local: LocalNetwork, port: int, *edge_flags: str, host: str = "127.0.0.1"
    ) -> None:
        """``local``'s edge (``edge_flags`` added) on ``port`` of ``host``, then, once it answers, its
        validator."""
        url = f"http://{host}:{port}"
        self.start("edge", local.edge_argv(port, *edge_flags, "--host", host))
        self.wait_ready(f"{url}/healthz")
        self.start("validator", local.validator_argv(url))

    def __enter__(self) -> Fleet:
        """In the main thread of a process that leaves SIGTERM to its default (a benchmark, ``python -m
        lab``), SIGTERM ends the process through ``__exit__``, so its nodes are stopped too instead of
        running on and taking the cores of whatever runs next."""
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        try:
            self.stop_all()
        finally:
            if self._sigterm is not None:
                signal.signal(signal.SIGTERM, self._sigterm)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def validating(
    local: LocalNetwork,
    url: str,
    specs: Sequence[ExperimentSpec] | None = None,
    config: ValidatorConfig = DEFAULT_VALIDATOR,
) -> Iterator[Validator]:
    """A validator for ``specs`` (default: every experiment) judging in a thread; genesis heads exist
    when the block starts. Stopped and closed when it ends."""
    specs = list(specs or local.network.experiments)
    validator = local.validator(url, config)
    for spec in specs:
        validator.ensure_genesis(spec)
    stop = threading.Event()
    thread = threading.Thread(target=validator.run, args=(specs, stop), daemon=True, name="validator")
    thread.start()
    try:
        yield validator
    finally:
        stop.set()
        thread.join(30)
        validator.close()


def held_windows(window_s: float) -> tuple[Callable[[bytes], NetworkManifest], ValidatorConfig]:
    """The browser tests' network (the demo's, as ``"e2e"``) and validator, whose windows wait
    ``window_s`` at least for a lease that never delivers: the validator's least deadline, and its
    experiments' ``window_timeout_s`` (the most a deadline may be: ``protocol.deadline``) raised to it."""

    def network(validator_key: bytes) -> NetworkManifest:
        demo = mnist_network(validator_key, "e2e")
        held = tuple(replace(s, window_timeout_s=max(s.window_timeout_s, window_s)) for s in demo.experiments)
        return replace(demo, experiments=held)

    return network, replace(DEFAULT_VALIDATOR, deadline=replace(DEFAULT_VALIDATOR.deadline, min_s=window_s))


def serve_stack(out: Path, port: int, min_deadline_s: float = DEFAULT_VALIDATOR.deadline.min_s) -> None:
    """Edge + validator on ``port`` until SIGTERM or SIGINT (what the browser tests run against);
    ``min_deadline_s``: how long a window waits at least for a lease that never delivers (``held_windows``)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    network, config = held_windows(min_deadline_s)
    local = prepare_network(out, datasets=REPO / "var" / "datasets", network=network)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    with BackgroundEdge(local.edge_settings(port)) as edge, validating(local, edge.url, config=config):
        log.info("stack serving at %s", edge.url)
        stopped.wait()
