"""Network manifests an operator starts from: the MNIST preset (a baseline and a low learning rate),
which the demo runs too, and ``write_network`` (validator identities plus the manifest file)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from native_peer.identity import NodeIdentity
from native_peer.storage import StorageConfig
from protocol.ids import DatasetId, ExperimentKey
from protocol.manifests import ExperimentSpec, NetworkManifest

__all__ = ["BASELINE", "LOW_LR", "mnist_network", "write_network"]

BASELINE = ExperimentKey.parse("study/mnist/rev-1")
LOW_LR = ExperimentKey.parse("study/mnist-low-lr/rev-1")


def _spec(key: ExperimentKey, learning_rate: float) -> ExperimentSpec:
    return ExperimentSpec(
        key=key,
        dataset_id=DatasetId("mnist"),
        model="mnist-mlp",
        learning_rate=learning_rate,
        batch_size=64,
        local_epochs=1,
        shards_per_lease=4,
        min_candidates=1,
        window_timeout_s=30.0,
        screening="balanced",
    )


def mnist_network(validator_key: bytes, network_id: str = "demo") -> NetworkManifest:
    """Two MNIST experiments on one network: ``BASELINE`` (Adam 2e-3, DiLoCo's outer Nesterov step,
    int8 updates: what ``benchmarks.network_efficiency`` found fastest to 0.97) and ``LOW_LR`` (Adam
    2e-5, FedAvg, fp32: the plain control)."""
    baseline = replace(_spec(BASELINE, 2e-3), outer_optimizer="nesterov", codec="int8")
    return NetworkManifest(network_id, (validator_key,), (baseline, _spec(LOW_LR, 2e-5)))


def write_network(
    validator_storages: Sequence[Path], out: Path, network_id: str = "demo", quorum: int = 1
) -> NetworkManifest:
    """Create (or reuse) a validator identity under each of ``validator_storages`` and write their
    network to ``out``: a head is canonical once ``quorum`` of them vouch for it."""
    keys = tuple(
        NodeIdentity.load_or_create(StorageConfig(path).identity_path).public_key for path in validator_storages
    )
    network = replace(mnist_network(keys[0], network_id), validator_keys=keys, quorum=quorum)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(network.to_wire(), indent=1))
    return network
