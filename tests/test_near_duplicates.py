"""``protocol.near_duplicates``: copies of one window's updates, found in linear time, checked against
the exact pairwise answer; and ``judging.reject_copies``, which of a group of copies it keeps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from protocol.judging import Submission, judge_window, reject_copies
from protocol.model import mlp
from protocol.near_duplicates import DUPLICATE_COSINE, Sketcher, copies
from protocol.reasons import Reason
from protocol.screening import ACCEPT, ScreeningPolicy

SIZE = 20_000


def _honest(rng: np.random.Generator, n: int, shared: float = 0.8) -> list[np.ndarray]:
    """``n`` updates with a common direction: pairwise cosine about ``shared``² / (``shared``² + 1 − ``shared``²)."""
    common = rng.standard_normal(SIZE)
    return [shared * common + np.sqrt(1 - shared**2) * rng.standard_normal(SIZE) for _ in range(n)]


def _exact(deltas: list[np.ndarray], order: list[int]) -> dict[int, int]:
    """The same rule by brute force on the full vectors: each update against every kept one before it."""
    unit = [d / np.linalg.norm(d) for d in deltas]
    kept: list[int] = []
    found: dict[int, int] = {}
    for i in order:
        match = next((j for j in sorted(kept) if unit[i] @ unit[j] >= DUPLICATE_COSINE), None)
        if match is None:
            kept.append(i)
        else:
            found[i] = match
    return found


@pytest.mark.parametrize("seed", range(5))
def test_copies_found_are_the_exact_rules_copies(seed: int) -> None:
    rng = np.random.default_rng(seed)
    honest = _honest(rng, 30)
    jittered = [honest[i] * (1 + 0.01 * rng.standard_normal(SIZE)) for i in (0, 3, 3, 7)]  # cos ≈ 0.99995
    scaled = [s * honest[11] for s in (0.25, 0.26, 0.27)]  # a Sybil's scaled copies: cos 1
    near = honest[20] + 0.08 * np.linalg.norm(honest[20]) / np.sqrt(SIZE) * rng.standard_normal(SIZE)  # cos ≈ 0.997
    apart = honest[21] + 0.2 * np.linalg.norm(honest[21]) / np.sqrt(SIZE) * rng.standard_normal(SIZE)  # cos ≈ 0.98
    deltas = [*honest, *jittered, *scaled, near, apart]
    order = [int(i) for i in rng.permutation(len(deltas))]
    found = copies(Sketcher.of(seed.to_bytes(4, "big"), SIZE), deltas, order)
    assert {i: kept for i, (kept, _) in found.items()} == _exact(deltas, order)
    assert len(found) == 4 + 3 + 1  # each original (or whichever of a group came first) kept
    assert all(cosine >= DUPLICATE_COSINE for _, cosine in found.values())


def test_honest_updates_are_nobodys_copy_and_zero_updates_are_skipped() -> None:
    rng = np.random.default_rng(9)
    honest = _honest(rng, 200, shared=0.9)  # cos ≈ 0.81: more alike than measured honest updates
    zeros = [np.zeros(SIZE), np.zeros(SIZE)]
    assert copies(Sketcher.of(b"salt", SIZE), [*honest, *zeros], list(range(202))) == {}


def test_the_sketch_depends_on_the_salt_and_checks_the_size() -> None:
    one, other = Sketcher.of(b"a", SIZE), Sketcher.of(b"b", SIZE)
    update = np.random.default_rng(1).standard_normal(SIZE)
    assert one.bands(one.sketch(update)) != other.bands(other.sketch(update))
    assert np.array_equal(one.sketch(update), Sketcher.of(b"a", SIZE).sketch(update))
    with pytest.raises(ValueError, match="numbers"):
        one.sketch(update[:-1])


SPEC = mlp("copies", (50, 40))


def _submission(index: int, delta: np.ndarray, z: float | None) -> Submission:
    params = {
        "dense0.kernel": delta[:2000].reshape(50, 40).astype(np.float32),
        "dense0.bias": delta[2000:].astype(np.float32),
    }
    return Submission(f"sha256:{index:064x}", f"peer-{index}", "native", 1000.0, params, ACCEPT, lease_evidence_z=z)


BASE = {"dense0.kernel": np.zeros((50, 40), np.float32), "dense0.bias": np.zeros(40, np.float32)}


def test_of_a_copy_and_its_original_the_one_of_more_evidence_is_judged() -> None:
    rng = np.random.default_rng(3)
    original, other = rng.standard_normal(SPEC.num_params), rng.standard_normal(SPEC.num_params)
    copy = original * (1 + 0.01 * rng.standard_normal(SPEC.num_params))
    window = [_submission(0, copy, 1.2), _submission(1, original, 5.1), _submission(2, other, 0.4)]
    screens, kept = reject_copies(SPEC, BASE, window, b"salt")
    assert [s.candidate_id for s in kept] == [window[1].candidate_id, window[2].candidate_id]
    assert screens[window[0].candidate_id].reason is Reason.NEAR_DUPLICATE
    assert window[1].candidate_id[:19] in screens[window[0].candidate_id].detail
    # a copy that drew more evidence than its original is the one judged (and then needs it)
    swapped = [_submission(0, copy, 5.5), window[1], window[2]]
    screens, kept = reject_copies(SPEC, BASE, swapped, b"salt")
    assert set(screens) == {window[1].candidate_id}


def test_unmeasured_copies_are_ordered_by_the_salted_tie_keys() -> None:
    rng = np.random.default_rng(4)
    update = rng.standard_normal(SPEC.num_params)
    window = [_submission(i, update * (1 + 0.001 * i), None) for i in range(4)]
    kept_by_salt = {reject_copies(SPEC, BASE, window, salt)[1][0].candidate_id for salt in (b"a", b"b", b"c", b"d")}
    assert all(len(reject_copies(SPEC, BASE, window, salt)[1]) == 1 for salt in (b"a", b"b"))
    assert len(kept_by_salt) > 1  # not the lowest content id every time: grinding an id buys nothing


def test_judge_window_refuses_a_copy_and_credits_its_original_once() -> None:
    rng = np.random.default_rng(5)
    first, second = rng.standard_normal(SPEC.num_params), rng.standard_normal(SPEC.num_params)
    window = [
        _submission(0, 0.01 * first, 6.0),
        _submission(1, 0.01 * second, 5.0),
        _submission(2, 0.01 * first * (1 + 0.01 * rng.standard_normal(SPEC.num_params)), 3.2),  # credit-worthy z
    ]
    open_rules = ScreeningPolicy("open", "weighted_mean", np.inf, 0.0, -np.inf, np.inf, 0.0, candidate_margin=np.inf)
    flat = lambda _: {"loss": 1.0, "accuracy": 0.5}  # noqa: E731
    decision = judge_window(SPEC, BASE, {"loss": 1.0}, window, open_rules, flat, salt=b"w")
    assert decision.screens[window[2].candidate_id].reason is Reason.NEAR_DUPLICATE
    assert decision.credited == (window[0].candidate_id, window[1].candidate_id)
    assert decision.trust.strikes == {"peer-0": 0.0, "peer-1": 0.0, "peer-2": 0.5}
    unscreened = judge_window(SPEC, BASE, {"loss": 1.0}, window, replace(open_rules, rejects_copies=False), flat)
    assert len(unscreened.credited) == 3  # the control: without the screen the copy is paid
