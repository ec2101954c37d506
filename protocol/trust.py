"""Per-peer trust: a score and strikes, and quarantine after repeated misbehaviour. Pure, serializable.

A rejection whose reason shows misbehaviour (a forged or replayed submission, a broken or outlying
update, a free rider) is a strike; an acceptance takes one strike away. A peer with ``max_strikes``
strikes is quarantined: its candidates are rejected unseen until an operator clears it. Stale bases
and regressions are not strikes: honest peers hit those through timing and bad luck. The score, an
exponential moving average of acceptance, is informational (shown to viewers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["STRIKE_REASONS", "TrustBook"]

STRIKE_REASONS = frozenset(
    {
        "bad_signature",
        "wrong_lease",
        "out_of_lease",
        "replay",
        "undecodable",
        "wrong_shape",
        "non_finite",
        "norm_too_large",
        "free_rider",
        "outlier",
    }
)


@dataclass
class TrustBook:
    max_strikes: int = 3
    decay: float = 0.8
    scores: dict[str, float] = field(default_factory=dict)
    strikes: dict[str, int] = field(default_factory=dict)

    def record(self, peer_id: str, accepted: bool, reason: str) -> None:
        self.scores[peer_id] = self.decay * self.scores.get(peer_id, 1.0) + (1 - self.decay) * float(accepted)
        if accepted:
            self.strikes[peer_id] = max(0, self.strikes.get(peer_id, 0) - 1)
        elif reason.split(":")[0] in STRIKE_REASONS:
            self.strikes[peer_id] = self.strikes.get(peer_id, 0) + 1

    def quarantined(self, peer_id: str) -> bool:
        return self.strikes.get(peer_id, 0) >= self.max_strikes

    def clear(self, peer_id: str) -> None:
        self.strikes.pop(peer_id, None)

    @property
    def quarantine(self) -> set[str]:
        return {peer for peer in self.strikes if self.quarantined(peer)}

    def to_wire(self) -> dict[str, Any]:
        return {"max_strikes": self.max_strikes, "decay": self.decay, "scores": self.scores, "strikes": self.strikes}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> TrustBook:
        return cls(data["max_strikes"], data["decay"], dict(data["scores"]), dict(data["strikes"]))
