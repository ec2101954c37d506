"""``ShardStore``: the shards a tab downloaded, kept by content for later leases and page loads.

The rule of ``protocol.content_cache``, as native peers keep theirs: a shard is keyed by its
fetch-manifest sha256 (a lease names shard ids; the bytes behind an id are what the manifest says), its
bytes are verified against the manifest each time they are used (a damaged copy is dropped and
downloaded again, never trained on), and at most ``capacity`` bytes are kept, the least recently used
dropped first. The bytes live in the host's shard storage (``Bridge.shard_get`` and the rest: IndexedDB
in a browser, memory where the page cannot open it); the index is saved with the peer's other durable
state (``Bridge.save``), so a reloaded page finds what it held. On opening, stored shards the index
does not name are deleted and named ones the storage lost are forgotten, so the storage holds no more
than the index counts.
"""

from __future__ import annotations

from protocol.content_cache import CacheIndex
from protocol.errors import IntegrityError
from protocol.manifests import ShardEntry
from protocol.shards import verify_shard

from .bridge import Bridge

__all__ = ["INDEX_KEY", "ShardStore"]

INDEX_KEY = "shards/index"


class ShardStore:
    def __init__(self, bridge: Bridge, capacity: int) -> None:
        """``capacity``: bytes of shards kept at most (0: none kept, every lease downloads its shards)."""
        self.bridge = bridge
        self.index = CacheIndex(capacity)

    async def open(self) -> None:
        """Read the saved index and make the storage agree with it."""
        self.index = CacheIndex.decode(self.index.capacity, await self.bridge.load(INDEX_KEY))
        stored = set(await self.bridge.shard_keys())
        for key in stored - set(self.index.keys()):
            await self.bridge.shard_delete(key)
        for key in set(self.index.keys()) - stored:
            self.index.discard(key)

    async def get(self, entry: ShardEntry) -> bytes | None:
        """The shard ``entry`` names, verified, if it is kept; None otherwise."""
        if entry.sha256 not in self.index:
            return None
        data = await self.bridge.shard_get(entry.sha256)
        try:
            if data is None:
                raise IntegrityError(f"shard {entry.shard_id} is no longer stored")
            verify_shard(entry, data)
        except IntegrityError:
            await self._drop(entry.sha256)
            return None
        self.index.touch(entry.sha256)
        return data

    async def keep(self, entry: ShardEntry, data: bytes) -> None:
        """Keep ``data``, verified as ``entry``'s bytes by the caller, dropping what no longer fits."""
        dropped = self.index.admit(entry.sha256, len(data))
        for key in dropped:
            await self.bridge.shard_delete(key)
        if entry.sha256 not in dropped and not await self.bridge.shard_put(entry.sha256, data):
            self.index.discard(entry.sha256)  # the storage refused it (full): not kept

    async def save(self) -> None:
        await self.bridge.save(INDEX_KEY, self.index.encode())

    async def _drop(self, key: str) -> None:
        self.index.discard(key)
        await self.bridge.shard_delete(key)
