"""``HeadHolders``: which peers said they hold an experiment's current head, so that browsers can
fetch it from each other over WebRTC (``static/head_sharing.js``) and ask the edge less often.

    peer → {"type": "have", "experiment", "head_id"}      no answer
    peer → {"type": "holders", "experiment", "head_id"}   → {"type": "holders", "experiment", "head_id", "peers", "fetching"}

Both concern the current head only (the relay checks; any other head is ignored, and answered with
no peers). ``fetching`` is true while nobody holds the head yet but another peer asked for it within
``fetching_s``: that peer is downloading it from the edge and will announce it, so the asker waits a
moment and asks again rather than download it too (every trainer wakes to a new head at once).

Holders with a record come first: a peer whose work in the experiment a validator accepted, or one
admitted by a token (the relay decides, ``recorded``). Peers without one (keys are free: Sybils) are
offered only while no holder with a record is joined, as when a network starts; so announcements by
any number of fresh keys never crowd out the holders with a record.

Bounded by construction: per experiment of the network one head, its ``max_holders`` latest
announcers with a record and as many without, each for ``ttl_s``, and its first asker. An answer names at most ``max_answer`` holders
that are still joined, never the asker, in an order drawn from the asker's and the head's ids, so
that askers spread over the holders. The relay's message rate limit bounds how often a peer can
announce or ask. Nothing a holder sends is trusted: the asker checks the bytes against the head's
content id and falls back to HTTP (``browser_peer.peer``).

Holders are this edge's own: behind several edges a peer is told of the holders joined to its edge.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from protocol.clock import SYSTEM_CLOCK, Clock
from protocol.ids import HeadId

__all__ = ["HeadHolders", "Holders"]


@dataclass(frozen=True)
class Holders:
    """The answer to one ask: peers to try, and whether another peer is fetching the head meanwhile."""

    peers: list[str]
    fetching: bool = False


@dataclass
class _Head:
    head_id: HeadId
    announcers: OrderedDict[str, int] = field(default_factory=OrderedDict)  # with a record: peer id -> at_ms
    newcomers: OrderedDict[str, int] = field(default_factory=OrderedDict)  # without one; both oldest first
    first_ask: tuple[str, int] | None = None  # (peer id, at_ms)


class HeadHolders:
    def __init__(
        self,
        clock: Clock = SYSTEM_CLOCK,
        *,
        max_holders: int = 64,
        ttl_s: float = 600.0,
        max_answer: int = 8,
        fetching_s: float = 10.0,
    ) -> None:
        self.clock = clock
        self.max_holders = max_holders
        self.ttl_ms = int(ttl_s * 1000)
        self.max_answer = max_answer
        self.fetching_ms = int(fetching_s * 1000)
        self._heads: dict[str, _Head] = {}  # experiment -> its current head's holders

    def _head(self, experiment: str, head_id: HeadId) -> _Head:
        head = self._heads.get(experiment)
        if head is None or head.head_id != head_id:  # a new head: the last one's holders are forgotten
            head = self._heads[experiment] = _Head(head_id)
        return head

    def announce(self, experiment: str, head_id: HeadId, peer_id: str, *, recorded: bool) -> None:
        """``peer_id`` holds ``head_id``, which the caller checked is ``experiment``'s current head;
        ``recorded``: the peer has a record (accepted work, or admission)."""
        head = self._head(experiment, head_id)
        head.announcers.pop(peer_id, None)
        head.newcomers.pop(peer_id, None)
        pool = head.announcers if recorded else head.newcomers
        pool[peer_id] = self.clock.now_ms()
        while len(pool) > self.max_holders:
            pool.popitem(last=False)

    def ask(self, experiment: str, head_id: HeadId, asker: str, joined: Callable[[str], bool]) -> Holders:
        """Who of the joined peers other than ``asker`` announced ``head_id`` lately (at most
        ``max_answer``): those with a record, or while there is none, those without; ``head_id`` is
        ``experiment``'s current head, which the caller checked."""
        head = self._head(experiment, head_id)
        now_ms = self.clock.now_ms()
        for pool in (head.announcers, head.newcomers):
            for peer_id in [p for p, at_ms in pool.items() if at_ms < now_ms - self.ttl_ms or not joined(p)]:
                del pool[peer_id]
        peers = sorted(p for p in head.announcers if p != asker) or sorted(p for p in head.newcomers if p != asker)
        random.Random(hashlib.sha256(f"{asker}\n{head_id}".encode()).digest()).shuffle(peers)
        if head.first_ask is None or not joined(head.first_ask[0]):
            head.first_ask = (asker, now_ms)
        first, asked_ms = head.first_ask
        fetching = not peers and first != asker and now_ms - asked_ms < self.fetching_ms
        return Holders(peers[: self.max_answer], fetching)
