"""Credit for contributors, tallied from the verdicts that count (``protocol.credit``).

A verdict counts once ``NetworkManifest.quorum`` validators signed the same decision (a rejection also
once the canonical lineage bears it out); ``server.intake`` holds the others as pending and refuses
those the lineage contradicts. A contributor's standing is a sum over the counted ones: windows
accepted and rejected, and the examples credited for the accepted ones (what the quorum vouched for,
capped by the candidate's own count and its lease: ``protocol.credit.credited_examples``). Nothing here
can be claimed by a peer or by one validator of a quorum: anyone can recompute a standing from
``GET /v1/experiments/<key>/verdicts?peer_id=...``, the heads and the candidates, and check each
signature against the network's validator keys. The tally is kept in memory and caught up from the
store's newly counted verdicts at each read (one catch-up at a time: lease issuing reads it from a
worker thread), so every edge on a shared store answers alike.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from protocol.ids import ExperimentKey, PeerId
from protocol.messages import Verdict

from .store import EdgeStore

__all__ = ["CreditBook", "Standing"]


@dataclass
class Standing:
    peer_id: PeerId
    accepted: int = 0  # windows whose candidate was merged
    rejected: int = 0
    examples: int = 0  # training examples in the accepted candidates
    last_accepted_ms: int | None = None

    @property
    def recorded(self) -> bool:
        """Whether the contributor has a record at the edge (accepted work that counts): served first in
        a contended window (``server.leasing``), offered to other peers as a head holder (``server.relay``)."""
        return self.accepted > 0

    def add(self, verdict: Verdict, examples: int) -> None:
        """Count ``verdict``, crediting ``examples`` when it accepts."""
        if verdict.accepted:
            self.accepted += 1
            self.examples += examples
            self.last_accepted_ms = max(self.last_accepted_ms or 0, verdict.decided_at_ms)
        else:
            self.rejected += 1

    def to_wire(self) -> dict[str, object]:
        return asdict(self)


class CreditBook:
    def __init__(self, store: EdgeStore) -> None:
        self.store = store
        self._after: dict[ExperimentKey, int] = {}  # the last verdict (store order) tallied
        self._standings: dict[ExperimentKey, dict[PeerId, Standing]] = {}
        self._catching_up = threading.Lock()

    def _catch_up(self, experiment: ExperimentKey) -> dict[PeerId, Standing]:
        with self._catching_up:  # a verdict tallied twice would credit it twice
            standings = self._standings.setdefault(experiment, {})
            while rows := self.store.verdicts_after(experiment, self._after.get(experiment, 0)):
                for position, verdict, examples in rows:
                    standings.setdefault(verdict.peer_id, Standing(verdict.peer_id)).add(verdict, examples)
                    self._after[experiment] = position
            return standings

    def leaderboard(self, experiment: ExperimentKey, limit: int) -> list[Standing]:
        """The ``limit`` contributors with the most accepted examples (then windows)."""
        ranked = sorted(self._catch_up(experiment).values(), key=lambda s: (-s.examples, -s.accepted, s.peer_id))
        return ranked[:limit]

    def standing(self, experiment: ExperimentKey, peer_id: PeerId) -> Standing:
        return self._catch_up(experiment).get(peer_id) or Standing(peer_id)

    def standings(self, experiment: ExperimentKey) -> Mapping[PeerId, Standing]:
        """Every contributor's standing, caught up now (the book's own mapping: read it, do not keep it)."""
        return self._catch_up(experiment)
