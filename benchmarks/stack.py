"""Processes the benchmarks measure: an edge and a plain static file server, each its own process."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from protocol.ids import DatasetId, ExperimentKey
from protocol.manifests import ExperimentSpec, NetworkManifest

__all__ = ["BENCH_EXPERIMENT", "free_port", "running", "write_bench_network"]

REPO = Path(__file__).resolve().parent.parent
BENCH_EXPERIMENT = ExperimentKey.parse("bench/mnist/rev-1")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_bench_network(path: Path, validator_key: bytes, shards_per_lease: int = 50) -> NetworkManifest:
    spec = ExperimentSpec(BENCH_EXPERIMENT, DatasetId("mnist"), "mnist-mlp", 1e-3, 64, 1, shards_per_lease)
    network = NetworkManifest("bench", (validator_key,), (spec,))
    path.write_text(json.dumps(network.to_wire()))
    return network


@contextmanager
def running(argv: list[str], health_url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(health_url, timeout=1).status_code < 500:
                        break
                except httpx.TransportError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{argv[2]} did not start; see {log}")
                time.sleep(0.1)
            yield process
        finally:
            process.terminate()
            process.wait(10)


def edge_argv(port: int, root: Path, datasets: Path) -> list[str]:
    return [
        sys.executable, "-m", "server", "--port", str(port), "--data-dir", str(root / "edge"),
        "--datasets-dir", str(datasets), "--network", str(root / "network.json"), "--messages-per-s", "100000",
    ]  # fmt: skip
