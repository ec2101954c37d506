"""Helpers shared by tests: identities, a network manifest, signed heads and candidates."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import httpx
import numpy as np
import pytest

from lab.stack import Fleet, LocalNetwork
from native_peer import Project, StorageConfig, Validator
from native_peer.edge_client import EdgeClient
from native_peer.identity import NodeIdentity
from native_peer.mnist import RELEASE, WORKLOAD, mlp_learner
from native_peer.models import builtin_model
from native_peer.trainer import Trainer
from protocol.codec import encode_tensors
from protocol.envelope import pack_envelope
from protocol.hashing import content_id
from protocol.ids import DatasetId, ExperimentKey, HeadId, LeaseId
from protocol.manifests import ExperimentSpec, NetworkManifest
from protocol.messages import READ_PROOF_HEADER, Candidate, HeadDescriptor, Lease, LeaseGrant, PeerProof
from protocol.model import init_params
from protocol.signing import PureSigner, Signer, peer_id_from_public_key
from protocol.updates import encode_update
from server.serve import BackgroundEdge
from server.settings import Settings
from tools.networks import mnist_network

VALIDATOR = PureSigner(b"\x11" * 32)
EXPERIMENT = ExperimentKey.parse("study/mnist/rev-1")
SPEC = builtin_model("mnist-mlp")


def now_ms() -> int:
    return int(time.time() * 1000)


def experiment_spec(key: ExperimentKey = EXPERIMENT, **overrides: object) -> ExperimentSpec:
    options: dict[str, object] = {
        "key": key,
        "dataset_id": DatasetId("mnist"),
        "model": SPEC,
        "learning_rate": 1e-3,
        "batch_size": 64,
        "local_epochs": 1,
        "shards_per_lease": 2,
        **overrides,
    }
    return ExperimentSpec(**options)  # type: ignore[arg-type]


def write_network(path: Path, *specs: ExperimentSpec) -> NetworkManifest:
    network = NetworkManifest("test-net", (VALIDATOR.public_key,), specs or (experiment_spec(),))
    path.write_text(json.dumps(network.to_wire()))
    return network


def head_envelope(
    params: dict[str, np.ndarray] | None = None,
    *,
    parent: HeadId | None = None,
    window: int = 0,
    signer: PureSigner = VALIDATOR,
    experiment: ExperimentKey = EXPERIMENT,
    metrics: dict[str, float] | None = None,
) -> tuple[HeadDescriptor, bytes]:
    artifact = encode_tensors(params if params is not None else init_params(SPEC, window))
    head = HeadDescriptor(
        experiment=experiment,
        head_id=HeadId(content_id(artifact)),
        parent=parent,
        window=window,
        global_step=0,
        merged=(),
        validator_key=signer.public_key,
        created_at_ms=now_ms(),
        metrics=metrics or {},
    ).signed(signer)
    return head, pack_envelope(head.to_wire(), artifact)


def candidate_envelope(
    trainer: Signer,
    base: HeadId,
    lease_id: str = "lease-x",
    *,
    seed: int = 1,
    peer_kind: str = "native",
    params: Mapping[str, np.ndarray] | None = None,
    codec: str = "fp32",
) -> tuple[Candidate, bytes]:
    """A signed candidate envelope: ``params`` (default: a fresh init from ``seed``) on ``base``, as an
    update from all-zero parameters under ``codec``."""
    trained = init_params(SPEC, seed) if params is None else dict(params)
    zeros = {name: np.zeros_like(value) for name, value in trained.items()}
    artifact = encode_tensors(encode_update(SPEC, zeros, trained, codec, None)[0])
    lease = Lease(
        LeaseId(lease_id),
        EXPERIMENT,
        peer_id_from_public_key(trainer.public_key),
        base,
        0,
        DatasetId("mnist"),
        (),
        0,
        1,
    )
    candidate = Candidate.for_lease(
        lease, lease.base_head, artifact, trainer, peer_kind=peer_kind, examples=1000, steps=10, created_at_ms=now_ms()
    )
    return candidate, pack_envelope(candidate.to_wire(), artifact)


def signed_lease(
    trainer: Signer,
    base: HeadId,
    edge: Signer,
    *,
    lease_id: str = "lease-x",
    experiment: ExperimentKey = EXPERIMENT,
    window: int = 0,
) -> Lease:
    """A lease for ``trainer`` on ``base`` (for ``window``), signed by ``edge``."""
    lease = Lease(
        LeaseId(lease_id),
        experiment,
        peer_id_from_public_key(trainer.public_key),
        base,
        window,
        DatasetId("mnist"),
        (),
        0,
        1,
    )
    return lease.signed(edge)


def proof(signer: PureSigner, purpose: str, nonce: str = "-", kind: str = "native") -> dict[str, object]:
    return PeerProof(purpose, signer.public_key, kind, nonce, now_ms()).signed(signer).to_wire()


def validator_reads(path: str, signer: Signer = VALIDATOR) -> dict[str, str]:
    """Headers with a validator's signed proof that it reads ``path`` (open windows' candidates)."""
    return {READ_PROOF_HEADER: PeerProof.for_read(signer, "validator", path, now_ms())}


def grant_lease(
    http: httpx.Client, signer: PureSigner, kind: str = "native", cache_bytes: int | None = None, **headers: str
) -> LeaseGrant:
    """Lease the current window's shards for ``signer`` over HTTP (relative to the experiment BASE),
    declaring a shard cache of ``cache_bytes`` when given."""
    response = http.post(
        f"/v1/experiments/{EXPERIMENT}/leases",
        json=proof(signer, "lease", kind=kind),
        params={} if cache_bytes is None else {"cache_bytes": cache_bytes},
        headers=headers,
    )
    assert response.status_code == 200, response.text
    return LeaseGrant.from_wire(response.json())


def edge_settings(root: Path, datasets: Path, **overrides: Any) -> Settings:
    """Settings for a test edge on a free port, its state under ``root``, network at ``root/network.json``."""
    options: dict[str, Any] = {
        "port": 0,
        "data_dir": root / "edge",
        "datasets_dir": datasets,
        "network": root / "network.json",
        "pyodide_dir": root / "no-pyodide",
        **overrides,
    }
    return Settings(**options)


def missing(message: str) -> NoReturn:
    """Under CI (``make test`` installs everything first) a missing prerequisite fails; elsewhere it skips."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _private(kind: str) -> Iterator[Any]:
    """A started ``deploy.services`` server of ``kind``, stopped after the session."""
    try:
        from deploy import services
    except ImportError as exc:  # psycopg or redis: the `scale` extra
        missing(f"{kind} needs {exc.name} (make setup installs the scale extra)")
    try:
        server = getattr(services, kind)()
    except services.ServiceMissing as exc:
        missing(f"{kind} cannot run here: {exc}")
    with server:
        yield server


@pytest.fixture(scope="session")
def private_postgres() -> Iterator[Any]:
    """A private PostgreSQL cluster on loopback (``deploy.services.PrivatePostgres``)."""
    yield from _private("PrivatePostgres")


@pytest.fixture(scope="session")
def private_redis() -> Iterator[Any]:
    """A private redis-server on loopback (``deploy.services.PrivateRedis``)."""
    yield from _private("PrivateRedis")


def tools_output(argv: list[str]) -> str:
    """Run ``python -m tools`` in-process and return what it printed."""
    from tools.cli import main as tools_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        tools_main(argv)
    return out.getvalue()


def workload_config(key: ExperimentKey, model: str, workload: str) -> str:
    """A network config of one MNIST experiment ``key`` training the workload at import path ``workload``
    as model ``model``."""
    return f"""
[[experiments]]
key = "{key}"
dataset_id = "mnist"
model = "{model}"
workload = "{workload}"
learning_rate = 1e-3
batch_size = 64
local_epochs = 1
shards_per_lease = 2
"""


def init_network_argv(root: Path, config: str, datasets: Path) -> list[str]:
    """``python -m tools init-network`` of the network config text ``config`` (written to
    ``root/network.toml``), checked against ``datasets``, in ``LocalNetwork``'s layout under ``root``:
    one validator (``root/validator``), the manifest at ``root/network.json``."""
    (root / "network.toml").write_text(config)
    return [
        "init-network", "--validator-storage", str(root / "validator"), "--out", str(root / "network.json"),
        "--config", str(root / "network.toml"), "--datasets", str(datasets),
    ]  # fmt: skip


def network_from_config(root: Path, config: str, datasets: Path) -> LocalNetwork:
    """The network ``init-network`` writes from the config text ``config`` (``init_network_argv``)."""
    from tools.cli import main as tools_main

    tools_main(init_network_argv(root, config, datasets))
    return LocalNetwork(root, datasets, NetworkManifest.from_wire(json.loads((root / "network.json").read_text())))


def mnist_trainer(
    network: NetworkManifest, storage: Path, url: str | list[str], *, continuous: bool = False
) -> Trainer:
    """A native MNIST MLP trainer spawned through the builder API, as users write it."""
    return (
        Project(mlp_learner())
        .trainer(RELEASE, WORKLOAD)
        .with_network(network)
        .with_storage(StorageConfig(storage))
        .with_bootstrap_peer(url)
        .with_continuous_training(continuous)
        .spawn()
    )


@contextlib.contextmanager
def mnist_network_env(root: Path, datasets: Path) -> Iterator[tuple[BackgroundEdge, Validator, Path]]:
    """A real edge serving ``tools.networks.mnist_network`` (its ``network.json`` written under
    ``root``) and its one validator (storage ``root/validator``), not yet at genesis; yields
    (edge, validator, root)."""
    storage = StorageConfig(root / "validator")
    network = mnist_network(NodeIdentity.load_or_create(storage.identity_path).public_key)
    (root / "network.json").write_text(json.dumps(network.to_wire()))
    with BackgroundEdge(edge_settings(root, datasets)) as edge:
        validator = Validator(mlp_learner(), network, storage, edge.url, datasets)
        try:
            yield edge, validator, root
        finally:
            validator.close()


def metric(source: httpx.Client | str, name: str, **labels: str) -> float:
    """``sum(name{labels})`` in a Prometheus text exposition: the values of the series ``name`` whose
    labels include ``labels`` (in any order), summed; 0 when there is none (a labelled counter appears
    once counted). ``source``: the exposition's text, or a client of the edge, whose ``/metrics`` is read."""
    text = source if isinstance(source, str) else source.get("/metrics").text
    wanted = {f'{key}="{value}"' for key, value in labels.items()}
    total = 0.0
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        metric_name, _, rest = series.partition("{")
        if (
            not line.startswith("#")
            and metric_name == name
            and wanted <= set(filter(None, rest.rstrip("}").split(",")))
        ):
            total += float(value)
    return total


def browsers(http: httpx.Client) -> float:
    """Browser peers joined to the relay of the edge ``http`` talks to."""
    return metric(http, "dtn_ws_connections", kind="browser")


def until(
    what: str, check: Callable[[], Any], timeout_s: float, *, poll_s: float = 0.2, fleet: Fleet | None = None
) -> Any:
    """``check()``'s first truthy value, asked every ``poll_s``; fails naming ``what`` after ``timeout_s``
    (or as soon as a process of ``fleet`` has exited)."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if fleet is not None:
            fleet.check_alive()
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(poll_s)
    return value


def measured_accuracies(
    client: EdgeClient, network: NetworkManifest, heads: list[HeadDescriptor], timeout_s: float = 60.0
) -> list[float]:
    """The test accuracy of each of ``heads`` as the network's validators measured it (a head's
    ``Evaluation`` follows its publication), waiting up to ``timeout_s`` for the last ones."""

    def measured() -> dict[HeadId, dict[str, float]] | None:
        found = client.evaluated(heads[0].experiment, network.validator_key_set)
        return found if all(h.head_id in found for h in heads) else None

    found = until(f"test-split evaluations of windows {[h.window for h in heads]}", measured, timeout_s)
    return [found[h.head_id]["test_accuracy"] for h in heads]


@functools.cache
def node_command() -> list[str]:
    """Node, with relaxed SIMD on where this V8 has it behind a flag (Node 20; Chromium has it on)."""
    node = shutil.which("node")
    assert node, "node is required"
    options = subprocess.run([node, "--v8-options"], capture_output=True, text=True, check=True).stdout
    flag = "--experimental-wasm-relaxed-simd"
    return [node, flag] if flag in options else [node]


def on_pyodide(script: str | Path, kernels: Path, *bundle: str) -> dict[str, Any]:
    """The JSON ``script`` (a file name in tests/, or a path) ends with, run in Pyodide under Node with
    ``kernels`` linked and, given a peer bundle, its code importable (``tests/wasm_kernels_pyodide.mjs``)."""
    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [
            *node_command(),
            str(Path(__file__).with_name("wasm_kernels_pyodide.mjs")),
            str(repo / "node_modules" / "pyodide" / "pyodide.mjs"),
            f"{repo / 'var' / 'pyodide'}/",
            str(kernels),
            str(Path(__file__).parent / script),
            *bundle,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
