"""The window rules, pure and fast: each test fails if its rule is removed or loosened.

A tiny model (3 → 2, 8 parameters) keeps every expected number computable by hand; evaluation is a
stub whose validation loss the test chooses, so the promotion rules are tested exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest

from protocol.aggregation import flatten
from protocol.deadline import DeadlinePolicy, window_deadline_s
from protocol.judging import FRESH_TRUST, Submission, WindowDecision, judge_window
from protocol.model import ModelSpec, Params
from protocol.reasons import Reason
from protocol.screening import ACCEPT, PRESETS, ScreeningPolicy
from protocol.trust import TrustBook

TINY = ModelSpec("tiny", (3, 2))
BASE: Params = {
    "dense0.kernel": np.ones((3, 2), np.float32),
    "dense0.bias": np.ones(2, np.float32),
}


def _params(delta: np.ndarray) -> Params:
    """``BASE`` + ``delta`` (8 numbers in the spec's order)."""
    vector = flatten(TINY, BASE) + np.asarray(delta, np.float64)
    return {"dense0.kernel": vector[:6].reshape(3, 2).astype(np.float32), "dense0.bias": vector[6:].astype(np.float32)}


def _sub(index: int, delta: np.ndarray, *, examples: float = 1000.0, kind: str = "native") -> Submission:
    return Submission(f"sha256:{index:064x}", f"peer-{index}", kind, examples, _params(delta), ACCEPT)


def _loss_by_offset(params: Mapping[str, np.ndarray]) -> dict[str, float]:
    """A validation loss that grows with the merged parameters' mean offset from the base."""
    offset = float((flatten(TINY, params) - flatten(TINY, BASE)).mean())
    return {"loss": 1.0 + offset, "accuracy": 0.5}


def _judge(subs: list[Submission], policy: ScreeningPolicy, trust: TrustBook = FRESH_TRUST) -> WindowDecision:
    return judge_window(TINY, BASE, {"loss": 1.0}, subs, policy, _loss_by_offset, trust)


def _merged_delta(decision: WindowDecision) -> np.ndarray:
    assert decision.merged is not None, decision.screens
    return flatten(TINY, decision.merged) - flatten(TINY, BASE)


DIRECTION = np.array([1.0, 0.9, 1.1, 1.0, 0.95, 1.05, 1.0, 1.0])
# FedAvg with no screening and no per-candidate margin: only the rule under test decides
OPEN = ScreeningPolicy("open", "weighted_mean", np.inf, 0.0, -np.inf, np.inf, 0.0, candidate_margin=np.inf)


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


def test_a_single_candidate_that_regresses_past_its_margin_is_rejected() -> None:
    policy = PRESETS["balanced"]  # candidate_margin 0.1
    worse, fine = DIRECTION * 0.2, DIRECTION * 0.01  # mean offsets 0.2 (> 0.1) and 0.01
    decision = _judge([_sub(1, worse), _sub(2, fine)], policy)
    assert decision.screens[f"sha256:{1:064x}"].reason is Reason.REGRESSION
    assert decision.screens[f"sha256:{2:064x}"].accepted


def test_blocked_promotions_are_no_strikes_and_judging_leaves_the_given_book_alone() -> None:
    before = TrustBook(max_strikes=1)
    decision = _judge([_sub(1, np.full(8, 0.5))], OPEN, before)
    assert not decision.promoted
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


# -- the strict preset's aggregator ------------------------------------------------------------
def test_strict_preset_merges_with_a_trimmed_mean() -> None:
    # five updates in one direction; one is much longer along it (passes strict's 2x-median norm
    # bound only because the bound is generous here) and the coordinate-wise trim must drop it
    scales = [1.0, 1.1, 0.9, 1.05, 1.9]
    deltas = [0.01 * s * DIRECTION for s in scales]
    policy = replace(PRESETS["strict"], candidate_margin=np.inf, promotion_margin=np.inf)
    decision = _judge([_sub(i, d) for i, d in enumerate(deltas)], policy)
    assert len(decision.accepted) == 5
    ordered = np.sort(np.stack(deltas), axis=0)
    trimmed = ordered[1:4].mean(axis=0)  # 20 % of 5: one dropped at each end, per coordinate
    np.testing.assert_allclose(_merged_delta(decision), trimmed, rtol=1e-5)
    assert not np.allclose(trimmed, np.mean(deltas, axis=0), rtol=1e-3)  # the test can tell them apart


# -- small cohorts -----------------------------------------------------------------------------
def test_small_cohorts_bound_norms_relative_to_the_base() -> None:
    policy = PRESETS["balanced"]  # < 3 candidates: ‖Δ‖ ≤ 0.5 ‖base‖ and > 1e-6 ‖base‖
    base_norm = float(np.linalg.norm(flatten(TINY, BASE)))  # sqrt(8)
    unit = DIRECTION / np.linalg.norm(DIRECTION)
    large = _judge([_sub(1, 0.51 * base_norm * unit), _sub(2, 0.01 * unit)], policy)
    assert large.screens[f"sha256:{1:064x}"].reason is Reason.NORM_TOO_LARGE
    tiny = _judge([_sub(1, 0.9e-6 * base_norm * unit)], policy)
    assert tiny.screens[f"sha256:{1:064x}"].reason is Reason.FREE_RIDER
    # below three candidates the cosine check is skipped: opposite directions both pass screening
    opposite = _judge([_sub(1, 0.01 * unit), _sub(2, -0.01 * unit)], policy)
    assert all(s.reason is not Reason.OUTLIER for s in opposite.screens.values())


def test_cohorts_of_three_screen_direction_and_relative_norm() -> None:
    policy = PRESETS["balanced"]
    honest = [0.01 * DIRECTION * s for s in (1.0, 1.1, 0.9)]
    decision = _judge(
        [_sub(i, d) for i, d in enumerate(honest)] + [_sub(7, -0.01 * DIRECTION), _sub(8, 0.04 * DIRECTION)], policy
    )
    assert decision.screens[f"sha256:{7:064x}"].reason is Reason.OUTLIER
    assert decision.screens[f"sha256:{8:064x}"].reason is Reason.NORM_TOO_LARGE


# -- typed reasons and the trust book ----------------------------------------------------------
def test_strikes_follow_the_reason_type() -> None:
    assert {r for r in Reason if r.strike} == {
        Reason.BAD_SIGNATURE, Reason.WRONG_LEASE, Reason.OUT_OF_LEASE, Reason.REPLAY, Reason.UNDECODABLE,
        Reason.WRONG_SHAPE, Reason.NON_FINITE, Reason.NORM_TOO_LARGE, Reason.FREE_RIDER, Reason.OUTLIER,
    }  # fmt: skip
    book = TrustBook(max_strikes=2)
    book = book.recorded("p", False, Reason.STALE_BASE).recorded("p", False, Reason.REGRESSION)
    assert not book.quarantined("p")  # timing and bad luck are not strikes
    book = book.recorded("p", False, Reason.OUTLIER).recorded("p", True, Reason.ACCEPTED)
    book = book.recorded("p", False, Reason.NON_FINITE)
    assert not book.quarantined("p")
    struck = book.recorded("p", False, Reason.REPLAY)
    assert struck.quarantined("p") and struck.quarantine == {"p"} and not book.quarantined("p")
    assert TrustBook.from_wire(struck.to_wire()).quarantined("p")
    assert not struck.cleared("p").quarantined("p")


def test_quarantined_peers_are_rejected_unseen() -> None:
    policy = PRESETS["minimal"]
    trust = TrustBook(max_strikes=1).recorded("peer-1", False, Reason.NON_FINITE)
    decision = _judge([_sub(1, 0.01 * DIRECTION), _sub(2, 0.01 * DIRECTION)], policy, trust)
    assert decision.screens[f"sha256:{1:064x}"].reason is Reason.QUARANTINED
    assert decision.accepted == (f"sha256:{2:064x}",)


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
