"""Deterministic lease assignment by rendezvous (highest-random-weight) hashing, with homes.

Each (peer, shard) pair gets a score ``sha256(seed | peer | shard)``; a peer takes its top-scoring
shards among those nobody holds yet in this window. The seed is the window's base head id, so the
assignment is stable across runs and processes, moves with every new head, and needs no
coordination beyond knowing which shards are already taken.

Homes keep a peer on the same shards from window to window where fairness allows, so that it
downloads each shard once and trains on it again from its own copy (``protocol.content_cache``).
Among a set of peers (those training lately), each shard's home is the peer whose score for it under
a seed that does not change from window to window (``home_seed``) is highest: a partition of the
dataset, about an equal share each, of which a peer joining or leaving moves only its own share
(rendezvous hashing's property). A lease takes the peer's home shards first, drawn by the window's
scores (over the windows it trains on all of its home, not on the same few shards), then others by
the same scores when too few of its home are free. Homes only order the choice: shards stay exclusive
within a window and a lease's size is decided as before (``protocol.lease_size``). A peer alone has
every shard as its home.

Homes are only for a peer that cannot keep the whole split (``keeps_home``): one whose shard cache
holds it downloads each shard once whichever shards it is leased, and leasing it the same few shards
window after window only makes a trainer that trains ahead refit them from its own last update, which
costs samples and the lease evidence of its honest work (decision 0030).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .ids import PeerId, ShardId

__all__ = [
    "ARREARS_WINDOWS",
    "MAX_CACHE_BYTES",
    "Homes",
    "assign_leases",
    "assign_shards",
    "home_seed",
    "keeps_home",
    "rendezvous_score",
]


ARREARS_WINDOWS = 8  # how long a lease that delivered nothing costs its holder its priority, in windows


def rendezvous_score(seed: str, peer_id: str, shard_id: str) -> int:
    digest = hashlib.sha256(f"{seed}|{peer_id}|{shard_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def home_seed(experiment: str, dataset_id: str) -> str:
    """The seed an experiment's homes are drawn with: the same in every window."""
    return f"{experiment}|{dataset_id}|homes"


MAX_CACHE_BYTES = 1 << 50  # the largest shard cache a lease request may declare


def keeps_home(cache_bytes: int | None, split_bytes: int) -> bool:
    """Whether a peer's leases take its home shards first: unless it declared a shard cache
    (``cache_bytes``) that holds the whole split of ``split_bytes``; a peer that declares none keeps
    its home."""
    return cache_bytes is None or cache_bytes < split_bytes


def _hashes(seed: str, ids: Iterable[str]) -> npt.NDArray[np.uint64]:
    return np.array(
        [int.from_bytes(hashlib.sha256(f"{seed}|{i}".encode()).digest()[:8], "big") for i in ids], np.uint64
    )


def _home_scores(peers: npt.NDArray[np.uint64], shards: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Scores [peer, shard]: splitmix64's finalizer over the two hashes XORed, so that the whole table is
    a few vector operations (a thousand peers by a thousand shards in milliseconds)."""
    z = peers[:, None] ^ shards[None, :]
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


@dataclass(frozen=True, eq=False)
class Homes:
    """The homes of ``shard_ids`` among ``peers`` under ``seed``: per shard, the highest score among the
    peers, the peer that has it, and the highest score among the others."""

    seed: str
    peers: tuple[PeerId, ...]
    shard_ids: tuple[ShardId, ...]
    _shards: npt.NDArray[np.uint64]
    _best: npt.NDArray[np.uint64]
    _owner: npt.NDArray[np.intp]
    _second: npt.NDArray[np.uint64]

    @classmethod
    def among(cls, seed: str, peers: Collection[PeerId], shard_ids: Sequence[ShardId]) -> Homes:
        ordered, shards = tuple(sorted(set(peers))), tuple(shard_ids)
        shard_hashes = _hashes(seed, shards)
        if not ordered:
            empty = np.zeros(len(shards), np.uint64)
            return cls(seed, ordered, shards, shard_hashes, empty, np.full(len(shards), -1, np.intp), empty)
        scores = _home_scores(_hashes(seed, ordered), shard_hashes)
        owner = np.argmax(scores, axis=0)
        columns = np.arange(len(shards))
        best = scores[owner, columns]
        scores[owner, columns] = 0
        return cls(seed, ordered, shards, shard_hashes, best, owner, scores.max(axis=0, initial=0))

    def of(self, peer_id: PeerId) -> frozenset[ShardId]:
        """``peer_id``'s home among these peers and itself: the shards it scores highest for (all of
        them when no other peer is among them)."""
        mine = _home_scores(_hashes(self.seed, [peer_id]), self._shards)[0]
        if peer_id in self.peers:
            others = np.where(self._owner == self.peers.index(peer_id), self._second, self._best)
        else:
            others = self._best
        alone = len(self.peers) == 0 or self.peers == (peer_id,)
        return frozenset(s for s, won in zip(self.shard_ids, mine > others, strict=True) if alone or won)


def assign_shards(
    seed: str,
    peer_id: PeerId,
    shard_ids: Sequence[ShardId],
    taken: Iterable[str],
    count: int,
    home: Collection[ShardId] = frozenset(),
) -> tuple[ShardId, ...]:
    """The ``count`` shards for ``peer_id`` not in ``taken``: those of its ``home`` first, then the rest,
    each by its highest score under ``seed``; fewer when fewer are free, none when every shard of the
    window is taken (a fair share: more identities never buy a peer more of the window's data, and the
    edge grants no lease then)."""
    taken_set = set(taken)
    ranked = sorted(shard_ids, key=lambda s: (s not in home, -rendezvous_score(seed, peer_id, s), s))
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
