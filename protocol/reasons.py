"""Why a candidate was accepted or rejected: one typed set of reasons for every part of the network.

A ``Reason`` is what crosses the wire in a ``Verdict`` (its value), what the trust book counts
(``strike``: the reason shows misbehaviour, not bad luck), and what the attack suite, the demo's
summary and the viewer group by. The human-readable detail travels beside it, never parsed.
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
    REGRESSION = "regression"  # the candidate alone raises validation loss past the margin
    MERGE_BLOCKED = "merge_blocked"  # accepted alone, but the merged head raised validation loss

    @property
    def accepted(self) -> bool:
        return self is Reason.ACCEPTED

    @property
    def strike(self) -> bool:
        """Whether this rejection counts against the peer (misbehaviour, not timing or bad luck)."""
        return self in _STRIKES


_STRIKES = frozenset(
    {
        Reason.BAD_SIGNATURE,
        Reason.WRONG_LEASE,
        Reason.OUT_OF_LEASE,
        Reason.REPLAY,
        Reason.UNDECODABLE,
        Reason.WRONG_SHAPE,
        Reason.NON_FINITE,
        Reason.NORM_TOO_LARGE,
        Reason.FREE_RIDER,
        Reason.OUTLIER,
    }
)
