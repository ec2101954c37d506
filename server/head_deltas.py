"""Head deltas: a head's artifact as a delta from its parent's (``protocol.head_delta``), for the peers
that trained on the parent.

A delta is served only from a head's parent, so each head has at most one and nobody can make the edge
compute deltas between heads of its choosing. It is made on the first request for it (in a worker
thread; requests that arrive meanwhile wait for that one) and kept in memory, ``capacity`` bytes of
deltas at most, the least recently used dropped first (``protocol.content_cache``): a head is asked
for while it is current, by every peer of its window. A delta no smaller than its head is not served
(404): the peer downloads the head.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from protocol.content_cache import CacheIndex
from protocol.errors import CodecError
from protocol.hashing import content_id
from protocol.head_delta import encode_delta
from protocol.ids import ExperimentKey, HeadId

from .blobs import Blobs
from .errors import NotFound
from .store import EdgeStore

__all__ = ["DELTA_CACHE_BYTES", "Delta", "HeadDeltas"]

DELTA_CACHE_BYTES = 64 << 20


@dataclass(frozen=True)
class Delta:
    data: bytes
    delta_id: str  # its content id: its ETag
    head_bytes: int  # the size of the head it rebuilds


class HeadDeltas:
    def __init__(self, capacity: int = DELTA_CACHE_BYTES) -> None:
        self._kept = CacheIndex(capacity)
        self._deltas: dict[str, Delta] = {}
        self._making: dict[str, asyncio.Future[Delta]] = {}

    async def delta(
        self, store: EdgeStore, blobs: Blobs, experiment: ExperimentKey, head_id: HeadId, base: str, grid: str = "exact"
    ) -> Delta:
        """Head ``head_id`` of ``experiment`` as a delta from ``base`` (on the int8 grid where the
        experiment's ``grid`` says so and the head is on it, else exact); ``NotFound`` unless ``base`` is
        its parent, both artifacts are here, and the delta is smaller than the head."""
        head = store.head(experiment, head_id)
        if head is None:
            raise NotFound(f"experiment {experiment} has no head {head_id}")
        if head.parent is None or head.parent != base:
            raise NotFound(f"head {head_id} is served as a delta from its parent {head.parent} only")
        if self._kept.touch(head_id):
            delta = self._deltas[head_id]
        elif head_id in self._making:
            delta = await asyncio.shield(self._making[head_id])
        else:
            delta = await self._make(blobs, head_id, head.parent, grid)
        if len(delta.data) >= delta.head_bytes:
            raise NotFound(f"head {head_id}'s delta is no smaller than the head: download the head")
        return delta

    async def _make(self, blobs: Blobs, head_id: HeadId, parent: HeadId, grid: str) -> Delta:
        making = self._making[head_id] = asyncio.get_running_loop().create_future()
        try:
            delta = await asyncio.to_thread(_encode, blobs, head_id, parent, grid)
        except asyncio.CancelledError:
            making.cancel()
            raise
        except Exception as exc:
            making.set_exception(exc)
            making.exception()  # retrieved: a failure nobody else waited for is not logged as lost
            raise
        finally:
            del self._making[head_id]
        making.set_result(delta)
        self._deltas[head_id] = delta
        for dropped in self._kept.admit(head_id, len(delta.data)):
            self._deltas.pop(dropped, None)
        return delta


def _encode(blobs: Blobs, head_id: HeadId, parent: HeadId, grid: str) -> Delta:
    if not (blobs.exists(head_id) and blobs.exists(parent)):
        raise NotFound(f"no artifact of head {head_id} or of its parent here")
    target = blobs.read(head_id)
    try:
        data = encode_delta(blobs.read(parent), target, grid)
    except CodecError as exc:
        raise NotFound(f"head {head_id} has no delta from its parent: {exc}") from None
    return Delta(data, content_id(data), len(target))
