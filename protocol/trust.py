"""Per-peer trust: a score and strikes, and quarantine after repeated misbehaviour. Pure, serializable.

A rejection whose ``Reason`` is a strike (a forged or replayed submission, a broken or outlying
update, a free rider) adds one; an acceptance takes one away. A peer with ``max_strikes`` strikes is
quarantined: its candidates are rejected unseen until an operator clears it. Stale bases and
regressions are not strikes: honest peers hit those through timing and bad luck. The score, an
exponential moving average of acceptance, is informational (shown to viewers).

A ``TrustBook`` never changes: ``recorded`` and ``cleared`` return the next book.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .fields import read_float, read_int, read_object
from .reasons import Reason

__all__ = ["TrustBook"]


@dataclass(frozen=True)
class TrustBook:
    max_strikes: int = 3
    decay: float = 0.8
    scores: Mapping[str, float] = field(default_factory=dict)
    strikes: Mapping[str, int] = field(default_factory=dict)

    def recorded(self, peer_id: str, accepted: bool, reason: Reason) -> TrustBook:
        """The book after one decision about ``peer_id``'s candidate."""
        score = self.decay * self.scores.get(peer_id, 1.0) + (1 - self.decay) * float(accepted)
        strikes = self.strikes.get(peer_id, 0)
        if accepted:
            strikes = max(0, strikes - 1)
        elif reason.strike:
            strikes += 1
        return replace(self, scores={**self.scores, peer_id: score}, strikes={**self.strikes, peer_id: strikes})

    def quarantined(self, peer_id: str) -> bool:
        return self.strikes.get(peer_id, 0) >= self.max_strikes

    def cleared(self, peer_id: str) -> TrustBook:
        """The book with ``peer_id``'s strikes forgiven (an operator's decision)."""
        return replace(self, strikes={p: n for p, n in self.strikes.items() if p != peer_id})

    @property
    def quarantine(self) -> set[str]:
        return {peer for peer in self.strikes if self.quarantined(peer)}

    def to_wire(self) -> dict[str, Any]:
        return {
            "max_strikes": self.max_strikes,
            "decay": self.decay,
            "scores": dict(self.scores),
            "strikes": dict(self.strikes),
        }

    @classmethod
    def from_wire(cls, value: object) -> TrustBook:
        d = read_object(value, "trust book")
        scores, strikes = read_object(d.get("scores"), "scores"), read_object(d.get("strikes"), "strikes")
        return cls(
            read_int(d, "max_strikes", low=1, high=1000),
            read_float(d, "decay"),
            {peer: read_float(scores, peer) for peer in scores},
            {peer: read_int(strikes, peer, low=0, high=1 << 30) for peer in strikes},
        )
