"""Per-peer trust: a score and strikes that decay with time, and quarantine. Pure, serializable.

Time is counted in judged windows, never on a clock: ``after_window`` first multiplies the strikes
of every peer that took part in the window by ``strike_decay``, then adds each rejection's
``Reason.strike_weight`` (1 for misbehaviour: forged, replayed, broken, outlying or zero updates;
½ for a regression, an untrusted direction, no evidence of work on the lease or a copy, so that
repeating them counts; 0 for stale bases, blocked merges and quarantine itself). An acceptance takes nothing away: only time does, so a
peer that alternates bad and good submissions still accumulates (with decay d, a strike every other
window tends to 1 / (1 − d²) = 5.3 at d = 0.9) while an honest peer's rare bad luck fades. A peer
whose strikes reach ``max_strikes`` is quarantined: its candidates are rejected unseen. Quarantine is
a term, not a ban: its strikes go on decaying in the windows it takes part in, and it is released on
probation once they fall below ``release_strikes`` (from 3 to below 1.5 at d = 0.9: seven windows).
A permanent ban bought little on an open network (an attacker comes back under a new key for free)
and cost liveness: near convergence the trust anchor's noise once quarantined every honest trainer
of an experiment for good, and the network stopped. Harm is prevented by the screens, which judge
every candidate on its own; quarantine spares validators the work and bounds how often a repeat
offender is looked at (back after two or three more rejections). The score, an exponential moving
average of acceptance, is informational (shown to viewers).

The book is bounded: a peer that has taken part in none of the last ``forget_after`` judged windows is
forgotten (score, strikes and quarantine), so the book holds the peers of those windows however many
identities come and go (each fresh identity of a Sybil otherwise stayed in it for good, with the strikes
it never stayed to decay, and every window's book and saved state grew with them). A forgotten peer is
a new one, which any peer can be for the price of a key.

A ``TrustBook`` never changes: ``after_window``, ``recorded`` and ``decayed`` return the next book.
Peers are visited in sorted order, so every validator computes the same floats.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import InvalidMessage
from .fields import read_float, read_int, read_object
from .reasons import Reason

__all__ = ["TrustBook"]


@dataclass(frozen=True)
class TrustBook:
    max_strikes: int = 3
    decay: float = 0.8  # of the acceptance score (an EMA)
    scores: Mapping[str, float] = field(default_factory=dict)
    strikes: Mapping[str, float] = field(default_factory=dict)
    strike_decay: float = 0.9  # strikes are multiplied by this once per judged window a peer takes part in
    release_strikes: float = 1.5  # a quarantined peer is released once its strikes fall below this
    held: frozenset[str] = frozenset()  # the peers in quarantine
    window: int = 0  # judged windows so far (``after_window`` calls)
    seen: Mapping[str, int] = field(default_factory=dict)  # peer -> the window it last took part in
    forget_after: int = 64  # judged windows without a peer before it is forgotten

    def recorded(self, peer_id: str, accepted: bool, reason: Reason) -> TrustBook:
        """The book after one decision about ``peer_id``'s candidate (no decay: see ``after_window``)."""
        score = self.decay * self.scores.get(peer_id, 1.0) + (1 - self.decay) * float(accepted)
        strikes = self.strikes.get(peer_id, 0.0)
        if not accepted:
            strikes += reason.strike_weight
        held = self.held | {peer_id} if strikes >= self.max_strikes else self.held
        return replace(
            self,
            scores={**self.scores, peer_id: score},
            strikes={**self.strikes, peer_id: strikes},
            held=held,
            seen={**self.seen, peer_id: self.window},
        )

    def decayed(self, peer_ids: Iterable[str]) -> TrustBook:
        """The book one window later for ``peer_ids``: their strikes × ``strike_decay``; a quarantined
        one among them whose strikes fell below ``release_strikes`` is released."""
        strikes = dict(self.strikes)
        released = set()
        for peer in sorted(set(peer_ids)):
            if peer in strikes:
                strikes[peer] = strikes[peer] * self.strike_decay
                if peer in self.held and strikes[peer] < self.release_strikes:
                    released.add(peer)
        return replace(self, strikes=strikes, held=self.held - released)

    def after_window(self, decisions: Iterable[tuple[str, bool, Reason]]) -> TrustBook:
        """The book after one judged window: ``(peer_id, accepted, reason)`` per submission. Every
        peer that took part decays once, then each decision is recorded."""
        decisions = list(decisions)
        book = self.decayed(peer for peer, _, _ in decisions)
        for peer, accepted, reason in decisions:
            book = book.recorded(peer, accepted, reason)
        window = self.window + 1
        seen = {**book.seen, **{peer: window for peer, _, _ in decisions}}
        gone = {
            peer
            for peer in set(book.scores) | set(book.strikes)
            if window - seen.get(peer, self.window) >= self.forget_after
        }
        return replace(
            book,
            window=window,
            seen={peer: w for peer, w in seen.items() if peer not in gone},
            scores={peer: v for peer, v in book.scores.items() if peer not in gone},
            strikes={peer: v for peer, v in book.strikes.items() if peer not in gone},
            held=book.held - gone,
        )

    def pardoned(self, peer_id: str) -> TrustBook:
        """The book with ``peer_id`` out of quarantine and its strikes cleared: a run-control ``pardon``
        (``protocol.run_control``) a quorum of validators signed. Its acceptance score stays."""
        strikes = {**self.strikes, peer_id: 0.0} if peer_id in self.strikes else self.strikes
        return replace(self, strikes=strikes, held=self.held - {peer_id})

    def quarantined(self, peer_id: str) -> bool:
        return peer_id in self.held

    @property
    def quarantine(self) -> set[str]:
        return set(self.held)

    def to_wire(self) -> dict[str, Any]:
        return {
            "max_strikes": self.max_strikes,
            "decay": self.decay,
            "strike_decay": self.strike_decay,
            "release_strikes": self.release_strikes,
            "scores": dict(self.scores),
            "strikes": dict(self.strikes),
            "quarantined": sorted(self.held),
            "window": self.window,
            "seen": dict(self.seen),
            "forget_after": self.forget_after,
        }

    @classmethod
    def from_wire(cls, value: object) -> TrustBook:
        """Also reads older books: without ``strike_decay`` (integer strikes), without a quarantine
        list (then the peers at ``max_strikes`` or more are in quarantine) or without the windows its
        peers were seen in (then every peer was seen in the book's last window)."""
        d = read_object(value, "trust book")
        scores, strikes = read_object(d.get("scores"), "scores"), read_object(d.get("strikes"), "strikes")
        strike_decay = read_float(d, "strike_decay") if "strike_decay" in d else cls.strike_decay
        if not 0.0 <= strike_decay <= 1.0:
            raise InvalidMessage("strike_decay must be in [0, 1]")
        max_strikes = read_int(d, "max_strikes", low=1, high=1000)
        release = read_float(d, "release_strikes") if "release_strikes" in d else cls.release_strikes
        if not 0.0 < release <= max_strikes:
            raise InvalidMessage("release_strikes must be in (0, max_strikes]")
        counts = {peer: _strikes(strikes, peer) for peer in strikes}
        held = d.get("quarantined", [peer for peer, n in counts.items() if n >= max_strikes])
        if not isinstance(held, list) or not all(isinstance(peer, str) and peer in counts for peer in held):
            raise InvalidMessage("quarantined must list peers of the book's strikes")
        window = read_int(d, "window", low=0, high=1 << 62) if "window" in d else 0
        seen = read_object(d.get("seen", {}), "seen")
        forget_after = read_int(d, "forget_after", low=1, high=1 << 30) if "forget_after" in d else cls.forget_after
        return cls(
            max_strikes,
            read_float(d, "decay"),
            {peer: read_float(scores, peer) for peer in scores},
            counts,
            strike_decay,
            release,
            frozenset(held),
            window,
            {p: read_int(seen, p, low=0, high=window) if p in seen else window for p in set(scores) | set(counts)},
            forget_after,
        )


def _strikes(strikes: Mapping[str, object], peer: str) -> float:
    value = read_float(strikes, peer)
    if value < 0:
        raise InvalidMessage(f"negative strikes for {peer}")
    return value
