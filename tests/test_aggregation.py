"""Merge rules against reference arithmetic, and the robust aggregators against an outlier."""

from __future__ import annotations

import numpy as np
import pytest

from protocol.aggregation import (
    AGGREGATORS,
    centered_clipping,
    coordinate_median,
    flatten,
    merge_params,
    multi_krum,
    norm_clipped_mean,
    trimmed_mean,
    unflatten,
    weighted_mean,
)
from protocol.model import MODELS, init_params

SPEC = MODELS["mnist-mlp"]


def test_fedavg_matches_the_formula_in_float64() -> None:
    base = init_params(SPEC, 0)
    candidates = [(f"sha256:{i:064x}", init_params(SPEC, i + 1), float(w)) for i, w in enumerate((1000, 3000, 500))]
    merged = merge_params(SPEC, base, candidates)
    b = flatten(SPEC, base)
    expected = b + sum(w * (flatten(SPEC, p) - b) for _, p, w in candidates) / sum(w for _, _, w in candidates)
    np.testing.assert_allclose(flatten(SPEC, merged), expected.astype(np.float32), rtol=0, atol=0)
    assert all(merged[name].dtype == np.float32 for name in SPEC.shapes)


def test_merge_is_independent_of_arrival_order_and_does_not_mutate() -> None:
    base = init_params(SPEC, 0)
    candidates = [(f"sha256:{i:064x}", init_params(SPEC, i + 1), 1.0 + i) for i in range(4)]
    before = [flatten(SPEC, p).copy() for _, p, _ in candidates]
    first = merge_params(SPEC, base, candidates)
    second = merge_params(SPEC, base, list(reversed(candidates)))
    for name in SPEC.shapes:
        assert first[name].tobytes() == second[name].tobytes()
    assert all(np.array_equal(b, flatten(SPEC, p)) for b, (_, p, _) in zip(before, candidates, strict=True))
    with pytest.raises(ValueError):
        merge_params(SPEC, base, [])


def test_unflatten_inverts_flatten() -> None:
    params = init_params(SPEC, 3)
    restored = unflatten(SPEC, flatten(SPEC, params))
    assert all(np.array_equal(restored[k], params[k]) for k in params)


@pytest.fixture
def honest_and_outlier() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    honest = 1.0 + 0.1 * rng.standard_normal((9, 50))
    outlier = -100.0 * np.ones((1, 50))
    return np.concatenate([honest, outlier]), np.ones(10)


@pytest.mark.parametrize("rule", [coordinate_median, trimmed_mean, multi_krum, centered_clipping, norm_clipped_mean])
def test_robust_rules_resist_one_large_outlier(rule, honest_and_outlier) -> None:  # type: ignore[no-untyped-def]
    deltas, weights = honest_and_outlier
    result = rule(deltas, weights)
    assert np.all(np.abs(result - 1.0) < 0.5), rule.__name__
    assert np.mean(np.abs(weighted_mean(deltas, weights) - 1.0)) > 5  # the plain mean does not


def test_every_named_aggregator_is_callable(honest_and_outlier) -> None:  # type: ignore[no-untyped-def]
    deltas, weights = honest_and_outlier
    for name, rule in AGGREGATORS.items():
        assert rule(deltas, weights).shape == (50,), name
