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
from protocol.judging import FRESH_TRUST, Submission, WindowDecision, judge_window
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
    return judge_window(SPEC, BASE, BASE_METRICS, submissions, policy, _holdout, trust, **options)


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
