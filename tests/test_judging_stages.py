"""``protocol.judging``'s stages, each on a table of small inputs, and ``judge_window``, their
composition, on fixed windows whose decisions were recorded before it was split into stages.

The model is a 4 → 3 layer (15 parameters); evaluation is a stub: a quadratic holdout loss around
``OPTIMUM``, so every number below comes from the rules alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from protocol.aggregation import flatten
from protocol.judging import (
    FRESH_TRUST,
    Merge,
    Submission,
    WindowDecision,
    admit,
    blocked_screens,
    judge_window,
    leave_one_out,
    measure_alone,
    next_trust,
    outer_step,
    screen_updates,
)
from protocol.model import Params, mlp
from protocol.outer import OuterOptimizer
from protocol.reasons import Reason
from protocol.screening import ACCEPT, PRESETS, Screen, ScreeningPolicy
from protocol.trust import TrustBook

SPEC = mlp("stages", (4, 3))
N = SPEC.num_params
_RNG = np.random.default_rng(13)  # drawn in this order: every value below is fixed
BASE: Params = {
    "dense0.kernel": _RNG.normal(size=(4, 3)).astype(np.float32),
    "dense0.bias": _RNG.normal(size=3).astype(np.float32),
}
REF_DIR = _RNG.normal(size=N)
REF_DIR /= np.linalg.norm(REF_DIR)
OPTIMUM = 0.01 * REF_DIR + 0.004 * _RNG.normal(size=N)  # where the holdout loss is lowest


def _params(delta: np.ndarray) -> Params:
    """``BASE`` + ``delta`` (15 numbers in the spec's order)."""
    vector = flatten(SPEC, BASE) + np.asarray(delta, np.float64)
    return {
        "dense0.kernel": vector[:12].reshape(4, 3).astype(np.float32),
        "dense0.bias": vector[12:].astype(np.float32),
    }


def _holdout(params: Mapping[str, np.ndarray]) -> dict[str, float]:
    """A quadratic loss around ``OPTIMUM`` (1.0 at the base), a standard error that grows with the step."""
    delta = flatten(SPEC, params) - flatten(SPEC, BASE)
    gap = delta - OPTIMUM
    return {
        "loss": 1.0 + 400.0 * float(gap @ gap - OPTIMUM @ OPTIMUM),
        "accuracy": 0.5 - float(delta.mean()),
        "loss_se": 0.001 + 0.05 * float(np.linalg.norm(delta)),
    }


def _id(index: int) -> str:
    return f"sha256:{index:064x}"


def _sub(index: int, delta: np.ndarray | None, **fields: object) -> Submission:
    """Submission ``index`` of ``peer-{index:02d}``, 1000 native examples, prechecked, unless ``fields`` say otherwise."""
    defaults: dict[str, object] = {
        "peer_id": f"peer-{index:02d}", "peer_kind": "native", "examples": 1000.0,
        "params": None if delta is None else _params(delta), "precheck": ACCEPT,
    }  # fmt: skip
    return Submission(candidate_id=_id(index), **{**defaults, **fields})  # type: ignore[arg-type]


def _noise(scale: float) -> np.ndarray:
    return scale * _RNG.normal(size=N)


_ORTHO = _RNG.normal(size=N)
_ORTHO -= (_ORTHO @ REF_DIR) * REF_DIR
_ORTHO /= np.linalg.norm(_ORTHO)  # a unit vector orthogonal to the reference's direction
_NAN = _params(0.01 * REF_DIR)
_NAN["dense0.bias"][1] = np.nan
_OPTIMUM_ACROSS = OPTIMUM - (OPTIMUM @ REF_DIR) * REF_DIR  # the optimum's part across the reference
WINDOW = [
    _sub(0, 0.01 * REF_DIR, precheck=Screen(Reason.STALE_BASE, "old")),
    _sub(1, 0.01 * REF_DIR, peer_id="q"),  # quarantined in TRUST
    _sub(2, 0.009 * REF_DIR + _noise(0.002), peer_id="twice", lease_window=4),
    _sub(3, 0.011 * REF_DIR + _noise(0.002), peer_id="twice", lease_window=4),  # its second for one lease window
    _sub(4, None),
    _sub(5, None, params=_NAN),
    _sub(6, None, params={"dense0.kernel": np.zeros((4, 3), np.float32)}),
    _sub(7, 0.010 * REF_DIR + _noise(0.002), examples=900.0),
    _sub(8, 0.012 * REF_DIR + _noise(0.002), peer_kind="browser", examples=1e6),  # capped
    _sub(9, 0.008 * REF_DIR + _noise(0.002), windows=2.0, windows_behind=1, lease_window=3),  # delayed
    _sub(10, _OPTIMUM_ACROSS - 0.3 * np.linalg.norm(_OPTIMUM_ACROSS) * REF_DIR),  # opposed, lowers the holdout loss
    _sub(11, -0.01 * REF_DIR),  # sign-flipped
    _sub(12, 0.0005 * REF_DIR),  # a free rider
    _sub(13, 0.05 * REF_DIR),  # boosted
    _sub(14, 0.025 * _ORTHO + 0.001 * REF_DIR, windows=3.0),  # orthogonal, long
    _sub(15, 0.010 * REF_DIR + _noise(0.003), examples=2000.0),
]
TRUST = (
    TrustBook(max_strikes=2)
    .recorded("q", False, Reason.NON_FINITE)
    .recorded("q", False, Reason.NON_FINITE)
    .recorded("peer-07", False, Reason.OUTLIER)
)
NESTEROV = OuterOptimizer("nesterov", 0.7, 0.9)
MOMENTUM = _noise(0.001)
REFERENCE = _params(0.01 * REF_DIR + _noise(0.001))
BASE_METRICS = {**_holdout(BASE), "update_norm": 0.008}
BLOCKED = [_sub(20, 0.03 * _ORTHO + 0.01 * REF_DIR), _sub(21, OPTIMUM), _sub(22, 0.02 * _ORTHO)]


def _window(name: str) -> WindowDecision:
    """One of the recorded windows: its submissions, policy, trust book and options."""
    balanced = PRESETS["balanced"]
    nesterov: dict[str, Any] = {"outer": NESTEROV, "momentum": MOMENTUM}
    tight = replace(balanced, candidate_margin=0.002, promotion_margin=0.0, noise_z=0.0)
    loose = replace(
        balanced, candidate_margin=0.15, promotion_margin=0.001, noise_z=0.0, anchored=False, aggregator="weighted_mean"
    )
    windows: dict[str, tuple[list[Submission], ScreeningPolicy, TrustBook, dict[str, Any]]] = {
        "anchored": (WINDOW, balanced, TRUST, {"reference": REFERENCE, "salt": b"salt", **nesterov}),
        "anchored-strict": (WINDOW[::-1], PRESETS["strict"], TRUST, {"reference": REFERENCE, "salt": b"s2"}),
        "anchored-tight": (WINDOW, tight, TRUST, {"reference": REFERENCE, "salt": b"t", **nesterov}),
        "cohort": (WINDOW, balanced, TRUST, {"salt": b"salt", **nesterov}),
        "blocked": (BLOCKED, loose, TRUST, nesterov),
        "minimal": (WINDOW, PRESETS["minimal"], FRESH_TRUST, {"reference": REFERENCE}),
        "fltrust": (WINDOW, PRESETS["fltrust"], FRESH_TRUST, {"reference": REFERENCE, "salt": b"f"}),
        "empty": (WINDOW[:2], balanced, TRUST, {"reference": REFERENCE, "momentum": MOMENTUM}),
    }
    submissions, policy, trust, options = windows[name]
    # the windows were recorded taking the whole step (decision 0028), before copies were rejected
    # (``protocol.near_duplicates``: in 15 numbers, several of these updates are copies of one another)
    whole = replace(policy, step_shares=(1.0,), rejects_copies=False)
    return judge_window(SPEC, BASE, BASE_METRICS, submissions, whole, _holdout, trust, **options)


_A = "stale_base quarantined accepted replay undecodable non_finite wrong_shape accepted accepted accepted"
# Recorded from ``judge_window`` before it was split into stages (commit 2bf763c): the screens in
# content-id order, the accepted submissions, and (the merged update's sum and norm, the merged loss,
# the outer state's norm, update_norm, the sums of the marginal losses, of the reference cosines, of
# the candidates' losses alone and of the next book's strikes).
RECORDED = [
    ("anchored", f"{_A} accepted untrusted_direction free_rider norm_too_large accepted accepted", (2, 7, 8, 9, 10, 14, 15),
     (0.015391089022159576, 0.009126266811447842, 1.0031650201290212, 0.0076626562902389495, 0.012050305612535428,
      -0.010295555739730622, 3.7692249869841303, 7.3677042393794325, 9.2)),
    ("anchored-strict", f"{_A} accepted untrusted_direction free_rider norm_too_large accepted accepted", (2, 7, 8, 9, 10, 14, 15),
     (0.01216217502951622, 0.0063208164731206875, 0.9839537147792774, None, 0.012050305612535428,
      -0.010295555739730622, 3.7692249869841303, 7.3677042393794325, 9.2)),
    ("cohort", f"{_A} outlier outlier free_rider norm_too_large outlier accepted", (2, 7, 8, 9, 15),
     (0.015538912266492844, 0.0136671227808744, 1.0277237916976723, 0.010683121796717859, 0.011412944654731033,
      -0.0153005151733413, 0, 5.100002058059485, 11.7)),
    ("blocked", "regression outlier merge_blocked", (),
     (None, None, 1.5408408612635698, None, 0.008, -0.03999972567817145, 0, 2.625903964294328, 4.5)),
    ("minimal", "stale_base accepted accepted replay undecodable non_finite wrong_shape" + " accepted" * 9,
     (1, 2, 7, 8, 9, 10, 11, 12, 13, 14, 15),
     (0.0145539790391922, 0.010585971895484103, 0.9844289862716241, None, 0.011412944654731033, 0, 0,
      12.225555349167553, 4.0)),
    ("fltrust", "stale_base accepted accepted replay undecodable non_finite wrong_shape accepted accepted accepted"
     " untrusted_direction untrusted_direction free_rider norm_too_large accepted accepted", (1, 2, 7, 8, 9, 14, 15),
     (0.01007281243801117, 0.008506226585296811, 0.9813677109209111, None, 0.011412944654731033,
      -0.012812491695748385, 4.666203686666167, 7.396947723038969, 7.0)),
    ("anchored-tight", f"{_A} accepted untrusted_direction free_rider norm_too_large regression regression", (2, 7, 8, 9, 10),
     (0.0129312165081501, 0.008076527192665803, 0.9816817802336038, 0.006606533627385155, 0.011412944654731033,
      -0.010295555739730622, 3.7692249869841303, 7.3677042393794325, 10.2)),
    ("empty", "stale_base quarantined", (), (None, None, None, 0.005426984403637304, 0.008, 0, 0, 0, 2.8)),
]  # fmt: skip


@pytest.mark.parametrize(("preset", "credited"), [("balanced", (7,)), ("minimal", (7, 8, 9, 10))])
def test_judge_window_credits_accepted_work_only_with_evidence_it_trained_on_its_lease(
    preset: str, credited: tuple[int, ...]
) -> None:
    """Near chance (the base's loss is above half of ln 3) acceptance asks for no lease evidence, but
    credit does: only z ≥ 3 earns it; ``minimal`` asks for none and credits as claimed."""
    apart = 0.002 * np.eye(N)[:4]  # four updates along the reference, none a copy of another
    window = [
        _sub(7, _ALONG + apart[0], lease_evidence_z=3.5),
        _sub(8, _ALONG + apart[1], lease_evidence_z=2.5),  # accepted, not credited
        _sub(9, _ALONG + apart[2], lease_evidence_z=-1.0),  # a free rider near chance: accepted, not credited
        _sub(10, _ALONG + apart[3]),  # not measured: not credited
    ]
    decision = judge_window(SPEC, BASE, BASE_METRICS, window, PRESETS[preset], _holdout, reference=REFERENCE)
    assert decision.accepted == tuple(_id(i) for i in (7, 8, 9, 10))
    assert decision.credited == tuple(_id(i) for i in credited)
    assert decision.lease_evidence == {_id(7): 3.5, _id(8): 2.5, _id(9): -1.0}
    assert set(decision.trust.strikes.values()) == {0.0}  # nothing refused


@pytest.mark.parametrize(("name", "reasons", "accepted", "numbers"), RECORDED, ids=[row[0] for row in RECORDED])
def test_judge_window_decides_as_it_did_before_it_was_split_into_stages(
    name: str, reasons: str, accepted: tuple[int, ...], numbers: tuple[float | None, ...]
) -> None:
    decision = _window(name)
    assert " ".join(decision.screens[k].reason.value for k in sorted(decision.screens)) == reasons
    assert decision.accepted == tuple(_id(i) for i in accepted)
    delta = None if decision.merged is None else flatten(SPEC, decision.merged) - flatten(SPEC, BASE)
    found = (
        None if delta is None else float(delta.sum()),
        None if delta is None else float(np.linalg.norm(delta)),
        None if decision.merged_metrics is None else decision.merged_metrics["loss"],
        None if decision.outer_state is None else float(np.linalg.norm(decision.outer_state)),
        decision.update_norm,
        sum(decision.marginal_losses.values()),
        sum(decision.reference_cosines.values()),
        sum(m["loss"] for m in decision.candidate_metrics.values()),
        sum(decision.trust.strikes.values()),
    )
    assert [x is None for x in found] == [x is None for x in numbers]
    assert [x for x in found if x is not None] == pytest.approx([x for x in numbers if x is not None], rel=1e-12)


# -- the stages, each on its own table ---------------------------------------------------------
_ALONG = 0.01 * REF_DIR  # the reference's update below, exactly
_REFERENCE_ALONG = _params(_ALONG)
_STALE = Screen(Reason.STALE_BASE, "old")
_BASE_NORM = float(np.linalg.norm(flatten(SPEC, BASE)))


@pytest.mark.parametrize(
    ("submissions", "reasons", "admitted"),
    [
        ([_sub(0, _ALONG, precheck=_STALE)], ["stale_base"], []),  # its precheck stands
        ([_sub(1, _ALONG, peer_id="q")], ["quarantined"], []),  # rejected unseen
        ([_sub(1, None, peer_id="q")], ["quarantined"], []),  # before anything is looked at
        ([_sub(2, _ALONG, peer_id="p", lease_window=4), _sub(3, _ALONG, peer_id="p", lease_window=4)],
         ["accepted", "replay"], [2]),  # one candidate per peer and lease window
        ([_sub(2, _ALONG, peer_id="p", lease_window=3), _sub(3, _ALONG, peer_id="p", lease_window=4)],
         ["accepted", "accepted"], [2, 3]),  # a delayed update beside its peer's current one
        ([_sub(2, None, peer_id="p"), _sub(3, _ALONG, peer_id="p")],
         ["undecodable", "accepted"], [3]),  # a rejected candidate takes no slot
        ([_sub(5, None, params=_NAN)], ["non_finite"], []),
        ([_sub(6, None, params={"dense0.kernel": np.zeros((4, 3), np.float32)})], ["wrong_shape"], []),
        ([_sub(7, _ALONG, lease_evidence_z=4.0), _sub(8, _ALONG, lease_evidence_z=0.5), _sub(9, _ALONG)],
         ["accepted", "no_lease_evidence", "accepted"], [7, 9]),  # no evidence it trained on its lease; None: not measured
        ([_sub(5, None, params=_NAN, lease_evidence_z=0.0)], ["non_finite"], []),  # schema first
    ],
)  # fmt: skip
def test_admit(submissions: list[Submission], reasons: list[str], admitted: list[int]) -> None:
    screens, passed = admit(SPEC, submissions, TRUST)
    assert [screens[s.candidate_id].reason.value for s in submissions] == reasons
    assert [s.candidate_id for s in passed] == [_id(i) for i in admitted]


@pytest.mark.parametrize(
    ("head_loss", "reason"), [(None, "no_lease_evidence"), (0.3, "no_lease_evidence"), (2.3, "accepted")]
)
def test_admit_screens_lease_evidence_once_the_head_has_learned(head_loss: float | None, reason: str) -> None:
    sub = _sub(1, _ALONG, lease_evidence_z=0.5)
    screens, _ = admit(SPEC, [sub], TRUST, PRESETS["balanced"], head_loss)
    assert screens[sub.candidate_id].reason.value == reason


@pytest.mark.parametrize(
    ("delta", "windows", "lineage_step", "reason", "cosine"),
    [
        (_ALONG, 1.0, None, "accepted", 1.0),
        (0.01 * (_ORTHO - 0.05 * REF_DIR), 1.0, None, "accepted", -0.05),  # no information: the trust floor (0004)
        (0.01 * (_ORTHO - 0.5 * REF_DIR), 1.0, None, "untrusted_direction", -0.447),  # clearly opposed
        (3.5 * _ALONG, 1.0, None, "norm_too_large", 1.0),  # > 3 × ‖Δ_ref‖
        (3.5 * _ALONG, 2.0, None, "accepted", 1.0),  # two declared windows: ≤ 6 × (0008)
        (0.09 * _ALONG, 1.0, None, "free_rider", 1.0),  # ≤ 0.1 × ‖Δ_ref‖
        (0.09 * _ALONG, 1.0, 0.005, "accepted", 1.0),  # > 0.1 × the lineage's smaller step (0013)
        (0.09 * _ALONG, 1.0, 1.0, "free_rider", 1.0),  # a larger step does not raise the bound
    ],
)
def test_screen_updates_against_the_reference(
    delta: np.ndarray, windows: float, lineage_step: float | None, reason: str, cosine: float
) -> None:
    sub = _sub(1, delta, windows=windows)
    policy = PRESETS["balanced"]
    screens, cosines = screen_updates(SPEC, BASE, [sub], policy, _REFERENCE_ALONG, lineage_step)
    assert [s.reason.value for s in screens] == [reason]
    assert cosines == {sub.candidate_id: pytest.approx(cosine, abs=1e-3)}


@pytest.mark.parametrize(
    ("deltas", "reasons"),
    [
        ([_ALONG, -_ALONG], ["accepted", "accepted"]),  # fewer than 3: no direction is checked
        ([_ALONG, 0.6 * _BASE_NORM * REF_DIR], ["accepted", "norm_too_large"]),  # > 0.5 × ‖base‖
        ([_ALONG, 1.1 * _ALONG, 0.9 * _ALONG, -_ALONG], ["accepted", "accepted", "accepted", "outlier"]),
        ([_ALONG, 1.1 * _ALONG, 0.9 * _ALONG, 4 * _ALONG], ["accepted", "accepted", "accepted", "norm_too_large"]),
        ([_ALONG, 1.1 * _ALONG, 0.9 * _ALONG, 0.05 * _ALONG], ["accepted", "accepted", "accepted", "free_rider"]),
    ],
)
def test_screen_updates_against_the_cohort(deltas: list[np.ndarray], reasons: list[str]) -> None:
    subs = [_sub(i, delta) for i, delta in enumerate(deltas)]
    screens, cosines = screen_updates(SPEC, BASE, subs, PRESETS["balanced"], None, 0.002)
    assert [s.reason.value for s in screens] == reasons and cosines == {}


def test_screen_updates_refuses_a_reference_of_another_model() -> None:
    with pytest.raises(ValueError, match="not usable"):
        screen_updates(SPEC, BASE, [], PRESETS["balanced"], {"dense0.kernel": np.zeros((2, 2), np.float32)}, None)


_UNTRUSTED = Screen(Reason.UNTRUSTED_DIRECTION, "cosine -0.300")


@pytest.mark.parametrize(
    ("screen", "delta", "overrides", "reason", "measured", "evaluations"),
    [
        (ACCEPT, _ALONG, True, "accepted", True, 1),
        (_UNTRUSTED, OPTIMUM, True, "accepted", True, 1),  # lowers the holdout loss: passes (0007), measured once
        (_UNTRUSTED, -OPTIMUM, True, "untrusted_direction", False, 1),  # raises it: stays out
        (_UNTRUSTED, OPTIMUM, False, "untrusted_direction", False, 0),  # FLTrust as published: no override
        (Screen(Reason.NORM_TOO_LARGE), OPTIMUM, True, "norm_too_large", False, 0),  # only a direction is measured
    ],
)
def test_measure_alone(
    screen: Screen, delta: np.ndarray, overrides: bool, reason: str, measured: bool, evaluations: int
) -> None:
    seen: list[Mapping[str, np.ndarray]] = []

    def holdout(params: Mapping[str, np.ndarray]) -> dict[str, float]:
        seen.append(params)
        return _holdout(params)

    policy = replace(PRESETS["balanced"], holdout_overrides_direction=overrides)
    sub = _sub(1, delta)
    screens, metrics = measure_alone([sub], [screen], policy, holdout, BASE_METRICS)
    assert [s.reason.value for s in screens] == [reason] and len(seen) == evaluations
    assert metrics == ({sub.candidate_id: _holdout(sub.params)} if measured else {})  # type: ignore[arg-type]
    if reason == "untrusted_direction" and overrides:
        assert screens[0].detail.startswith("cosine -0.300, and alone it does not lower the holdout loss")


def _total_offset(params: Mapping[str, np.ndarray]) -> dict[str, float]:
    """A holdout loss of 1 + the sum of the update's coordinates: a merge's loss is computable by hand."""
    return {"loss": 1.0 + float((flatten(SPEC, params) - flatten(SPEC, BASE)).sum()), "accuracy": 0.5}


def _spread(total: float) -> np.ndarray:
    """An update whose coordinates sum to ``total``."""
    return np.full(N, total / N)


def _merge(subs: list[Submission], rule: str = "weighted_mean") -> Merge:
    return Merge(SPEC, BASE, subs, PRESETS["balanced"], rule, b"", None)


@pytest.mark.parametrize(
    ("totals", "margin", "marginal", "regressions"),
    [
        ([0.2, 0.01], 0.03, [0.095, -0.095], [0]),  # with both 0.105, without the first 0.01
        ([0.2, 0.01], 0.1, [0.095, -0.095], []),  # within a wider margin
        ([0.05], 0.03, [0.05], [0]),  # a lone candidate against not merging (the base's loss, 1.0)
        ([0.02], 0.03, [0.02], []),
        ([0.2, 0.01], np.inf, None, []),  # no leave-one-out check at all
        ([], 0.03, None, []),
    ],
)
def test_leave_one_out(
    totals: list[float], margin: float, marginal: list[float] | None, regressions: list[int]
) -> None:
    trusted = [_sub(i, _spread(total)) for i, total in enumerate(totals)]
    policy = replace(PRESETS["balanced"], candidate_margin=margin)
    found, rejected = leave_one_out(_merge(trusted), trusted, policy, _total_offset, {"loss": 1.0})
    expected = {} if marginal is None else {_id(i): pytest.approx(m, abs=1e-5) for i, m in enumerate(marginal)}
    assert found == expected
    assert {k: s.reason for k, s in rejected.items()} == {_id(i): Reason.REGRESSION for i in regressions}


@pytest.mark.parametrize(
    ("update", "marginal", "measured", "reasons"),
    [
        (4 * OPTIMUM, 1.0 - 400 * OPTIMUM @ OPTIMUM - 1.0, 3, []),  # a quarter of it lands on the optimum
        (0.5 * OPTIMUM, -300 * OPTIMUM @ OPTIMUM, 1, []),  # the whole step helps: measured once
        (-2 * OPTIMUM, 3200 * OPTIMUM @ OPTIMUM, 3, [0]),  # harmful at every length: its whole step's harm
    ],
)
def test_a_lone_candidate_whose_whole_step_overshoots_is_judged_at_its_best_share(
    update: np.ndarray, marginal: float, measured: int, reasons: list[int]
) -> None:
    """A lone candidate's direction decides (decision 0044): one that lowers the holdout loss at a share
    of its step is no regression though its whole step overshoots; one that raises it at every share
    is, by what its whole step costs. ``measured``: the holdout evaluations of its probe."""
    trusted = [_sub(0, update)]
    evaluations: list[int] = []

    def holdout(params: Mapping[str, np.ndarray]) -> dict[str, float]:
        evaluations.append(1)
        return _holdout(params)

    found, rejected = leave_one_out(_merge(trusted), trusted, PRESETS["balanced"], holdout, BASE_METRICS)
    assert found == {_id(0): pytest.approx(marginal, abs=1e-4)}
    assert {k: s.reason for k, s in rejected.items()} == {_id(i): Reason.REGRESSION for i in reasons}
    assert len(evaluations) == measured


_MOMENTUM = np.full(N, 0.01)


@pytest.mark.parametrize(
    ("outer", "momentum", "rows", "step", "state"),
    [
        (OuterOptimizer(), None, [0, 1], _spread(0.15), None),  # FedAvg: the weighted mean as it is
        (OuterOptimizer(), None, [1], _spread(0.1), None),  # over the given rows only
        (NESTEROV, None, [0, 1], 0.7 * 1.9 * _spread(0.15), -_spread(0.15)),  # θ = base + η(1 + μ)Δ, m = −Δ
        (NESTEROV, _MOMENTUM, [0, 1], 0.7 * (1.9 * _spread(0.15) - 0.81 * _MOMENTUM), 0.9 * _MOMENTUM - _spread(0.15)),
    ],
)
def test_outer_step(
    outer: OuterOptimizer, momentum: np.ndarray | None, rows: list[int], step: np.ndarray, state: np.ndarray | None
) -> None:
    merge = _merge([_sub(0, _spread(0.2)), _sub(1, _spread(0.1))])
    merged, next_state = outer_step(merge, merge.update(rows), outer, momentum)
    np.testing.assert_allclose(flatten(SPEC, merged) - flatten(SPEC, BASE), step, atol=1e-6)
    if state is None:
        assert next_state is None
    else:
        assert next_state is not None and next_state.dtype == np.float64
        np.testing.assert_allclose(next_state, state, atol=1e-6)


@pytest.mark.parametrize(
    ("base_metrics", "merged_metrics", "marginal", "blocked"),
    [
        ({"loss": 1.0}, {"loss": 1.04}, {"a": 0.02, "b": -0.01}, {}),  # within promotion_margin 0.05
        ({"loss": 1.0}, {"loss": 1.06}, {"a": 0.02, "b": 0.01}, {"a": "regression", "b": "merge_blocked"}),
        ({"loss": 1.0}, {"loss": 1.06}, {}, {"a": "merge_blocked", "b": "merge_blocked"}),  # no leave-one-out
        ({"loss": 1.0, "loss_se": 0.02}, {"loss": 1.06, "loss_se": 0.02}, {"a": 0.02}, {}),  # within 3 σ (0013)
    ],
)
def test_blocked_screens(
    base_metrics: dict[str, float],
    merged_metrics: dict[str, float],
    marginal: dict[str, float],
    blocked: dict[str, str],
) -> None:
    accepted = [replace(_sub(i, _ALONG), candidate_id=name) for i, name in enumerate("ab")]
    # half the candidate margin (0.03) is the line between blame and no blame
    screens = blocked_screens(base_metrics, merged_metrics, accepted, marginal, PRESETS["balanced"])
    assert {k: s.reason.value for k, s in screens.items()} == blocked


@pytest.mark.parametrize(
    ("shares", "reasons", "step"),
    [
        ((1.0, 0.5, 0.25), ["accepted", "accepted"], OPTIMUM),  # a quarter of 4 × OPTIMUM: the optimum
        ((1.0,), ["merge_blocked", "merge_blocked"], None),  # the whole step alone overshoots and is blocked
        ((1.0, 0.5), ["accepted", "accepted"], 2 * OPTIMUM),  # half of it: the loss of the base, within the margin
    ],
)
def test_the_window_takes_the_share_of_its_step_of_lowest_holdout_loss(
    shares: tuple[float, ...], reasons: list[str], step: np.ndarray | None
) -> None:
    """Updates that each overshoot the holdout's optimum four times (as peers holding few classes each
    fit their own): the whole merged step raises the loss past the promotion margin, a quarter of it
    lands on the optimum (decision 0028)."""
    policy = replace(
        PRESETS["balanced"], anchored=False, aggregator="weighted_mean", promotion_margin=0.001, noise_z=0.0,
        step_shares=shares, rejects_copies=False,
    )  # fmt: skip
    window = [_sub(30, 4 * OPTIMUM), _sub(31, 4 * OPTIMUM + _noise(1e-4))]  # alike: copies, were they judged so
    decision = judge_window(SPEC, BASE, BASE_METRICS, window, policy, _holdout)
    assert [decision.screens[s.candidate_id].reason.value for s in window] == reasons
    if step is None:
        assert decision.merged is None
    else:
        assert decision.merged is not None and decision.merged_metrics is not None
        np.testing.assert_allclose(flatten(SPEC, decision.merged) - flatten(SPEC, BASE), step, atol=1e-4)
        assert decision.merged_metrics == _holdout(decision.merged)


@pytest.mark.parametrize(("overshoot", "shares_measured"), [(1.0, 2), (2.0, 3), (4.0, 3)])
def test_the_share_search_stops_at_the_first_shorter_share_that_is_no_better(
    overshoot: float, shares_measured: int
) -> None:
    """Updates ``overshoot`` × the holdout's optimum. At 1 the whole step is best: ½ is measured, no
    better, and ¼ is not measured; at 2, ½ is best (¼ measured, no better); at 4, ¼ (every share
    better than the one before). Each window lands on the optimum, as a search of every share would."""
    policy = replace(
        PRESETS["balanced"], anchored=False, aggregator="weighted_mean", promotion_margin=0.001, noise_z=0.0,
        rejects_copies=False,
    )  # fmt: skip
    window = [_sub(30, overshoot * OPTIMUM), _sub(31, overshoot * OPTIMUM + _noise(1e-4))]
    steps: list[float] = []  # the norm of each measured step from the base

    def holdout(params: Mapping[str, np.ndarray]) -> dict[str, float]:
        steps.append(float(np.linalg.norm(flatten(SPEC, params) - flatten(SPEC, BASE))))
        return _holdout(params)

    decision = judge_window(SPEC, BASE, BASE_METRICS, window, policy, holdout)
    whole_only: list[int] = []  # the evaluations of the same window measuring the whole step alone
    judge_window(SPEC, BASE, BASE_METRICS, window, replace(policy, step_shares=(1.0,)),
                 lambda params: whole_only.append(1) or _holdout(params))  # fmt: skip
    assert len(steps) == len(whole_only) - 1 + shares_measured
    searched = steps[-shares_measured:]  # after each alone and leave-one-out
    assert [step / searched[0] for step in searched] == pytest.approx([1.0, 0.5, 0.25][:shares_measured], rel=1e-4)
    each = [judge_window(SPEC, BASE, BASE_METRICS, window, replace(policy, step_shares=(share,)), _holdout)
            for share in policy.step_shares]  # fmt: skip
    best = min(each, key=lambda d: d.merged_metrics["loss"] if d.merged_metrics else np.inf)
    assert decision.merged is not None and best.merged is not None
    np.testing.assert_array_equal(flatten(SPEC, decision.merged), flatten(SPEC, best.merged))  # as every share measured
    np.testing.assert_allclose(flatten(SPEC, decision.merged) - flatten(SPEC, BASE), OPTIMUM, atol=5e-4)


@pytest.mark.parametrize(
    ("reason", "promoted", "strikes", "score"),
    [
        (Reason.ACCEPTED, True, 0.9, 0.84),  # took part: one window older; the score rises
        (Reason.ACCEPTED, False, 0.9, 0.64),  # accepted but not merged: no strike, no credit
        (Reason.MERGE_BLOCKED, False, 0.9, 0.64),
        (Reason.REGRESSION, False, 1.4, 0.64),  # a half strike
        (Reason.NON_FINITE, True, 1.9, 0.64),  # a strike, whatever became of the window
    ],
)
def test_next_trust(reason: Reason, promoted: bool, strikes: float, score: float) -> None:
    before = TrustBook().after_window([("p", False, Reason.OUTLIER)])  # 1 strike, score 0.8
    sub = _sub(1, _ALONG, peer_id="p")
    after = next_trust(before, [sub], {sub.candidate_id: Screen(reason)}, promoted)
    assert after.strikes["p"] == pytest.approx(strikes) and after.scores["p"] == pytest.approx(score)
    assert before.strikes["p"] == 1.0  # the given book is not changed
