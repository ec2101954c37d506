"""Why a candidate was accepted or rejected: one typed set of reasons for every part of the network.

A ``Reason`` is what crosses the wire in a ``Verdict`` (its value, never renamed), what the trust
book counts (``strike_weight``: 1 for misbehaviour; ½ for a regression, an untrusted direction,
missing evidence of work or a copy, which honest peers hit now and then (label-skewed ones near
convergence, a statistical test by chance, an original that drew less evidence than its copy) but an
attacker repeats; 0 for timing and collective outcomes), and what the attack suite, the demo's summary
and the viewer group by. The human-readable detail travels beside it, never parsed.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Reason"]


class Reason(StrEnum):
    ACCEPTED = "accepted"
    STALE_BASE = "stale_base"  # trained on a head that is no longer current
    REPLAY = "replay"  # artifact already judged, or a second candidate from one peer in a window
    BAD_SIGNATURE = "bad_signature"
    WRONG_LEASE = "wrong_lease"  # lease missing, not the trainer's, not this window's, not edge-signed
    OUT_OF_LEASE = "out_of_lease"  # claims more examples than the lease covers
    UNDECODABLE = "undecodable"  # the artifact could not be fetched or decoded
    QUARANTINED = "quarantined"  # too many strikes
    WRONG_SHAPE = "wrong_shape"  # tensor names, shapes or dtype differ from the model spec
    NON_FINITE = "non_finite"  # NaN or Inf
    NORM_TOO_LARGE = "norm_too_large"
    FREE_RIDER = "free_rider"  # (almost) no update
    OUTLIER = "outlier"  # direction far from the cohort's robust centre
    REGRESSION = "regression"  # the merge with this candidate is worse than without it, past the margin
    MERGE_BLOCKED = "merge_blocked"  # accepted alone, but the merged head raised validation loss
    UNTRUSTED_DIRECTION = "untrusted_direction"  # opposed to the reference (cos <= min_trust), no holdout gain
    NO_LEASE_EVIDENCE = "no_lease_evidence"  # nothing shows it trained on its lease (protocol.evidence)
    NEAR_DUPLICATE = "near_duplicate"  # a copy of another candidate's update (protocol.near_duplicates)

    @property
    def accepted(self) -> bool:
        return self is Reason.ACCEPTED

    @property
    def strike_weight(self) -> float:
        """How much this rejection counts against the peer in the trust book."""
        return _STRIKE_WEIGHTS.get(self, 0.0)

    @property
    def strike(self) -> bool:
        """Whether this rejection counts against the peer at all (misbehaviour, not timing)."""
        return self.strike_weight > 0


_STRIKE_WEIGHTS = {
    Reason.BAD_SIGNATURE: 1.0,
    Reason.WRONG_LEASE: 1.0,
    Reason.OUT_OF_LEASE: 1.0,
    Reason.REPLAY: 1.0,
    Reason.UNDECODABLE: 1.0,
    Reason.WRONG_SHAPE: 1.0,
    Reason.NON_FINITE: 1.0,
    Reason.NORM_TOO_LARGE: 1.0,
    Reason.FREE_RIDER: 1.0,
    Reason.OUTLIER: 1.0,
    Reason.UNTRUSTED_DIRECTION: 0.5,
    Reason.REGRESSION: 0.5,
    Reason.NO_LEASE_EVIDENCE: 0.5,
    Reason.NEAR_DUPLICATE: 0.5,
}
