"""``HeadHolders``: which peers said they hold an experiment's current head, so that browsers can
fetch it from each other over WebRTC (``static/head_sharing.js``) and ask the edge less often.

    peer → {"type": "have", "experiment", "head_id"}       no answer (kept for the current head only)
    peer → {"type": "holders", "experiment", "head_id"}    → {"type": "holders", "experiment", "head_id", "peers"}

Bounded by construction: per experiment of the network one head, the current one (an announcement
of any other head is ignored), its ``max_holders`` latest announcers, each for ``ttl_s``. An answer
names at most ``max_answer`` holders that are still joined, never the asker, in an order drawn from
the asker's and the head's ids, so that askers spread over the holders. The relay's message rate
limit bounds how often a peer can announce or ask. Nothing a holder sends is trusted: the asker
checks the bytes against the head's content id and falls back to HTTP (``browser_peer.peer``).

Holders are this edge's own: behind several edges a peer is told of the holders joined to its edge.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Callable

from protocol.clock import SYSTEM_CLOCK, Clock
from protocol.ids import HeadId

__all__ = ["HeadHolders"]


class HeadHolders:
    def __init__(
        self, clock: Clock = SYSTEM_CLOCK, *, max_holders: int = 64, ttl_s: float = 600.0, max_answer: int = 8
    ) -> None:
        self.clock = clock
        self.max_holders = max_holders
        self.ttl_ms = int(ttl_s * 1000)
        self.max_answer = max_answer
        self._heads: dict[str, tuple[HeadId, OrderedDict[str, int]]] = {}  # experiment -> (head, peer -> at_ms)

    def announce(self, experiment: str, head_id: HeadId, peer_id: str) -> None:
        """``peer_id`` holds ``head_id``, which the caller checked is ``experiment``'s current head."""
        current = self._heads.get(experiment)
        if current is None or current[0] != head_id:
            current = (head_id, OrderedDict())
            self._heads[experiment] = current
        announcers = current[1]
        announcers.pop(peer_id, None)
        announcers[peer_id] = self.clock.now_ms()
        while len(announcers) > self.max_holders:
            announcers.popitem(last=False)

    def holders(self, experiment: str, head_id: HeadId, asker: str, joined: Callable[[str], bool]) -> list[str]:
        """Up to ``max_answer`` joined peers other than ``asker`` that announced ``head_id`` lately."""
        current = self._heads.get(experiment)
        if current is None or current[0] != head_id:
            return []
        oldest_ms = self.clock.now_ms() - self.ttl_ms
        announcers = current[1]
        for peer_id in [p for p, at_ms in announcers.items() if at_ms < oldest_ms or not joined(p)]:
            del announcers[peer_id]
        peers = sorted(p for p in announcers if p != asker)
        seed = hashlib.sha256(f"{asker}\n{head_id}".encode()).digest()
        random.Random(seed).shuffle(peers)
        return peers[: self.max_answer]
