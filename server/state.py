"""``EdgeState``: everything one running edge holds, built once at start-up."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from datasets.layout import manifest_path, read_train_manifest
from protocol.clock import SYSTEM_CLOCK, Clock
from protocol.ids import DatasetId, ExperimentKey
from protocol.manifests import ExperimentSpec, FetchManifest, NetworkManifest
from protocol.signing import PureSigner

from .admission import Admission
from .blobs import BlobStore
from .errors import NotFound
from .hub import Hub
from .metrics import EdgeMetrics
from .ratelimit import KeyedRateLimiter
from .settings import Settings
from .signatures import install_native_verifier
from .store import Store

__all__ = ["EdgeState", "load_datasets"]

log = logging.getLogger(__name__)


@dataclass
class EdgeState:
    settings: Settings
    store: Store
    blobs: BlobStore
    hub: Hub
    metrics: EdgeMetrics
    signer: PureSigner
    network: NetworkManifest
    datasets: dict[DatasetId, FetchManifest]
    peer_limits: KeyedRateLimiter
    address_limits: KeyedRateLimiter  # signature checks per client address, before they are made
    admission: Admission
    clock: Clock

    @classmethod
    def open(cls, settings: Settings, clock: Clock = SYSTEM_CLOCK) -> EdgeState:
        install_native_verifier()
        store = Store(settings.data_dir / "edge.sqlite3")
        signer = PureSigner(store.edge_seed())
        network = NetworkManifest.from_wire(json.loads(settings.network.read_bytes()))
        metrics = EdgeMetrics()
        return cls(
            settings=settings,
            store=store,
            blobs=BlobStore(settings.data_dir / "blobs"),
            hub=Hub(metrics, settings.send_queue_size, clock),
            metrics=metrics,
            signer=signer,
            network=replace(network, edge_key=signer.public_key),
            datasets=load_datasets(settings.datasets_dir),
            admission=Admission(store, network.admission_required, clock),
            peer_limits=KeyedRateLimiter(
                settings.peer_requests_per_min / 60, max(1.0, settings.peer_requests_per_min / 4), clock=clock
            ),
            address_limits=KeyedRateLimiter(
                settings.address_checks_per_min / 60, max(1.0, settings.address_checks_per_min / 4), clock=clock
            ),
            clock=clock,
        )

    def experiment(self, key: ExperimentKey | str) -> ExperimentSpec:
        try:
            return self.network.experiment(key)
        except KeyError:
            raise NotFound(f"no experiment {key} on this network") from None

    def dataset(self, dataset_id: str) -> FetchManifest:
        try:
            return self.datasets[DatasetId(dataset_id)]
        except KeyError:
            raise NotFound(f"no dataset {dataset_id}") from None

    def shard_path(self, manifest: FetchManifest, locator: str) -> Path:
        return self.settings.datasets_dir / manifest.dataset_id / manifest.split / locator


def load_datasets(root: Path) -> dict[DatasetId, FetchManifest]:
    """Every prepared dataset under ``root`` (``datasets.layout``), each shard file checked."""
    datasets: dict[DatasetId, FetchManifest] = {}
    for dataset_root in sorted(path for path in root.glob("*") if manifest_path(path).exists()):
        manifest = read_train_manifest(dataset_root)
        datasets[manifest.dataset_id] = manifest
        log.info("serving dataset %s: %d shards", manifest.dataset_id, len(manifest.shards))
    return datasets
