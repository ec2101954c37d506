"""``EdgeState``: everything one running edge holds, built once at start-up.

Its engines come from the settings: the store (SQLite in ``data_dir``, or PostgreSQL at
``store_url``), the blobs (``blobs_dir``, or an S3-compatible bucket at ``blobs_url``), and with ``redis_url`` the hub's fan-out and the rate
limits and the read proofs seen (``replay``) in Redis, shared with the other edges of a deployment (in
this process otherwise). Staged
uploads (``uploads``) are always this edge's own."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from datasets.layout import manifest_path, read_train_manifest
from protocol.clock import SYSTEM_CLOCK, Clock
from protocol.errors import ProtocolError
from protocol.ids import DatasetId, ExperimentKey
from protocol.manifests import ExperimentSpec, FetchManifest, NetworkManifest
from protocol.network_pins import NetworkSignature
from protocol.network_revisions import revisions_after
from protocol.signing import PureSigner

from .admission import Admission
from .blobs import Blobs, BlobStore
from .credit import CreditBook
from .errors import NotFound
from .head_deltas import HeadDeltas
from .holders import HeadHolders
from .hub import Fanout, Hub
from .ice import IceIssuer
from .metrics import EdgeMetrics
from .ratelimit import KeyedRateLimiter, RateLimiter
from .replay import LocalOnce, Once, RedisOnce
from .settings import Settings
from .signatures import install_native_verifier
from .store import EdgeStore, open_store
from .uploads import Uploads

__all__ = ["EdgeState", "load_datasets", "open_blobs", "revised_history"]

log = logging.getLogger(__name__)
T = TypeVar("T")

REDIS_TIMEOUT_S = 5.0


@dataclass
class EdgeState:
    settings: Settings
    store: EdgeStore
    blobs: Blobs
    hub: Hub
    metrics: EdgeMetrics
    signer: PureSigner
    network: NetworkManifest
    datasets: dict[DatasetId, FetchManifest]
    peer_limits: RateLimiter
    address_limits: RateLimiter  # signature checks per client address, before they are made
    read_proofs: Once  # validators' read proofs presented lately: each is taken once
    admission: Admission
    clock: Clock
    credit: CreditBook
    uploads: Uploads  # artifacts staged in chunks, this edge's own
    holders: HeadHolders = field(default_factory=HeadHolders)  # who holds each current head
    head_deltas: HeadDeltas = field(default_factory=HeadDeltas)  # heads as deltas from their parents
    ice: IceIssuer = field(default_factory=IceIssuer)  # the ICE servers pages are given
    history: dict[int, NetworkManifest] = field(default_factory=dict)  # the network at each revision held, in order
    _offloaded: set[asyncio.Task[Any]] = field(default_factory=set)  # work in worker threads, not ended yet

    @classmethod
    def open(cls, settings: Settings, clock: Clock = SYSTEM_CLOCK) -> EdgeState:
        install_native_verifier()
        store = open_store(settings.store_url, settings.data_dir)
        signer = PureSigner(store.edge_seed())
        first = NetworkManifest.from_wire(json.loads(settings.network.read_bytes()))
        history = revised_history(replace(first, edge_key=signer.public_key), store)
        network = history[max(history)]
        metrics = EdgeMetrics()
        fanout, peer_limits, address_limits, read_proofs = _shared(settings, clock)
        uploads = Uploads(settings.data_dir / "uploads", settings, clock)
        metrics.staged_bytes.set_function(uploads.staged_bytes)
        return cls(
            settings=settings,
            store=store,
            blobs=open_blobs(settings),
            hub=Hub(metrics, settings.send_queue_size, clock, fanout),
            metrics=metrics,
            signer=signer,
            network=network,
            datasets=load_datasets(settings.datasets_dir),
            admission=Admission(store, network.admission_required, clock),
            peer_limits=peer_limits,
            address_limits=address_limits,
            read_proofs=read_proofs,
            clock=clock,
            credit=CreditBook(store),
            uploads=uploads,
            holders=HeadHolders(clock),
            ice=settings.ice,
            history=history,
        )

    async def start(self) -> None:
        self.hub.on_revised = self.take_revisions
        await self.hub.start()

    def take_revisions(self) -> None:
        """Serve the revisions another edge of the deployment added to the shared store since this
        edge read it (``Hub.deliver`` calls this on their ``network`` event)."""
        self.history = revised_history(self.network, self.store, self.history)
        self.network = self.history[max(self.history)]

    def revised(self, network: NetworkManifest) -> None:
        """Serve ``network``, the next revision (applied and stored by ``server.revision_routes``)."""
        self.history[network.revision] = self.network = network

    @property
    def networks(self) -> list[NetworkManifest]:
        """The network at each revision held, in order (the last is the one served)."""
        return list(self.history.values())  # kept in revision order

    def revision_base(self, number: int) -> NetworkManifest:
        """The network before revision ``number`` (the terms whose validators sign it)."""
        return self.history.get(number - 1, self.network)

    async def offload(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` in a worker thread (as ``asyncio.to_thread``), which ``close`` waits for before
        it closes the store: cancelling the caller (a background task at shutdown) does not stop a
        thread, and a store closed under a running statement can crash the process."""
        task = asyncio.ensure_future(asyncio.to_thread(work, *args))
        self._offloaded.add(task)
        task.add_done_callback(self._offloaded.discard)
        return await asyncio.shield(task)

    async def close(self) -> None:
        await asyncio.gather(*self._offloaded, return_exceptions=True)
        await self.hub.close()
        self.store.close()

    def network_signatures(self) -> list[NetworkSignature]:
        """The validators' signatures over the terms of the network this edge serves, each checked
        (one held for other terms, from before the manifest changed, is left out)."""
        held = (
            NetworkSignature.from_wire({"validator_key": k, "signature": v})
            for k, v in self.store.network_signatures().items()
        )
        return [s for s in held if s.verifies(self.network)]

    def experiment(self, key: ExperimentKey | str) -> ExperimentSpec:
        try:
            return self.network.experiment(key)
        except KeyError:
            raise NotFound(f"no experiment {key} on this network") from None

    def artifact_limit(self, key: ExperimentKey | str) -> int:
        """The largest artifact of ``key``: its model's float32 parameters and header (``max_artifact_bytes``
        is the ceiling for every experiment), so a small model's uploads are refused early."""
        return min(self.settings.max_artifact_bytes, self.experiment(key).model.max_artifact_bytes)

    def validator_window_bytes(self, key: ExperimentKey | str) -> int:
        """Bytes of proposed heads and outer states one validator key may store per window of ``key``
        (``validator_window_bytes``; 0: a head and an outer state of the model for each proposal)."""
        budget = self.settings.validator_window_bytes
        return budget or 2 * self.settings.validator_proposals_per_window * self.artifact_limit(key)

    def inline_limit(self, key: ExperimentKey | str) -> int:
        """The largest artifact of ``key`` one request body may carry (``max_inline_bytes``); a larger
        one is staged in chunks first (``server.uploads``)."""
        return min(self.settings.max_inline_bytes, self.artifact_limit(key))

    def dataset(self, dataset_id: str) -> FetchManifest:
        try:
            return self.datasets[DatasetId(dataset_id)]
        except KeyError:
            raise NotFound(f"no dataset {dataset_id}") from None

    def shard_path(self, manifest: FetchManifest, locator: str) -> Path:
        return self.settings.datasets_dir / manifest.dataset_id / manifest.split / locator


def revised_history(
    network: NetworkManifest, store: EdgeStore, history: dict[int, NetworkManifest] | None = None
) -> dict[int, NetworkManifest]:
    """``history`` (``network`` alone when not given) with every revision ``store`` holds after
    ``network``'s applied in turn, each checked against the terms before it: the network at each
    revision. ``RuntimeError`` naming the revision when the store's revisions do not follow (a store
    of another network, or a manifest file edited under a revised network)."""
    history = {network.revision: network} if history is None else dict(history)
    try:
        revised = revisions_after(network, [signed for signed, _ in store.network_revisions(after=network.revision)])
    except ProtocolError as exc:
        raise RuntimeError(f"the store's network revisions do not apply: {exc}") from None
    return history | {network.revision: network for _, network in revised}


def _shared(settings: Settings, clock: Clock) -> tuple[Fanout | None, RateLimiter, RateLimiter, Once]:
    """The hub's fan-out, the peer and address rate limits and the read proofs seen: through Redis with ``redis_url``
    (every edge on it shares them), in this process otherwise. Bursts are a quarter of a minute's."""
    limits = {
        "peer": settings.peer_requests_per_min / 60,
        "address": settings.address_checks_per_min / 60,
    }
    peer: RateLimiter
    address: RateLimiter
    if not settings.redis_url:
        peer, address = (KeyedRateLimiter(rate, max(1.0, rate * 15), clock=clock) for rate in limits.values())
        return None, peer, address, LocalOnce(clock=clock)
    import redis  # the `scale` extra

    from .hub_redis import RedisFanout
    from .ratelimit_redis import RedisRateLimiter

    client = redis.Redis.from_url(settings.redis_url, socket_timeout=REDIS_TIMEOUT_S)
    peer, address = (RedisRateLimiter(client, name, rate, max(1.0, rate * 15)) for name, rate in limits.items())
    return RedisFanout(settings.redis_url), peer, address, RedisOnce(client, "read-proofs")


def load_datasets(root: Path) -> dict[DatasetId, FetchManifest]:
    """Every prepared dataset under ``root`` (``datasets.layout``), each shard file checked; hidden
    folders (a dataset being written, ``datasets.sharding``) and misnamed ones are left out."""
    datasets: dict[DatasetId, FetchManifest] = {}
    for dataset_root in sorted(path for path in root.glob("[!.]*") if manifest_path(path).exists()):
        manifest = read_train_manifest(dataset_root)
        if manifest.dataset_id != dataset_root.name:
            log.warning("not serving %s: its manifest names dataset %s", dataset_root, manifest.dataset_id)
            continue
        datasets[manifest.dataset_id] = manifest
        log.info("serving dataset %s: %d shards", manifest.dataset_id, len(manifest.shards))
    return datasets


def open_blobs(settings: Settings) -> Blobs:
    """A directory (the default), or an S3-compatible bucket with local copies (``blobs_url``)."""
    if not settings.blobs_url:
        return BlobStore(settings.blobs_root)
    from .blobs_s3 import S3Blobs  # boto3 is optional: the `scale` extra

    return S3Blobs(settings.blobs_url, settings.blobs_root)
