"""Judging one window, pure: from prechecked submissions to screens and the merged parameters.

Validators do the I/O-side checks first (signature, lease, artifact download) and pass each
candidate as a ``Submission`` with that ``precheck``; ``judge_window`` then applies, in order:
quarantine, one candidate per peer, schema and finiteness, cohort screening (norm, cosine),
the per-candidate validation-loss check, weight caps per peer kind, the preset's aggregator and
the promotion rule. It is pure: the trust book it is given is not changed, the decision carries
the next one. The attack suite calls the same function, so what it scores is what runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .aggregation import AGGREGATORS, merge_params
from .errors import ProtocolError
from .messages import Candidate, Lease
from .model import ModelSpec, Params
from .reasons import Reason
from .screening import ACCEPT, Screen, ScreeningPolicy, judge_promotion, screen_cohort, screen_schema
from .trust import TrustBook
from .window import lease_covers

__all__ = ["Submission", "WindowDecision", "judge_window", "precheck", "stale_base"]

FRESH_TRUST = TrustBook()  # no peer has a history yet
Evaluate = Callable[[Mapping[str, np.ndarray]], dict[str, float]]


def stale_base(base_head: str, current_head: str) -> Screen:
    return Screen(Reason.STALE_BASE, f"trained on {base_head[:19]}, current is {current_head[:19]}")


def precheck(
    candidate: Candidate,
    *,
    current_head: str,
    judged: Mapping[str, object] | set[str],
    lease: Lease | None,
    leased_examples: int,
    edge_key: bytes | None,
) -> Screen:
    """Checks on a candidate's descriptor and lease, before its artifact is looked at.

    ``judged`` holds the ids already decided (a re-signed old artifact is a replay); ``lease`` is
    the lease the candidate names, as the edge stores it (``None`` when unknown)."""
    if candidate.base_head != current_head:
        return stale_base(candidate.base_head, current_head)
    if candidate.candidate_id in judged:
        return Screen(Reason.REPLAY, "this artifact was already submitted")
    try:
        candidate.verify_own()
    except ProtocolError as exc:
        return Screen(Reason.BAD_SIGNATURE, str(exc))
    if lease is None or not lease_covers(lease, candidate):
        return Screen(Reason.WRONG_LEASE, "lease is missing or not this peer's lease for this window")
    if edge_key is not None:
        try:
            lease.verify(edge_key)
        except ProtocolError:
            return Screen(Reason.WRONG_LEASE, "lease not signed by the edge")
    if candidate.examples > leased_examples:
        return Screen(Reason.OUT_OF_LEASE, f"claims {candidate.examples} examples, lease covers {leased_examples}")
    return ACCEPT


@dataclass(frozen=True)
class Submission:
    candidate_id: str
    peer_id: str
    peer_kind: str
    examples: float
    params: Mapping[str, np.ndarray] | None
    precheck: Screen


@dataclass(frozen=True)
class WindowDecision:
    screens: dict[str, Screen]
    accepted: tuple[str, ...]
    merged: Params | None
    merged_metrics: dict[str, float] | None
    candidate_metrics: dict[str, dict[str, float]]
    trust: TrustBook  # the book after this window's decisions

    @property
    def promoted(self) -> bool:
        return self.merged is not None


def judge_window(
    spec: ModelSpec,
    base: Mapping[str, np.ndarray],
    base_metrics: Mapping[str, float],
    submissions: Sequence[Submission],
    policy: ScreeningPolicy,
    evaluate: Evaluate,
    trust: TrustBook = FRESH_TRUST,
) -> WindowDecision:
    """Screens for every submission, the merged parameters when the window promotes, the next trust book."""
    screens: dict[str, Screen] = {}
    contributed: set[str] = set()
    valid: list[Submission] = []
    for sub in sorted(submissions, key=lambda s: s.candidate_id):
        if not sub.precheck.accepted:
            screen = sub.precheck
        elif trust.quarantined(sub.peer_id):
            screen = Screen(Reason.QUARANTINED, "too many rejected submissions from this peer")
        elif sub.peer_id in contributed:
            screen = Screen(Reason.REPLAY, "this peer already contributed to this window")
        elif sub.params is None:
            screen = Screen(Reason.UNDECODABLE, "no parameters")
        else:
            screen = screen_schema(spec, sub.params)
        screens[sub.candidate_id] = screen
        if screen.accepted:
            contributed.add(sub.peer_id)
            valid.append(sub)
    cohort = screen_cohort(spec, base, [s.params for s in valid], policy)  # type: ignore[misc]
    metrics: dict[str, dict[str, float]] = {}
    for sub, screen in zip(valid, cohort, strict=True):
        screens[sub.candidate_id] = screen
        if screen.accepted:
            metrics[sub.candidate_id] = evaluate(sub.params)  # type: ignore[arg-type]
            screens[sub.candidate_id] = judge_promotion(
                base_metrics, metrics[sub.candidate_id], policy.candidate_margin
            )
    accepted = [s for s in valid if screens[s.candidate_id].accepted]
    merged: Params | None = None
    merged_metrics: dict[str, float] | None = None
    if accepted:
        caps = dict(policy.max_examples_by_kind)
        triples = [(s.candidate_id, s.params, min(s.examples, caps.get(s.peer_kind, s.examples))) for s in accepted]
        merged = merge_params(spec, base, triples, AGGREGATORS[policy.aggregator])  # type: ignore[arg-type]
        merged_metrics = evaluate(merged)
        outcome = judge_promotion(base_metrics, merged_metrics, policy.promotion_margin)
        if not outcome.accepted:
            for sub in accepted:
                screens[sub.candidate_id] = Screen(Reason.MERGE_BLOCKED, outcome.detail)
            merged = None
    for sub in submissions:
        screen = screens[sub.candidate_id]
        trust = trust.recorded(sub.peer_id, screen.accepted and merged is not None, screen.reason)
    return WindowDecision(
        screens=screens,
        accepted=tuple(s.candidate_id for s in accepted) if merged is not None else (),
        merged=merged,
        merged_metrics=merged_metrics,
        candidate_metrics=metrics,
        trust=trust,
    )
