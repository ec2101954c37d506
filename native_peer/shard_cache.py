"""Shards, lease by lease: downloaded with the lease, verified against the fetch-manifest, cached.

Shards are kept by the rule of ``protocol.content_cache``, keyed by their fetch-manifest sha256 (leases
differ from window to window, the bytes do not): on disk, ``disk_bytes`` at most, least recently used
first out (a file's mtime is its last use, so the order outlives the process), each file verified
again before use, so a corrupted cache is refetched, never trained on; and decoded in memory as stored, uint8
(``protocol.shards.decode_shard_stored``: the trainer's compiled step scales them), least recently
used first out, ``memory_bytes`` at most: a trainer leasing a shard again trains on the examples it
verified and decoded before, instead of re-reading, re-hashing and re-decoding them every window. With
``local_datasets`` (``TrainerBuilder.with_sharded_dataset``) a leased shard is read from a prepared
copy on disk instead (``datasets.layout``: ``<dir>/<dataset>/train/<locator>``), verified against the
fetch-manifest the edge serves like a download; one that is missing there or differs is downloaded.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from datasets.layout import shard_path
from protocol.content_cache import CacheIndex
from protocol.errors import IntegrityError
from protocol.manifests import ShardEntry
from protocol.messages import LeaseGrant
from protocol.shards import decode_shard_stored, verify_shard

from .edge_client import EdgeClient
from .storage import StorageConfig, write_atomic

__all__ = ["DISK_BYTES", "MEMORY_BYTES", "Examples", "ShardCache"]

log = logging.getLogger(__name__)

Examples = tuple[np.ndarray, np.ndarray]  # one shard's (features, labels), uint8 as stored
MEMORY_BYTES = 256 << 20  # decoded shards kept in memory by default
DISK_BYTES = 4 << 30  # shard files kept on disk by default


class ShardCache:
    """The shards of a trainer's leases, fetched in the background on ``pool``'s threads."""

    def __init__(
        self,
        edge: EdgeClient,
        storage: StorageConfig,
        pool: ThreadPoolExecutor,
        local_datasets: Path | None = None,
        *,
        memory_bytes: int = MEMORY_BYTES,
        disk_bytes: int = DISK_BYTES,
    ) -> None:
        self.edge = edge
        self.storage = storage
        self.pool = pool
        self.local_datasets = local_datasets
        self.memory_bytes = memory_bytes
        self.hits = 0  # shards read back from the disk cache
        self.memory_hits = 0  # shards served decoded from memory
        self.local_reads = 0
        self.downloads = 0
        self._memory: dict[str, Examples] = {}  # decoded shards by content, as ``_kept`` says
        self._kept = CacheIndex(memory_bytes)
        self._on_disk = CacheIndex(disk_bytes, _files_by_last_use(storage.shards_dir))
        self._lock = threading.Lock()  # the pool's threads share both indexes

    @property
    def capacity_bytes(self) -> int:
        """The bytes of shard files kept on disk at most: what a lease request declares it keeps."""
        return self._on_disk.capacity

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
        path = self.storage.shard_path(entry.sha256)
        with self._lock:
            kept = self._on_disk.touch(entry.sha256)
        if kept:
            try:
                data = path.read_bytes()
                verify_shard(entry, data)
                path.touch()  # its last use, for the order of a later process
                self.hits += 1
                return data
            except (OSError, IntegrityError) as exc:  # dropped meanwhile, or damaged: fetched again
                log.warning("cached shard %s not usable (%s); fetching it again", shard_id, exc)
        data = self.edge.shard(grant, entry.shard_id)
        verify_shard(entry, data)
        write_atomic(path, data)
        with self._lock:
            dropped = self._on_disk.admit(entry.sha256, len(data))
        for key in dropped:
            self.storage.shard_path(key).unlink(missing_ok=True)
        self.downloads += 1
        return data

    def _examples(self, grant: LeaseGrant, shard_id: str) -> Examples:
        """One leased shard's uint8 arrays (read-only): from memory, else verified bytes decoded."""
        manifest = self.edge.fetch_manifest(grant.lease.dataset_id)
        entry = manifest.shard(shard_id)
        with self._lock:
            if self._kept.touch(entry.sha256):
                self.memory_hits += 1
                return self._memory[entry.sha256]
        x, y, _ = decode_shard_stored(self._shard_bytes(grant, shard_id), manifest.features)
        x.flags.writeable = y.flags.writeable = False  # shared by every lease that holds the shard
        with self._lock:
            if entry.sha256 not in self._kept:
                self._memory[entry.sha256] = (x, y)
                for dropped in self._kept.admit(entry.sha256, x.nbytes + y.nbytes):
                    del self._memory[dropped]
        return x, y

    def prefetch(self, grant: LeaseGrant) -> list[Future[Examples]]:
        """Start fetching the granted lease's shards in the background."""
        return [self.pool.submit(self._examples, grant, shard_id) for shard_id in grant.lease.shard_ids]

    @staticmethod
    def assemble(pending: list[Future[Examples]]) -> Examples:
        """Wait for prefetched shards and concatenate them into (x, y)."""
        parts = [future.result() for future in pending]
        return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


def _files_by_last_use(directory: Path) -> list[tuple[str, int]]:
    """(key, size) of the shard files in ``directory``, least recently used (oldest mtime) first."""
    files = []
    for path in directory.glob("[!.]*.safetensors"):  # not a writer's temporary file
        try:
            files.append((path.stat(), path.name.removesuffix(".safetensors")))
        except OSError:  # gone since the listing
            continue
    return [(key, st.st_size) for st, key in sorted(files, key=lambda f: f[0].st_mtime_ns)]
