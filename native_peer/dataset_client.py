"""Shards, lease by lease: downloaded with the lease, verified against the fetch-manifest, cached.

A cached shard is re-verified before use, so a corrupted cache is refetched, never trained on. With
``local_datasets`` (``TrainerBuilder.with_sharded_dataset``) a leased shard is read from a prepared
copy on disk instead (``datasets.layout``: ``<dir>/<dataset>/train/<locator>``), verified against the
fetch-manifest the edge serves like a download; one that is missing there or differs is downloaded.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from datasets.layout import shard_path
from protocol.errors import IntegrityError
from protocol.manifests import ShardEntry
from protocol.messages import LeaseGrant
from protocol.shards import decode_shard, verify_shard

from .edge_client import EdgeClient
from .storage import StorageConfig, write_atomic

__all__ = ["ShardCache"]

log = logging.getLogger(__name__)


class ShardCache:
    def __init__(
        self, edge: EdgeClient, storage: StorageConfig, pool: ThreadPoolExecutor, local_datasets: Path | None = None
    ) -> None:
        self.edge = edge
        self.storage = storage
        self.pool = pool
        self.local_datasets = local_datasets
        self.hits = 0
        self.local_reads = 0
        self.downloads = 0

    def _local_bytes(self, dataset_id: str, entry: ShardEntry) -> bytes | None:
        """The shard from the prepared copy under ``local_datasets``, if there is one, it holds the
        shard and the shard matches ``entry``."""
        if self.local_datasets is None:
            return None
        path = shard_path(self.local_datasets / dataset_id, entry)
        try:
            data = path.read_bytes()
            verify_shard(entry, data)
        except (OSError, IntegrityError) as exc:
            log.warning("shard %s not usable from %s (%s); downloading it", entry.shard_id, path, exc)
            return None
        self.local_reads += 1
        return data

    def _shard_bytes(self, grant: LeaseGrant, shard_id: str) -> bytes:
        lease = grant.lease
        entry = self.edge.fetch_manifest(lease.dataset_id).shard(shard_id)
        local = self._local_bytes(lease.dataset_id, entry)
        if local is not None:
            return local
        path = self.storage.shard_path(lease.dataset_id, shard_id)
        if path.exists():
            data = path.read_bytes()
            try:
                verify_shard(entry, data)
                self.hits += 1
                return data
            except IntegrityError:
                log.warning("cached shard %s is corrupt; fetching it again", shard_id)
        data = self.edge.shard(grant, entry.shard_id)
        verify_shard(entry, data)
        write_atomic(path, data)
        self.downloads += 1
        return data

    def prefetch(self, grant: LeaseGrant) -> list[Future[bytes]]:
        """Start fetching the granted lease's shards in the background."""
        return [self.pool.submit(self._shard_bytes, grant, shard_id) for shard_id in grant.lease.shard_ids]

    @staticmethod
    def assemble(pending: list[Future[bytes]]) -> tuple[np.ndarray, np.ndarray]:
        """Wait for prefetched shards and concatenate them into (x, y)."""
        parts = [decode_shard(future.result()) for future in pending]
        return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])
