"""What a peer keeps of the content it downloaded, by one rule for every client: entries are keyed by
their content (a shard by its fetch-manifest sha256: leases change from window to window, the bytes
do not), the caller verifies an entry's bytes again each time it uses them, and at most ``capacity``
bytes are kept, the least recently used dropped first.

``CacheIndex`` is only the bookkeeping (which keys are kept, their sizes, their order of use); the
host keeps the bytes: a native peer on disk and decoded in memory (``native_peer.shard_cache``), a
tab in IndexedDB or in memory (``browser_peer.shard_store``). Its wire form lets a tab keep the index
across page loads; a damaged one reads as empty.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable

__all__ = ["CacheIndex"]


class CacheIndex:
    """Keys and sizes of what is kept, least recently used first, ``held`` bytes at most ``capacity``."""

    def __init__(self, capacity: int, entries: Iterable[tuple[str, int]] = ()) -> None:
        """``entries``: (key, size) pairs, least recently used first; those past ``capacity`` are not kept."""
        self.capacity = capacity
        self._sizes: OrderedDict[str, int] = OrderedDict()
        self.held = 0
        for key, size in entries:
            self.admit(key, size)

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def keys(self) -> list[str]:
        """The kept keys, least recently used first."""
        return list(self._sizes)

    def touch(self, key: str) -> bool:
        """Mark ``key`` as just used; whether it is kept."""
        if key not in self._sizes:
            return False
        self._sizes.move_to_end(key)
        return True

    def admit(self, key: str, size: int) -> list[str]:
        """Keep ``key`` (``size`` bytes) as the most recently used; the keys to drop for it, least
        recently used first: ``[key]`` itself when it alone is larger than ``capacity``."""
        if size < 0:
            raise ValueError(f"a size of {size} bytes")
        if size > self.capacity:
            self.discard(key)
            return [key]
        self.discard(key)
        self._sizes[key] = size
        self.held += size
        dropped: list[str] = []
        while self.held > self.capacity:
            old, old_size = self._sizes.popitem(last=False)
            self.held -= old_size
            dropped.append(old)
        return dropped

    def discard(self, key: str) -> None:
        """Forget ``key`` (its bytes were lost or were wrong)."""
        size = self._sizes.pop(key, None)
        if size is not None:
            self.held -= size

    def encode(self) -> bytes:
        return json.dumps([[key, size] for key, size in self._sizes.items()]).encode()

    @classmethod
    def decode(cls, capacity: int, data: bytes | None) -> CacheIndex:
        """The index ``encode`` wrote, within ``capacity``; empty when there is none or it is damaged."""
        try:
            entries = json.loads(data) if data is not None else []
            pairs = [(key, size) for key, size in entries if isinstance(key, str) and type(size) is int and size >= 0]
        except (ValueError, TypeError):
            pairs = []
        return cls(capacity, pairs)
