"""The window rules, pure and fast: each test fails if its rule is removed or loosened.

A tiny model (3 → 2, 8 parameters) keeps every expected number computable by hand; evaluation is a
stub whose validation loss the test chooses, so the promotion rules are tested exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest

from protocol.aggregation import bulyan, flatten, fltrust_trimmed_mean
from protocol.deadline import (
    DeadlinePolicy,
    DeliveryRecord,
    WindowProgress,
    window_closes,
    window_deadline_s,
    window_grace_s,
)
from protocol.errors import InvalidMessage
from protocol.evidence import (
    AHEAD_CHAIN,
    CONTROL_SHARDS,
    DECISIVE_Z,
    EVIDENCE_EXAMPLES,
    EVIDENCE_STAGES,
    EvidenceDraw,
    evidence_decided,
    lease_evidence_z,
    lease_measurable,
    restarts_from_head,
)
from protocol.judging import FRESH_TRUST, Submission, WindowDecision, judge_window
from protocol.model import Params, mlp
from protocol.reasons import Reason
from protocol.screening import (
    ACCEPT,
    PRESETS,
    ScreeningPolicy,
    judge_promotion,
    lease_evidence_applies,
    lease_evidence_credits,
    screen_lease_evidence,
)
from protocol.trust import TrustBook

TINY = mlp("tiny", (3, 2))
BASE: Params = {
    "dense0.kernel": np.ones((3, 2), np.float32),
    "dense0.bias": np.ones(2, np.float32),
}


def _params(delta: np.ndarray) -> Params:
    """``BASE`` + ``delta`` (8 numbers in the spec's order)."""
    vector = flatten(TINY, BASE) + np.asarray(delta, np.float64)
    return {"dense0.kernel": vector[:6].reshape(3, 2).astype(np.float32), "dense0.bias": vector[6:].astype(np.float32)}


def _id(index: int) -> str:
    return f"sha256:{index:064x}"


def _sub(index: int, delta: np.ndarray, *, examples: float = 1000.0, kind: str = "native") -> Submission:
    return Submission(_id(index), f"peer-{index}", kind, examples, _params(delta), ACCEPT)


def _loss_by_offset(params: Mapping[str, np.ndarray]) -> dict[str, float]:
    """A validation loss that grows with the merged parameters' mean offset from the base."""
    offset = float((flatten(TINY, params) - flatten(TINY, BASE)).mean())
    return {"loss": 1.0 + offset, "accuracy": 0.5}


def _judge(
    subs: list[Submission],
    policy: ScreeningPolicy,
    trust: TrustBook = FRESH_TRUST,
    *,
    reference: np.ndarray | None = None,
    evaluate=_loss_by_offset,  # type: ignore[no-untyped-def]
    base_metrics: Mapping[str, float] | None = None,
) -> WindowDecision:
    ref = None if reference is None else _params(reference)
    # the merge rules' own step (shares: test_judging_stages.py); in 8 numbers updates alike are
    # copies by ``protocol.near_duplicates``' bound, which tests/test_near_duplicates.py tests
    whole = replace(policy, step_shares=(1.0,), rejects_copies=False)
    return judge_window(TINY, BASE, base_metrics or {"loss": 1.0}, subs, whole, evaluate, trust, reference=ref)


def _merged_delta(decision: WindowDecision) -> np.ndarray:
    assert decision.merged is not None, decision.screens
    return flatten(TINY, decision.merged) - flatten(TINY, BASE)


DIRECTION = np.array([1.0, 0.9, 1.1, 1.0, 0.95, 1.05, 1.0, 1.0])
# FedAvg with no screening and no per-candidate margin: only the rule under test decides
OPEN = ScreeningPolicy("open", "weighted_mean", np.inf, 0.0, -np.inf, np.inf, 0.0, candidate_margin=np.inf)
# no loss checks at all: only screening and the merge rule decide
NO_LOSS_CHECKS = {"candidate_margin": np.inf, "promotion_margin": np.inf, "holdout_overrides_direction": False}


# -- the promotion rule ------------------------------------------------------------------------
def test_merged_head_is_blocked_when_validation_loss_rises_past_the_margin() -> None:
    policy = replace(OPEN, promotion_margin=0.02)
    # mean offset 0.03 > margin 0.02: blocked, every accepted candidate says why, nothing is accepted
    blocked = _judge([_sub(1, np.full(8, 0.03)), _sub(2, np.full(8, 0.03))], policy)
    assert not blocked.promoted and blocked.accepted == ()
    assert {s.reason for s in blocked.screens.values()} == {Reason.MERGE_BLOCKED}
    # mean offset 0.01 < margin: promoted
    promoted = _judge([_sub(1, np.full(8, 0.01)), _sub(2, np.full(8, 0.01))], policy)
    assert promoted.promoted and len(promoted.accepted) == 2


def test_a_blocked_merge_blames_only_the_candidates_that_made_it_worse() -> None:
    # leave-one-out margin 0.15 lets both through; the merge (mean offset 0.05) is blocked at 0.02
    policy = replace(OPEN, candidate_margin=0.15, promotion_margin=0.02)
    decision = _judge([_sub(1, np.full(8, 0.16)), _sub(2, np.full(8, -0.06))], policy)
    assert not decision.promoted
    assert decision.marginal_losses == pytest.approx({_id(1): 0.11, _id(2): -0.11}, abs=1e-6)
    # 1 raised the merged loss by 0.11 > half the candidate margin (0.075): a regression (half strike)
    assert decision.screens[_id(1)].reason is Reason.REGRESSION
    assert decision.screens[_id(2)].reason is Reason.MERGE_BLOCKED  # it lowered it: no blame
    assert decision.trust.strikes == {"peer-1": 0.5, "peer-2": 0.0}


def test_a_candidate_whose_merge_is_worse_than_without_it_is_rejected() -> None:
    policy = PRESETS["balanced"]  # leave-one-out margin 0.03
    worse, fine = DIRECTION * 0.2, DIRECTION * 0.01
    decision = _judge([_sub(1, worse), _sub(2, fine)], policy)
    # with both, the weighted mean's offset is 0.105; without 1 it is 0.01: 1 adds 0.095 > 0.03
    assert decision.marginal_losses[_id(1)] == pytest.approx(0.095, abs=1e-6)
    assert decision.screens[_id(1)].reason is Reason.REGRESSION
    assert decision.screens[_id(2)].accepted and decision.promoted


def _skewed_loss(params: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Two "classes": coordinates 0–3 and 4–7. Progress lowers the loss, imbalance between them
    raises it quadratically (an update that learns one class and forgets the other)."""
    delta = flatten(TINY, params) - flatten(TINY, BASE)
    progress, imbalance = delta.mean(), delta[:4].mean() - delta[4:].mean()
    return {"loss": 1.0 - progress + 10 * imbalance**2, "accuracy": 0.5}


def test_label_skewed_candidates_are_judged_by_what_they_add_to_the_merge() -> None:
    """Each alone raises the loss a lot (it forgets the other class); together they improve it.
    The leave-one-out rule accepts both, where a candidate-alone rule would reject both."""
    a = np.array([0.2] * 4 + [0.0] * 4)
    b = np.array([0.0] * 4 + [0.2] * 4)
    assert _skewed_loss(_params(a))["loss"] > 1.3 and _skewed_loss(_params((a + b) / 2))["loss"] < 1.0
    decision = _judge([_sub(1, a), _sub(2, b)], PRESETS["balanced"], evaluate=_skewed_loss)
    assert decision.promoted and len(decision.accepted) == 2, decision.screens
    assert all(m < 0 for m in decision.marginal_losses.values())


def test_blocked_promotions_are_no_strikes_and_judging_leaves_the_given_book_alone() -> None:
    before = TrustBook(max_strikes=1)
    decision = _judge([_sub(1, np.full(8, 0.5))], OPEN, before)
    assert not decision.promoted and decision.screens[_id(1)].reason is Reason.MERGE_BLOCKED
    assert before.strikes == {} and before.scores == {}  # judge_window is pure
    assert not decision.trust.quarantined("peer-1") and decision.trust.scores["peer-1"] < 1.0


# -- weight caps per peer kind -----------------------------------------------------------------
def test_example_weights_are_capped_per_peer_kind() -> None:
    policy = replace(OPEN, promotion_margin=np.inf)
    browser, native = np.full(8, 0.01), np.full(8, 0.04)
    decision = _judge([_sub(1, browser, examples=1e6, kind="browser"), _sub(2, native, examples=2000.0)], policy)
    caps = dict(policy.max_examples_by_kind)
    expected = (caps["browser"] * browser + 2000.0 * native) / (caps["browser"] + 2000.0)
    np.testing.assert_allclose(_merged_delta(decision), expected, rtol=1e-5)
    assert caps == {"browser": 8000.0, "native": 32000.0}


# -- presets and their aggregators -------------------------------------------------------------
def test_presets_use_the_robust_rules() -> None:
    assert {name: (p.aggregator, p.merge_rule(True)) for name, p in PRESETS.items()} == {
        "minimal": ("weighted_mean", "weighted_mean"),
        "balanced": ("trimmed_mean", "fltrust_trimmed_mean"),
        "strict": ("bulyan", "fltrust_trimmed_mean"),
        "fltrust": ("trimmed_mean", "fltrust"),
        "multi_krum": ("multi_krum", "multi_krum"),
        "bulyan": ("bulyan", "bulyan"),
        "median": ("coordinate_median", "coordinate_median"),
        "centered_clipping": ("centered_clipping", "centered_clipping"),
    }
    assert not PRESETS["minimal"].anchored and all(p.anchored for n, p in PRESETS.items() if n != "minimal")


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("size", [1, 2, 3, 8])
def test_every_preset_judges_a_window_with_and_without_a_reference(preset: str, size: int) -> None:
    rng = np.random.default_rng(1)
    subs = [_sub(i, 0.01 * DIRECTION * (1 + 0.05 * rng.standard_normal(8))) for i in range(size)]
    for reference in (None, 0.01 * DIRECTION):
        decision = _judge(subs, PRESETS[preset], reference=reference)
        assert decision.promoted and len(decision.accepted) == size, (preset, decision.screens)
        assert decision.anchored == (reference is not None and preset != "minimal")


def test_strict_preset_merges_with_bulyan_without_a_reference() -> None:
    # seven updates in one direction (n = 7 allows f = 1 for Bulyan), one much longer along it
    scales = [1.0, 1.13, 0.91, 1.04, 0.97, 1.21, 1.9]  # no two pairs at the same distance: no ties
    deltas = [0.01 * s * DIRECTION for s in scales]
    decision = _judge([_sub(i, d) for i, d in enumerate(deltas)], replace(PRESETS["strict"], **NO_LOSS_CHECKS))
    assert len(decision.accepted) == 7
    expected = bulyan(np.stack(deltas), np.ones(7), f=1)
    np.testing.assert_allclose(_merged_delta(decision), expected, rtol=1e-5)
    assert not np.allclose(expected, np.mean(deltas, axis=0), rtol=1e-3)  # the test can tell them apart


def test_balanced_preset_merges_with_fltrust_trimmed_mean_given_a_reference() -> None:
    rng = np.random.default_rng(2)
    reference = 0.01 * DIRECTION
    deltas = [0.01 * DIRECTION * s + 0.003 * rng.standard_normal(8) for s in (1.0, 1.4, 0.7, 1.1)]
    examples = [1000.0, 500.0, 1000.0, 2000.0]
    subs = [_sub(i, d, examples=e) for i, (d, e) in enumerate(zip(deltas, examples, strict=True))]
    decision = _judge(subs, replace(PRESETS["balanced"], **NO_LOSS_CHECKS), reference=reference)
    expected = fltrust_trimmed_mean(
        np.stack([flatten(TINY, _params(d)) - flatten(TINY, BASE) for d in deltas]),
        np.array(examples),
        reference=flatten(TINY, _params(reference)) - flatten(TINY, BASE),
    )
    np.testing.assert_allclose(_merged_delta(decision), expected, rtol=1e-5, atol=1e-9)


# -- screening against the validator's reference update ----------------------------------------
UNIT = DIRECTION / np.linalg.norm(DIRECTION)
_ALTERNATING = np.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
ORTHO = _ALTERNATING - (_ALTERNATING @ UNIT) * UNIT
ORTHO /= np.linalg.norm(ORTHO)  # a unit vector orthogonal to UNIT
REFERENCE = 0.01 * UNIT


def test_small_cohorts_are_judged_against_the_reference() -> None:
    """Two candidates: the fallback skips the cosine check and bounds norms by 0.5 x the base norm,
    so a 5x update and a reversed one pass it; against the reference neither does."""
    policy = replace(PRESETS["balanced"], **NO_LOSS_CHECKS)
    honest, boosted, reversed_ = 0.01 * UNIT, 0.05 * (0.6 * UNIT + 0.8 * ORTHO), -0.01 * UNIT
    fallback = _judge([_sub(1, honest), _sub(2, boosted), _sub(3, reversed_)][:2], policy)
    assert fallback.screens[_id(2)].accepted and not fallback.anchored
    assert _judge([_sub(1, honest), _sub(3, reversed_)], policy).screens[_id(3)].accepted
    anchored = _judge([_sub(1, honest), _sub(2, boosted)], policy, reference=REFERENCE)
    assert anchored.screens[_id(2)].reason is Reason.NORM_TOO_LARGE  # 5 > 3 x ‖Δ_ref‖
    assert anchored.screens[_id(1)].accepted and anchored.anchored
    flipped = _judge([_sub(1, honest), _sub(3, reversed_)], policy, reference=REFERENCE)
    assert flipped.screens[_id(3)].reason is Reason.UNTRUSTED_DIRECTION
    assert flipped.reference_cosines[_id(3)] == pytest.approx(-1.0)
    alone = _judge([_sub(2, boosted)], policy, reference=REFERENCE)  # a cohort of one, too
    assert alone.screens[_id(2)].reason is Reason.NORM_TOO_LARGE and not alone.promoted


def test_a_clearly_opposed_direction_is_untrusted_and_free_riders_are_relative_to_the_reference() -> None:
    policy = replace(PRESETS["balanced"], **NO_LOSS_CHECKS)
    orthogonal = 0.01 * (ORTHO - 0.01 * UNIT)  # cos −0.01: no information, as honest updates near convergence
    opposed = 0.01 * (ORTHO - 0.5 * UNIT)  # cos −0.45
    tiny = 0.0009 * UNIT  # 0.09 x ‖Δ_ref‖ <= 0.1 x
    subs = [_sub(1, 0.01 * UNIT), _sub(2, orthogonal), _sub(3, tiny), _sub(4, opposed)]
    decision = _judge(subs, policy, reference=REFERENCE)
    assert decision.screens[_id(2)].accepted  # above min_trust (−0.1): merged at the trust floor
    assert decision.screens[_id(4)].reason is Reason.UNTRUSTED_DIRECTION
    assert decision.screens[_id(3)].reason is Reason.FREE_RIDER
    assert Reason.UNTRUSTED_DIRECTION.strike_weight == 0.5 and Reason.UNTRUSTED_DIRECTION.value == "untrusted_direction"
    published = _judge(subs, replace(PRESETS["fltrust"], **NO_LOSS_CHECKS), reference=REFERENCE)
    assert published.screens[_id(2)].reason is Reason.UNTRUSTED_DIRECTION  # FLTrust as published: trust 0


def test_the_free_rider_bound_follows_the_lineage_step_not_a_fresh_reference() -> None:
    """Converged trainers take steps far smaller than a fresh-optimizer reference: the bound is
    0.1 × the smaller of ‖Δ_ref‖ and the step the lineage last merged (its heads' ``update_norm``)."""
    policy = replace(PRESETS["balanced"], **NO_LOSS_CHECKS)
    small = [_sub(1, 0.0009 * UNIT), _sub(2, 0.0011 * (UNIT + 0.2 * ORTHO)), _sub(3, 0.0013 * UNIT)]  # ~0.1 x ‖Δ_ref‖
    fresh = _judge(small, policy, reference=REFERENCE)
    assert fresh.screens[_id(1)].reason is Reason.FREE_RIDER and fresh.update_norm is not None
    converged = _judge(small, policy, reference=REFERENCE, base_metrics={"loss": 1.0, "update_norm": 0.002})
    assert all(converged.screens[_id(i)].accepted for i in (1, 2, 3))
    norms = sorted(float(np.linalg.norm(flatten(TINY, s.params) - flatten(TINY, BASE))) for s in small)  # type: ignore[arg-type]
    assert converged.update_norm == pytest.approx(norms[1])  # the median accepted step, the next head records
    np.testing.assert_allclose(np.linalg.norm(_merged_delta(converged)), 0.0011, rtol=0.1)  # not scaled up to 0.01
    # a lineage step above the reference's norm does not raise the bound past 0.1 x ‖Δ_ref‖
    large = _judge(
        [_sub(4, 0.0011 * UNIT)], policy, reference=REFERENCE, base_metrics={"loss": 1.0, "update_norm": 1.0}
    )
    assert large.screens[_id(4)].accepted
    nothing = _judge(
        [_sub(5, -0.01 * UNIT)], policy, reference=REFERENCE, base_metrics={"loss": 1.0, "update_norm": 0.002}
    )
    assert not nothing.promoted and nothing.update_norm == 0.002  # a window that merges nothing carries it on


def test_a_rise_the_holdouts_own_noise_explains_never_blocks() -> None:
    """The promotion margin is at least ``noise_z`` standard errors of the two holdout losses."""
    base, merged = {"loss": 1.0, "loss_se": 0.02}, {"loss": 1.06, "loss_se": 0.02}
    assert judge_promotion(base, merged, 0.05, 3.0).accepted  # 0.06 < 3 x 0.028
    assert judge_promotion(base, merged, 0.05).reason is Reason.REGRESSION  # no noise allowance
    precise = {"loss": 1.06, "loss_se": 0.002}
    assert judge_promotion({"loss": 1.0, "loss_se": 0.002}, precise, 0.05, 3.0).reason is Reason.REGRESSION
    assert judge_promotion({"loss": 1.0}, merged, 0.05, 3.0).reason is Reason.REGRESSION  # one error unknown


def test_an_opposed_update_that_lowers_the_holdout_loss_passes_at_the_trust_floor() -> None:
    """Near convergence the reference's direction is noise: the validator's holdout, where the loss is
    lowest at ``optimum`` (a direction the reference gets wrong), decides an opposed update's fate."""
    optimum = 0.01 * (ORTHO - 0.3 * UNIT)  # cos −0.29 to the reference

    def holdout(params: Mapping[str, np.ndarray]) -> dict[str, float]:
        gap = flatten(TINY, params) - flatten(TINY, BASE) - optimum
        return {"loss": 1.0 + float(gap @ gap), "accuracy": 0.5}

    policy = replace(PRESETS["balanced"], candidate_margin=np.inf, promotion_margin=np.inf)
    subs = [_sub(1, 0.01 * UNIT), _sub(2, optimum), _sub(3, -0.01 * UNIT)]  # honest, opposed but good, flipped
    base_loss = holdout(BASE)["loss"]
    decision = judge_window(TINY, BASE, {"loss": base_loss}, subs, policy, holdout, reference=_params(REFERENCE))
    assert decision.reference_cosines[_id(2)] < policy.min_trust and decision.screens[_id(2)].accepted
    assert decision.candidate_metrics[_id(2)]["loss"] < base_loss
    flipped = decision.screens[_id(3)]
    assert flipped.reason is Reason.UNTRUSTED_DIRECTION and "does not lower the holdout loss" in flipped.detail
    assert _id(3) not in decision.candidate_metrics and set(decision.accepted) == {_id(1), _id(2)}
    published = replace(PRESETS["fltrust"], candidate_margin=np.inf, promotion_margin=np.inf)
    as_published = judge_window(TINY, BASE, {"loss": base_loss}, subs, published, holdout, reference=_params(REFERENCE))
    assert as_published.screens[_id(2)].reason is Reason.UNTRUSTED_DIRECTION  # FLTrust as published: no override


def test_the_norm_bound_counts_the_windows_of_steps_a_candidate_declares() -> None:
    """A continuous trainer's update carries a speculative epoch (or an overtaken window) on top of the
    window's steps; its norm bound grows with the declared windows, up to ``max_declared_windows``."""
    policy = replace(PRESETS["balanced"], **NO_LOSS_CHECKS)
    four = 0.04 * UNIT  # 4 x ‖Δ_ref‖, the reference's direction

    def judged(update: np.ndarray, windows: float) -> Reason:
        sub = replace(_sub(1, update), windows=windows)
        return _judge([sub], policy, reference=REFERENCE).screens[_id(1)].reason

    assert judged(four, 1.0) is Reason.NORM_TOO_LARGE  # one window's steps: at most 3 x
    assert judged(four, 2.0) is Reason.ACCEPTED  # two windows' steps: at most 6 x
    assert judged(0.1 * UNIT, 50.0) is Reason.NORM_TOO_LARGE  # claims are capped at 3 windows: 9 x
    assert judged(0.0009 * UNIT, 0.5) is Reason.FREE_RIDER  # the lower bound is one window's, whatever is claimed


def test_a_sybil_majority_cannot_move_the_anchored_bounds() -> None:
    """One honest peer and two identities sending scaled-down copies of their own update: the
    cohort median norm falls and the fallback rejects the honest update as too large; the
    reference does not move, so the honest update is accepted."""
    policy = replace(PRESETS["balanced"], **NO_LOSS_CHECKS)
    honest = 0.01 * UNIT
    own = 0.01 * (0.8 * UNIT + 0.6 * ORTHO)
    window = [_sub(1, honest), _sub(2, 0.25 * own), _sub(3, 0.26 * own)]
    assert _judge(window, policy).screens[_id(1)].reason is Reason.NORM_TOO_LARGE  # 4 x the median
    anchored = _judge(window, policy, reference=REFERENCE)
    assert anchored.screens[_id(1)].accepted and anchored.promoted


def test_a_reference_must_be_usable() -> None:
    policy = PRESETS["balanced"]
    with pytest.raises(ValueError):
        _judge([_sub(1, 0.01 * UNIT)], policy, reference=np.zeros(8))
    with pytest.raises(ValueError):
        _judge([_sub(1, 0.01 * UNIT)], policy, reference=np.full(8, np.nan))
    with pytest.raises(ValueError):  # a rule that needs a reference, without one
        _judge([_sub(1, 0.01 * UNIT)], replace(OPEN, aggregator="fltrust"))


# -- the fallback: cohort rules without a reference --------------------------------------------
def test_without_a_reference_small_cohorts_bound_norms_relative_to_the_base() -> None:
    policy = PRESETS["balanced"]  # < 3 candidates: ‖Δ‖ ≤ 0.5 ‖base‖ and > 1e-6 ‖base‖
    base_norm = float(np.linalg.norm(flatten(TINY, BASE)))  # sqrt(8)
    large = _judge([_sub(1, 0.51 * base_norm * UNIT), _sub(2, 0.01 * UNIT)], policy)
    assert large.screens[_id(1)].reason is Reason.NORM_TOO_LARGE
    tiny = _judge([_sub(1, 0.9e-6 * base_norm * UNIT)], policy)
    assert tiny.screens[_id(1)].reason is Reason.FREE_RIDER


def test_without_a_reference_cohorts_of_three_screen_direction_and_relative_norm() -> None:
    policy = PRESETS["balanced"]
    honest = [0.01 * DIRECTION * s for s in (1.0, 1.1, 0.9)]
    decision = _judge(
        [_sub(i, d) for i, d in enumerate(honest)] + [_sub(7, -0.01 * DIRECTION), _sub(8, 0.04 * DIRECTION)], policy
    )
    assert decision.screens[_id(7)].reason is Reason.OUTLIER
    assert decision.screens[_id(8)].reason is Reason.NORM_TOO_LARGE


# -- typed reasons and the trust book ----------------------------------------------------------
def test_strike_weights_follow_the_reason_type() -> None:
    assert {r: r.strike_weight for r in Reason if r.strike} == {
        Reason.BAD_SIGNATURE: 1.0, Reason.WRONG_LEASE: 1.0, Reason.OUT_OF_LEASE: 1.0, Reason.REPLAY: 1.0,
        Reason.UNDECODABLE: 1.0, Reason.WRONG_SHAPE: 1.0, Reason.NON_FINITE: 1.0, Reason.NORM_TOO_LARGE: 1.0,
        Reason.FREE_RIDER: 1.0, Reason.OUTLIER: 1.0, Reason.UNTRUSTED_DIRECTION: 0.5, Reason.REGRESSION: 0.5,
        Reason.NO_LEASE_EVIDENCE: 0.5, Reason.NEAR_DUPLICATE: 0.5,
    }  # fmt: skip
    for reason in (Reason.STALE_BASE, Reason.MERGE_BLOCKED, Reason.QUARANTINED, Reason.ACCEPTED):
        assert reason.strike_weight == 0.0


def _windows(book: TrustBook, outcomes: list[Reason]) -> list[float]:
    """One peer's strikes after each of a sequence of judged windows."""
    history = []
    for reason in outcomes:
        book = book.after_window([("p", reason.accepted, reason)])
        history.append(book.strikes["p"])
    return history


def test_strikes_decay_per_window_not_per_acceptance() -> None:
    book = TrustBook()  # 3 strikes, decay 0.9 per window
    history = _windows(book, [Reason.OUTLIER, Reason.ACCEPTED, Reason.ACCEPTED])
    assert history == pytest.approx([1.0, 0.9, 0.81])  # an acceptance takes nothing away: time does
    # alternating bad and good still accumulates and ends in quarantine
    alternating = _windows(book, [Reason.OUTLIER, Reason.ACCEPTED] * 6)
    assert alternating[:4] == pytest.approx([1.0, 0.9, 1.81, 1.629])
    first = next(i for i, s in enumerate(alternating) if s >= 3)
    assert first == 8  # the 5th bad one
    # an honest peer's rare bad luck fades: one strike every ten windows never quarantines
    rare = _windows(book, ([Reason.OUTLIER] + [Reason.ACCEPTED] * 9) * 5)
    assert max(rare) < 1.6


def test_repeated_regressions_count() -> None:
    book = TrustBook()
    assert _windows(book, [Reason.REGRESSION])[-1] == 0.5
    persistent = _windows(book, [Reason.REGRESSION] * 12)
    assert persistent[7] < 3 <= persistent[8]  # the ninth regression in a row quarantines
    untrusted = _windows(book, [Reason.UNTRUSTED_DIRECTION] * 12)
    assert untrusted == persistent


def test_quarantine_is_a_term_with_probation_after_it_and_survives_the_wire() -> None:
    book = TrustBook().after_window([("p", False, Reason.REPLAY)] * 3)
    assert book.quarantined("p") and book.quarantine == {"p"}
    # rejected unseen (no strike) while its strikes decay: held until they fall below 1.5
    terms = []
    while book.quarantined("p"):
        book = book.after_window([("p", False, Reason.QUARANTINED)])
        terms.append(book.strikes["p"])
        assert TrustBook.from_wire(book.to_wire()) == book
    assert len(terms) == 7 and terms[-2] >= 1.5 > terms[-1]  # 3 x 0.9^7 = 1.43
    # probation: back in quarantine after two more outliers, not after five
    again = _windows(book, [Reason.OUTLIER] * 2)
    assert again[-1] >= 3 and book.after_window([("p", False, Reason.OUTLIER)] * 2).quarantined("p")
    # a peer that stops submitting is not released: only the windows it takes part in count (until it is
    # forgotten: below)
    idle = TrustBook().after_window([("p", False, Reason.REPLAY)] * 3).after_window([("q", True, Reason.ACCEPTED)] * 20)
    assert idle.quarantined("p")
    # older books still read: integer strikes without strike_decay, no quarantine list (held at max_strikes)
    old = TrustBook.from_wire({"max_strikes": 3, "decay": 0.8, "scores": {"p": 0.5}, "strikes": {"p": 2, "q": 3}})
    assert old.strikes == {"p": 2.0, "q": 3.0} and old.strike_decay == 0.9 and old.quarantine == {"q"}
    with pytest.raises(InvalidMessage):  # a quarantine list naming peers the book has no strikes for
        TrustBook.from_wire({**TrustBook().to_wire(), "quarantined": ["nobody"]})


def test_a_peer_absent_for_forget_after_windows_is_forgotten_so_the_book_stays_bounded() -> None:
    book = TrustBook(forget_after=4)
    for window in range(40):  # a fresh identity every window, rejected and never seen again, beside an honest peer
        book = book.after_window([(f"sybil-{window}", False, Reason.OUTLIER), ("honest", True, Reason.ACCEPTED)])
        assert len(book.strikes) <= 5 and set(book.seen) == set(book.strikes) == set(book.scores)
    assert book.window == 40 and set(book.strikes) == {"honest", "sybil-36", "sybil-37", "sybil-38", "sybil-39"}
    assert TrustBook.from_wire(book.to_wire()) == book
    # a quarantined peer that stays away is forgotten too: it comes back as new, as a new key would
    held = TrustBook(forget_after=4).after_window([("p", False, Reason.REPLAY)] * 3)
    for _ in range(3):
        held = held.after_window([("q", True, Reason.ACCEPTED)])
    assert held.quarantined("p")
    held = held.after_window([("q", True, Reason.ACCEPTED)])
    assert not held.quarantined("p") and "p" not in held.strikes and "p" not in held.scores
    # a book saved before peers' windows were kept reads them as seen in its last window
    old = {k: v for k, v in book.to_wire().items() if k not in ("window", "seen", "forget_after")}
    assert TrustBook.from_wire(old).seen == dict.fromkeys(book.strikes, 0)


def test_judge_window_decays_the_strikes_of_the_peers_it_judges() -> None:
    trust = TrustBook().after_window([("peer-1", False, Reason.OUTLIER), ("peer-9", False, Reason.OUTLIER)])
    decision = _judge([_sub(1, 0.01 * DIRECTION), _sub(2, 0.01 * DIRECTION)], PRESETS["minimal"], trust)
    assert decision.promoted
    assert decision.trust.strikes["peer-1"] == pytest.approx(0.9)  # took part: one window older
    assert decision.trust.strikes["peer-9"] == 1.0  # not in this window: unchanged


def test_quarantined_peers_are_rejected_unseen() -> None:
    policy = PRESETS["minimal"]
    trust = TrustBook(max_strikes=1).recorded("peer-1", False, Reason.NON_FINITE)
    decision = _judge([_sub(1, 0.01 * DIRECTION), _sub(2, 0.01 * DIRECTION)], policy, trust)
    assert decision.screens[_id(1)].reason is Reason.QUARANTINED
    assert decision.accepted == (_id(2),)


# -- the adaptive window deadline --------------------------------------------------------------
@pytest.mark.parametrize(
    ("recent_s", "expected_s"),
    [
        ([], 30.0),  # no history: the experiment's window_timeout_s
        ([4.0, 2.0, 3.0], 9.0),  # 3 × median
        ([0.5, 0.5], 5.0),  # never below min_s
        ([20.0], 30.0),  # never above window_timeout_s
        ([100.0] * 5 + [1.0] * 10, 5.0),  # only the last `history` durations count
    ],
)
def test_window_deadline_follows_recent_windows(recent_s: list[float], expected_s: float) -> None:
    assert window_deadline_s(recent_s, 30.0, DeadlinePolicy(factor=3.0, min_s=5.0, history=10)) == expected_s


@pytest.mark.parametrize(
    ("progress", "turn", "closes"),
    [
        (WindowProgress(candidates=2, leased=2, outstanding=0, elapsed_s=1.0), 0, True),  # everyone delivered
        (WindowProgress(candidates=1, leased=2, outstanding=1, elapsed_s=1.0), 0, False),  # a lease still out
        (WindowProgress(candidates=1, leased=2, outstanding=1, elapsed_s=10.0), 0, True),  # its deadline
        (WindowProgress(candidates=0, leased=9, outstanding=9, elapsed_s=9.9), 0, False),  # squatted, before
        (WindowProgress(candidates=0, leased=9, outstanding=9, elapsed_s=10.0), 0, True),  # squatted: it ends
        (WindowProgress(candidates=0, leased=3, outstanding=0, elapsed_s=10.0), 0, True),  # leases lapsed, empty
        (WindowProgress(candidates=0, leased=0, outstanding=0, elapsed_s=1e6), 0, False),  # nobody came: no churn
        (WindowProgress(candidates=2, leased=2, outstanding=0, elapsed_s=1.0), 1, False),  # the second proposer
        (WindowProgress(candidates=2, leased=2, outstanding=0, elapsed_s=10.0), 1, True),  # ... one deadline later
        (WindowProgress(candidates=0, leased=4, outstanding=4, elapsed_s=15.0), 1, False),
        (WindowProgress(candidates=0, leased=4, outstanding=4, elapsed_s=20.0), 1, True),
    ],
)
def test_a_window_closes_when_everyone_delivered_and_always_at_its_deadline(
    progress: WindowProgress, turn: int, closes: bool
) -> None:
    assert window_closes(progress, min_candidates=1, deadline_s=10.0, turn=turn) is closes


@pytest.mark.parametrize(
    ("progress", "turn", "closes"),
    [
        (WindowProgress(candidates=2, leased=3, outstanding=0, elapsed_s=1.9, unproven=1), 0, False),  # grace
        (WindowProgress(candidates=2, leased=3, outstanding=0, elapsed_s=2.0, unproven=1), 0, True),  # over
        (WindowProgress(candidates=2, leased=4, outstanding=1, elapsed_s=2.0, unproven=1), 0, False),  # a record
        (WindowProgress(candidates=0, leased=3, outstanding=0, elapsed_s=2.0, unproven=3), 0, False),  # none in
        (WindowProgress(candidates=2, leased=3, outstanding=0, elapsed_s=11.9, unproven=1), 1, False),
        (WindowProgress(candidates=2, leased=3, outstanding=0, elapsed_s=12.0, unproven=1), 1, True),
    ],
)
def test_leases_of_peers_without_a_record_hold_a_window_only_for_the_grace(
    progress: WindowProgress, turn: int, closes: bool
) -> None:
    assert window_closes(progress, min_candidates=1, deadline_s=10.0, grace_s=2.0, turn=turn) is closes


@pytest.mark.parametrize(
    ("recent_s", "expected_s"),
    [
        ([], 30.0),  # no history: the deadline (window_timeout_s)
        ([4.0, 2.0, 3.0], 3.0),  # the median
        ([0.5, 0.5], 0.5),  # below the deadline's min_s too
        ([20.0], 20.0),
        ([40.0], 30.0),  # never past the deadline
    ],
)
def test_the_newcomers_grace_is_the_median_window(recent_s: list[float], expected_s: float) -> None:
    assert window_grace_s(recent_s, 30.0, DeadlinePolicy(factor=3.0, min_s=5.0, history=10)) == expected_s


@pytest.mark.parametrize(
    ("recent_s", "first_s", "expected_s"),
    [
        ([], 4.0, 8.0),  # a first window: as long again as it took to hold its min_candidates
        ([], 0.5, 1.0),
        ([], 20.0, 30.0),  # never past the deadline
        ([4.0, 2.0, 3.0], 10.0, 3.0),  # with a history, the history's median: the window's own pace aside
    ],
)
def test_a_first_windows_newcomers_are_waited_for_as_long_again_as_it_took_to_fill(
    recent_s: list[float], first_s: float, expected_s: float
) -> None:
    assert window_grace_s(recent_s, 30.0, DeadlinePolicy(factor=3.0, min_s=5.0, history=10), first_s) == expected_s


def test_a_peer_has_a_record_while_its_last_candidate_was_accepted_and_it_missed_no_window() -> None:
    record = DeliveryRecord(capacity=2)
    assert "a" not in record  # a newcomer
    record.judged("a", True)
    assert "a" in record
    record.missed("a")  # a lease of its lapsed undelivered
    assert "a" not in record
    record.judged("a", True)
    record.judged("b", False)
    assert "a" in record and "b" not in record
    record.judged("c", True)  # past capacity: the peer heard of longest ago is forgotten
    assert "a" not in record and "c" in record


def test_a_window_short_of_min_candidates_waits_for_its_deadline() -> None:
    early = WindowProgress(candidates=1, leased=1, outstanding=0, elapsed_s=1.0)
    assert not window_closes(early, min_candidates=2, deadline_s=10.0)
    assert window_closes(replace(early, elapsed_s=10.0), min_candidates=2, deadline_s=10.0)


# -- credit for work: evidence that a candidate trained on its lease -------------------------------
_GAINS = np.random.default_rng(11).normal(size=4000)  # unit-variance per-example loss gains


@pytest.mark.parametrize(
    ("lease", "control", "z"),
    [
        (0.15 + _GAINS[:2000], _GAINS[2000:], 4.40),  # fits its lease 0.15 more than other training examples
        (_GAINS[:2000], _GAINS[2000:], -0.34),  # gains on its lease what it gains anywhere: noise
        (0.05 + _GAINS[:2000], 0.05 + _GAINS[2000:], -0.34),  # a general improvement is no evidence
        (np.zeros(10), np.zeros(10), 0.0),  # the head itself
        (np.ones(10), np.zeros(10), np.inf),  # constant and different
        (-np.ones(10), np.zeros(10), -np.inf),
    ],
)
def test_lease_evidence_z(lease: np.ndarray, control: np.ndarray, z: float) -> None:
    assert lease_evidence_z(lease, control) == pytest.approx(z, abs=0.01)


@pytest.mark.parametrize(("lease", "control"), [([1.0], [0.0, 1.0]), ([0.0, np.nan], [0.0, 1.0])])
def test_lease_evidence_z_needs_finite_examples_on_both_sides(lease: list[float], control: list[float]) -> None:
    with pytest.raises(ValueError):
        lease_evidence_z(lease, control)


@pytest.mark.parametrize(
    ("lease", "pool", "measured"),
    [
        (4_000, 37_000, True),  # the MNIST networks' 4-shard lease
        (16_000, 37_000, True),  # their largest (max_shards_per_lease)
        (18_500, 37_000, True),  # half the pool
        (18_501, 37_000, False),
        (33_000, 37_000, False),  # a lone trainer sizing its lease to the window: the control is its last lease
    ],
)
def test_a_lease_of_more_than_half_the_pool_is_not_measured(lease: int, pool: int, measured: bool) -> None:
    assert lease_measurable(lease, pool) is measured


@pytest.mark.parametrize(
    ("chain", "asks", "lease", "restarts"),
    [
        (AHEAD_CHAIN, True, 4_000, True),
        (AHEAD_CHAIN + 3, True, 4_000, True),
        (AHEAD_CHAIN - 1, True, 4_000, False),  # the chain is not long yet
        (AHEAD_CHAIN, False, 4_000, False),  # a preset that does not ask for lease evidence
        (AHEAD_CHAIN, True, 33_000, False),  # a lease of most of the pool is not measured
    ],
)
def test_a_chain_of_work_trained_ahead_restarts_from_the_head_only_where_its_lease_is_measured(
    chain: int, asks: bool, lease: int, restarts: bool
) -> None:
    assert restarts_from_head(chain, asks, lease, 37_000) is restarts


_SHARDS = [f"train-{n:05d}" for n in range(40)]


def test_a_windows_evidence_draw_follows_its_salt_and_compares_each_lease_with_shards_outside_it() -> None:
    draw = EvidenceDraw.of(b"salt", _SHARDS)
    assert draw == EvidenceDraw.of(b"salt", _SHARDS)  # the same at every validator
    assert len(draw.control) == CONTROL_SHARDS == len(set(draw.control)) and set(draw.control) <= set(_SHARDS)
    assert draw.control != EvidenceDraw.of(b"other", _SHARDS).control  # unknown until the window closes
    assert set(EvidenceDraw.of(b"salt", _SHARDS[:3]).control) == set(_SHARDS[:3])  # fewer shards: all of them
    lease = (draw.control[1], "train-99999")  # a lease sharing one shard with the control
    sizes = [1000] * CONTROL_SHARDS
    rows = draw.control_rows("lease-1", lease, sizes, 4000)
    assert len(rows) == 4000 and list(rows) == sorted(set(rows))
    assert not ((rows >= 1000) & (rows < 2000)).any()  # none of its own shard's rows
    assert len(draw.control_rows("lease-1", lease, sizes, 20_000)) == 15_000  # all it has outside the lease
    assert not np.array_equal(rows, draw.control_rows("lease-2", lease, sizes, 4000))  # each lease its own draw
    picked = draw.lease_rows("lease-1", 40_000)
    assert len(picked) == EVIDENCE_EXAMPLES and list(picked) == sorted(set(picked)) and picked.max() < 40_000
    assert len(draw.lease_rows("lease-1", 1000)) == 1000  # a lease smaller than the draw: all of it
    assert len(draw.lease_rows("lease-1", 16_000)) == 16_000  # the largest sized lease read whole (decision 0029)
    assert not np.array_equal(picked, EvidenceDraw.of(b"other", _SHARDS).lease_rows("lease-1", 40_000))
    with pytest.raises(ValueError, match="no training shards"):
        EvidenceDraw.of(b"salt", [])


def test_the_stages_of_a_draw_nest_and_a_stage_decides_at_the_decisive_z_or_at_the_whole_draw() -> None:
    draw = EvidenceDraw.of(b"salt", _SHARDS)
    first, whole = (draw.lease_rows("lease-1", 40_000, stage) for stage in EVIDENCE_STAGES)
    assert len(first) == EVIDENCE_STAGES[0] and set(first) <= set(whole) and len(whole) == EVIDENCE_EXAMPLES
    sizes = [1000] * CONTROL_SHARDS
    assert set(draw.control_rows("lease-1", (), sizes, 4000)) <= set(draw.control_rows("lease-1", (), sizes, 16_000))
    assert evidence_decided(DECISIVE_Z, 4000, 16_000) and not evidence_decided(DECISIVE_Z - 0.1, 4000, 16_000)
    assert evidence_decided(-3.0, 16_000, 16_000) and evidence_decided(0.5, 2000, 2000)  # nothing more to read


@pytest.mark.parametrize(
    ("z", "policy", "reason"),
    [
        (5.0, None, Reason.ACCEPTED),
        (2.0, None, Reason.ACCEPTED),  # at the bound passes
        (1.9, None, Reason.NO_LEASE_EVIDENCE),
        (-4.0, None, Reason.NO_LEASE_EVIDENCE),
        (float("nan"), None, Reason.NO_LEASE_EVIDENCE),
        (1.9, replace(PRESETS["balanced"], min_lease_evidence_z=1.5), Reason.ACCEPTED),
        (-np.inf, PRESETS["balanced"].without_lease_evidence(), Reason.ACCEPTED),  # the screen off
    ],
)
def test_screen_lease_evidence(z: float, policy: ScreeningPolicy | None, reason: Reason) -> None:
    screen = screen_lease_evidence(z, policy)
    assert screen.reason is reason
    assert screen.accepted or "no evidence it trained on its lease" in screen.detail


@pytest.mark.parametrize(
    ("z", "preset", "credits"),
    [
        (3.0, "balanced", True),  # at the bound
        (2.9, "balanced", False),  # enough to be accepted, not to be credited
        (None, "balanced", False),  # not measured: no credit
        (float("nan"), "balanced", False),
        (None, "minimal", True),  # asks for no evidence: credit as claimed (the undefended control)
        (-5.0, "minimal", True),
    ],
)
def test_lease_evidence_credits(z: float | None, preset: str, credits: bool) -> None:
    assert lease_evidence_credits(z, PRESETS[preset]) is credits
    assert PRESETS[preset].asks_lease_evidence is (preset != "minimal")


@pytest.mark.parametrize(
    ("head_loss", "classes", "policy", "applies"),
    [
        (None, 10, None, True),  # unknown: it applies
        (2.30, 10, None, False),  # random parameters (ln 10): an honest update shows little lease-specific gain
        (1.16, 10, None, False),  # not yet below half of chance
        (0.45, 10, None, True),
        (2.0, 96, None, True),  # half of ln 96 ≈ 2.28
        (1.16, 10, replace(PRESETS["balanced"], lease_evidence_below=1.0), True),
    ],
)
def test_lease_evidence_applies_once_the_head_has_learned(
    head_loss: float | None, classes: int, policy: ScreeningPolicy | None, applies: bool
) -> None:
    assert lease_evidence_applies(policy, head_loss, classes) is applies
