"""Deterministic lease assignment by rendezvous (highest-random-weight) hashing.

Each (peer, shard) pair gets a score ``sha256(seed | peer | shard)``; a peer takes its top-scoring
shards among those nobody holds yet in this window. The seed is the window's base head id, so the
assignment is stable across runs and processes, moves with every new head, and needs no
coordination beyond knowing which shards are already taken.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from .ids import PeerId, ShardId

__all__ = ["assign_leases", "assign_shards", "rendezvous_score"]


def rendezvous_score(seed: str, peer_id: str, shard_id: str) -> int:
    digest = hashlib.sha256(f"{seed}|{peer_id}|{shard_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def assign_shards(
    seed: str, peer_id: PeerId, shard_ids: Sequence[ShardId], taken: Iterable[str], count: int
) -> tuple[ShardId, ...]:
    """The ``count`` highest-scoring shards for ``peer_id`` not in ``taken``: fewer when fewer are
    free, none when every shard of the window is taken (a fair share: more identities never buy a
    peer more of the window's data, and the edge grants no lease then)."""
    taken_set = set(taken)
    ranked = sorted(shard_ids, key=lambda s: (-rendezvous_score(seed, peer_id, s), s))
    return tuple(sorted([s for s in ranked if s not in taken_set][:count]))


def assign_leases(
    seed: str, peer_ids: Iterable[PeerId], shard_ids: Sequence[ShardId], count: int
) -> dict[PeerId, tuple[ShardId, ...]]:
    """Assign shards to a set of peers at once, peers served in id order."""
    taken: set[str] = set()
    result: dict[PeerId, tuple[ShardId, ...]] = {}
    for peer in sorted(set(peer_ids)):
        result[peer] = assign_shards(seed, peer, shard_ids, taken, count)
        taken.update(result[peer])
    return result
