"""Merge rules against reference arithmetic and their published definitions; each test fails if its
rule is removed or changed (the robust rules are recomputed here from the papers, step by step)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from native_peer.models import builtin_model
from protocol.aggregation import (
    AGGREGATORS,
    AggregationContext,
    bulyan,
    centered_clipping,
    clipped,
    coordinate_median,
    flatten,
    fltrust,
    fltrust_trimmed_mean,
    krum_scores,
    merge_params,
    multi_krum,
    norm_clipped_mean,
    tie_keys,
    trimmed_mean,
    trust_scores,
    unflatten,
    weighted_mean,
)
from protocol.model import init_params

SPEC = builtin_model("mnist-mlp")


def test_fedavg_matches_the_formula_in_float64() -> None:
    base = init_params(SPEC, 0)
    candidates = [(f"sha256:{i:064x}", init_params(SPEC, i + 1), float(w)) for i, w in enumerate((1000, 3000, 500))]
    merged = merge_params(SPEC, base, candidates)
    b = flatten(SPEC, base)
    expected = b + sum(w * (flatten(SPEC, p) - b) for _, p, w in candidates) / sum(w for _, _, w in candidates)
    np.testing.assert_allclose(flatten(SPEC, merged), expected.astype(np.float32), rtol=0, atol=0)
    assert all(merged[name].dtype == np.float32 for name in SPEC.shapes)


@pytest.mark.parametrize("rule", sorted(AGGREGATORS))
def test_merge_is_independent_of_arrival_order_and_does_not_mutate(rule: str) -> None:
    base = init_params(SPEC, 0)
    candidates = [(f"sha256:{i:064x}", init_params(SPEC, i + 1), 1.0 + i) for i in range(7)]
    before = [flatten(SPEC, p).copy() for _, p, _ in candidates]
    reference = init_params(SPEC, 1)  # aligned with candidate 0, so the anchored rule has a trusted row
    first = merge_params(SPEC, base, candidates, rule, salt=b"s", reference=reference)
    second = merge_params(SPEC, base, list(reversed(candidates)), rule, salt=b"s", reference=reference)
    for name in SPEC.shapes:
        assert first[name].tobytes() == second[name].tobytes(), rule
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
    honest = 1.0 + 0.1 * rng.standard_normal((10, 50))
    outlier = -100.0 * np.ones((1, 50))
    return np.concatenate([honest, outlier]), np.ones(11)


@pytest.mark.parametrize(
    "rule",
    [
        coordinate_median,
        lambda d, w: trimmed_mean(d, w, trim=1),
        lambda d, w: multi_krum(d, w, f=1),
        lambda d, w: bulyan(d, w, f=2),
        lambda d, w: centered_clipping(d, w, tau=1.0, centre=np.zeros(50), iterations=30),
        norm_clipped_mean,
    ],
    ids=["median", "trimmed_mean", "multi_krum", "bulyan", "centered_clipping", "norm_clipped_mean"],
)
def test_robust_rules_resist_one_large_outlier(rule, honest_and_outlier) -> None:  # type: ignore[no-untyped-def]
    deltas, weights = honest_and_outlier
    result = rule(deltas, weights)
    assert np.all(np.abs(result - 1.0) < 0.5)
    assert np.mean(np.abs(weighted_mean(deltas, weights) - 1.0)) > 5  # the plain mean does not


def test_every_named_aggregator_is_callable(honest_and_outlier) -> None:  # type: ignore[no-untyped-def]
    deltas, weights = honest_and_outlier
    context = AggregationContext(tie_keys=tie_keys(b"salt", [f"id-{i}" for i in range(11)]), reference=np.ones(50))
    for name, rule in AGGREGATORS.items():
        assert rule(deltas, weights, context).shape == (50,), name


# -- Krum: ties are broken by a salted key, not by the content id a submitter can grind --------
def _krum_winner(ids: list[str], salt: bytes) -> str:
    # four rows at equal distance from each other: every Krum score is equal, the tie decides
    rows = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    chosen = multi_krum(rows, np.ones(4), f=0, m=1, keys=tie_keys(salt, ids))
    return ids[int(np.flatnonzero((rows == chosen).all(axis=1))[0])]


def test_krum_ties_follow_the_salted_key() -> None:
    ids = ["sha256:" + "0" * 64] + [f"sha256:{hashlib.sha256(bytes([i])).hexdigest()}" for i in range(3)]
    assert len(set(krum_scores(np.array([[0, 2, 2, 4], [2, 0, 4, 2], [2, 4, 0, 2], [4, 2, 2, 0]], float), 0))) == 1
    for salt in (b"a", b"b"):
        keys = tie_keys(salt, ids)
        assert _krum_winner(ids, salt) == ids[keys.index(min(keys))]
    # a submitter who ground its content id down to the lowest possible one wins only its share
    wins = sum(_krum_winner(ids, salt.to_bytes(2, "big")) == ids[0] for salt in range(64))
    assert 4 <= wins <= 30, wins  # about 16 of 64: the lowest id does not decide


def test_tie_keys_depend_on_salt_and_id_only() -> None:
    assert tie_keys(b"s", ["a", "b"]) == tie_keys(b"s", ["a", "b"])
    assert tie_keys(b"s", ["a"]) != tie_keys(b"t", ["a"])
    assert tie_keys(b"s", ["a"])[0] == hashlib.sha256(b"s\x00a").digest()


def test_the_salt_reaches_multi_krum_through_merge_params() -> None:
    """Four updates at equal distances, f = 1: multi-Krum keeps three and the salt picks the one
    dropped (the highest tie key), whatever the content ids."""
    base = {name: np.zeros(shape, np.float32) for name, shape in SPEC.shapes.items()}
    rows = [np.zeros(SPEC.num_params) for _ in range(4)]
    for row, (index, sign) in zip(rows, [(0, 1.0), (0, -1.0), (1, 1.0), (1, -1.0)], strict=True):
        row[index] = sign
    ids = [f"sha256:{i:064x}" for i in range(4)]
    candidates = [(cid, unflatten(SPEC, row), 1.0) for cid, row in zip(ids, rows, strict=True)]
    dropped = set()
    for salt in (bytes([s]) for s in range(8)):
        keys = tie_keys(salt, ids)
        out = keys.index(max(keys))
        dropped.add(out)
        expected = np.mean([r for i, r in enumerate(rows) if i != out], axis=0)
        merged = merge_params(SPEC, base, candidates, "multi_krum", salt=salt, byzantine_fraction=0.25)
        np.testing.assert_allclose(flatten(SPEC, merged)[:2], expected[:2], atol=1e-7)
    assert len(dropped) > 1


# -- Bulyan, recomputed from El Mhamdi, Guerraoui & Rouault (2018) -----------------------------
def _bulyan_by_the_paper(x: np.ndarray, f: int) -> np.ndarray:
    n = len(x)
    assert n >= 4 * f + 3
    remaining, selected = list(range(n)), []
    while len(selected) < n - 2 * f:  # θ = n − 2f rounds of Krum on what is left
        r = len(remaining)
        scores = []
        for i in remaining:
            d = sorted(float(((x[i] - x[j]) ** 2).sum()) for j in remaining if j != i)
            scores.append(sum(d[: max(r - f - 2, 1)]))
        pick = remaining[int(np.argmin(scores))]
        selected.append(pick)
        remaining.remove(pick)
    s = x[selected]
    beta = len(selected) - 2 * f  # = n − 4f
    out = np.empty(x.shape[1])
    for c in range(x.shape[1]):
        median = np.median(s[:, c])
        closest = sorted(s[:, c], key=lambda v, m=median: abs(v - m))[:beta]
        out[c] = np.mean(closest)
    return out


def test_bulyan_matches_its_definition() -> None:
    rng = np.random.default_rng(3)
    honest = rng.normal(1.0, 0.3, (8, 20))
    attackers = np.stack([honest.mean(axis=0) + 0.9, honest.mean(axis=0) - 3.0, rng.normal(5.0, 1.0, 20)])
    x = np.concatenate([honest, attackers])  # n = 11, f = 2: n >= 4f + 3
    result = bulyan(x, np.ones(11), f=2)
    np.testing.assert_allclose(result, _bulyan_by_the_paper(x, 2), rtol=1e-12)
    # the test tells Bulyan apart from its parts
    assert not np.allclose(result, multi_krum(x, np.ones(11), f=2), rtol=1e-3)
    assert not np.allclose(result, trimmed_mean(x, np.ones(11), trim=4), rtol=1e-3)
    with pytest.raises(ValueError):
        bulyan(x[:10], np.ones(10), f=2)  # 10 < 4·2 + 3
    np.testing.assert_allclose(bulyan(x[:2], np.ones(2), f=0), x[:2].mean(axis=0))  # f = 0: the mean


# -- centered clipping, as published (Karimireddy, He & Jaggi 2021) ----------------------------
def test_centered_clipping_is_the_published_iteration() -> None:
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.normal(1.0, 0.2, (6, 10)), 40.0 * np.ones((2, 10))])
    centre, tau = np.full(10, 0.5), 0.8
    v = centre.copy()
    for _ in range(3):  # v <- v + (1/n) sum_i clip_tau(x_i - v), from the given centre, fixed tau
        z = x - v
        v = v + np.mean([zi * min(1.0, tau / np.linalg.norm(zi)) for zi in z], axis=0)
    result = centered_clipping(x, np.arange(1.0, 9.0), tau=tau, centre=centre, iterations=3)
    np.testing.assert_allclose(result, v, rtol=1e-12)  # weights are not used, as published
    # the radius is fixed: starting elsewhere or adapting tau gives another answer
    assert not np.allclose(result, centered_clipping(x, np.ones(8), tau=tau, centre=np.median(x, axis=0), iterations=3))
    with pytest.raises(ValueError):
        centered_clipping(x, np.ones(8), tau=0.0, centre=centre)


# -- FLTrust (Cao et al., NDSS 2021) ------------------------------------------------------------
def test_fltrust_formula() -> None:
    reference = np.array([3.0, 4.0])  # norm 5
    deltas = np.array([[6.0, 8.0], [0.0, 10.0], [-3.0, -4.0], [4.0, -3.0]])
    np.testing.assert_allclose(trust_scores(deltas, reference), [1.0, 0.8, 0.0, 0.0])
    # a floor for the rows screening let through (near-orthogonal ones); a zero row stays at 0
    np.testing.assert_allclose(
        trust_scores(np.vstack([deltas, [[0.0, 0.0]]]), reference, 0.05), [1.0, 0.8, 0.05, 0.05, 0.0]
    )
    # each row rescaled to norm 5: [3, 4], [0, 5]; trust 1 and 0.8; the others take no part
    expected = (1.0 * np.array([3.0, 4.0]) + 0.8 * np.array([0.0, 5.0])) / 1.8
    np.testing.assert_allclose(fltrust(deltas, np.ones(4), reference=reference), expected)
    # weighted by trust x examples
    weighted = (1.0 * 2 * np.array([3.0, 4.0]) + 0.8 * 1 * np.array([0.0, 5.0])) / (2 + 0.8)
    np.testing.assert_allclose(fltrust(deltas, np.array([2.0, 1.0, 5.0, 5.0]), reference=reference), weighted)
    # a boosted copy gains nothing
    np.testing.assert_allclose(fltrust(deltas[:1] * 100, np.ones(1), reference=reference), [3.0, 4.0])


def test_fltrust_trimmed_mean_zeroes_what_only_an_attacker_touches() -> None:
    """One honest update, one attacker that also writes to coordinates nobody else touches (a
    trigger's input pixels), and the no-change vote: per coordinate the attacker's value is trimmed."""
    reference = np.array([1.0, 1.0, 1.0, 0.0, 0.0])
    honest = np.array([1.2, 0.8, 1.0, 0.0, 0.0])
    attacker = np.array([1.0, 1.0, 0.9, 0.7, 0.7])
    result = fltrust_trimmed_mean(np.stack([honest, attacker]), np.ones(2), reference=reference)
    assert result[3] == 0.0 and result[4] == 0.0
    assert fltrust(np.stack([honest, attacker]), np.ones(2), reference=reference)[3] > 0.1  # FLTrust alone leaks


def test_fltrust_trimmed_mean_clips_and_never_merges_the_reference() -> None:
    """A lone candidate is merged as it is when within ‖Δ_ref‖ (a converged trainer's small step stays
    small) and clipped to it when larger; the reference's own values never enter the result."""
    reference = np.array([3.0, 4.0])  # norm 5
    small = np.array([[0.3, 0.1]])
    np.testing.assert_allclose(fltrust_trimmed_mean(small, np.ones(1), reference=reference), small[0], rtol=1e-12)
    np.testing.assert_allclose(
        fltrust_trimmed_mean(small * 100, np.ones(1), reference=reference), [4.74341649, 1.58113883]
    )
    np.testing.assert_allclose(clipped(np.array([[6.0, 8.0], [0.0, 1.0], [0.0, 0.0]]), 5.0), [[3, 4], [0, 1], [0, 0]])
    # two updates on either side of the reference on a coordinate: the no-change vote is the median there
    pair = np.array([[1.0, 2.0], [2.0, -0.5]])
    np.testing.assert_allclose(fltrust_trimmed_mean(pair, np.ones(2), reference=reference), [1.0, 0.0])


def test_fltrust_trimmed_mean_matches_its_definition() -> None:
    rng = np.random.default_rng(5)
    reference = rng.normal(0.5, 1.0, 12)
    deltas = np.concatenate([reference + rng.normal(0, 1.0, (6, 12)), -reference[None, :]])  # the last: trust 0
    deltas[0] *= 0.1  # a small step: kept as it is
    weights = np.array([1000.0, 800.0, 1000.0, 1200.0, 1000.0, 900.0, 1000.0])
    trust = np.maximum(deltas @ reference / np.linalg.norm(deltas, axis=1) / np.linalg.norm(reference), 0)
    assert trust[-1] == 0.0 and (trust[:-1] > 0).all()
    norms = np.linalg.norm(deltas[:-1], axis=1)
    rows = deltas[:-1] * np.minimum(1.0, np.linalg.norm(reference) / norms)[:, None]
    values = np.concatenate([rows, np.zeros((1, 12))])  # the no-change vote, weight 0
    w = np.append(trust[:-1] * weights[:-1], 0.0)
    k = 1  # max(1, floor(0.2 * 7))
    expected = np.empty(12)
    for c in range(12):
        order = np.argsort(values[:, c], kind="stable")[k : len(values) - k]
        expected[c] = (values[order, c] * w[order]).sum() / w[order].sum() if w[order].sum() else 0.0
    result = fltrust_trimmed_mean(deltas, weights, reference=reference, trim_fraction=0.2)
    np.testing.assert_allclose(result, expected, rtol=1e-12)


def test_the_named_trimmed_mean_is_weighted_by_examples_and_trims_at_least_one() -> None:
    deltas = np.array([[0.0], [1.0], [2.0], [100.0]])
    weights = np.array([1.0, 3.0, 1.0, 1.0])
    result = AGGREGATORS["trimmed_mean"](deltas, weights, AggregationContext(byzantine_fraction=0.2))
    np.testing.assert_allclose(result, [(3.0 * 1.0 + 1.0 * 2.0) / 4.0])  # 0 and 100 dropped
    two = AGGREGATORS["trimmed_mean"](deltas[:2], weights[:2], AggregationContext())
    np.testing.assert_allclose(two, [0.75])  # two rows: nothing to trim, the weighted mean (FedAvg)
