"""The demo network: two MNIST experiments on one network, a baseline and a low learning rate."""

from __future__ import annotations

from protocol.ids import DatasetId, ExperimentKey
from protocol.manifests import ExperimentSpec, NetworkManifest, ReleaseManifest, SupportedWorkload

__all__ = ["BASELINE", "LOW_LR", "RELEASE", "WORKLOAD", "demo_network"]

BASELINE = ExperimentKey.parse("study/mnist/rev-1")
LOW_LR = ExperimentKey.parse("study/mnist-low-lr/rev-1")
RELEASE = ReleaseManifest("dtn-0.1.0")
WORKLOAD = SupportedWorkload("mnist-mlp-cpu", "mnist-mlp", DatasetId("mnist"))


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


def demo_network(validator_key: bytes, network_id: str = "demo") -> NetworkManifest:
    return NetworkManifest(network_id, (validator_key,), (_spec(BASELINE, 2e-3), _spec(LOW_LR, 2e-5)))
