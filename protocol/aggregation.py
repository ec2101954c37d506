"""Aggregation rules: how accepted updates become one update. Pure NumPy, inputs never mutated.

Every rule works on an ``[n, d]`` float64 matrix of parameter updates (Δᵢ = θᵢ − base), the n
sample weights (examples, capped per peer kind) and returns a ``[d]`` vector. The registry
``AGGREGATORS`` gives each one the same signature ``rule(deltas, weights, context)``; the
``AggregationContext`` carries what some rules need besides the updates:

    weighted_mean          FedAvg: Σ wᵢ Δᵢ / Σ wᵢ  (exact for honest peers)
    norm_clipped_mean      each Δᵢ scaled down to at most the median norm, then weighted mean
    coordinate_median      per-coordinate median (weights ignored)
    trimmed_mean           per coordinate, the k largest and k smallest values dropped, weighted mean of
                           the rest (Yin et al. 2018 with equal weights), k = ⌊β n⌋, at least 1 once n ≥ 3
    multi_krum             weighted mean of the m = n − f updates with the lowest Krum scores
                           (Blanchard et al. 2017); ties broken by a salted key, never by the content id
    bulyan                 El Mhamdi et al. 2018: θ = n − 2f updates picked one at a time by Krum, then
                           per coordinate the mean of the β = θ − 2f = n − 4f values closest to the median
    centered_clipping      Karimireddy, He & Jaggi 2021: v ← v + (1/n) Σ clip_τ(Δᵢ − v), from a given
                           centre (the validator's reference update, else 0), fixed radius τ
    fltrust                Cao et al. 2021: trust tᵢ = ReLU(cos(Δᵢ, Δ_ref)), each Δᵢ rescaled to ‖Δ_ref‖,
                           Σ tᵢ wᵢ Δ̂ᵢ / Σ tᵢ wᵢ  (needs the reference update)
    fltrust_trimmed_mean   FLTrust's trust, each Δᵢ clipped to ‖Δ_ref‖, a no-change vote, then a
                           weighted coordinate-wise trimmed mean (the default preset's rule when a reference is given)

Inputs are ordered by content id before stacking, accumulation is float64, and every tie is broken
by ``tie_keys`` (sha256 of a validator-chosen salt and the content id), so every validator gets the
same bytes from the same candidates and salt, and a submitter cannot grind its id to win a tie.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .model import Model, Params

__all__ = [
    "AGGREGATORS",
    "NEEDS_REFERENCE",
    "AggregationContext",
    "Aggregator",
    "bulyan",
    "centered_clipping",
    "clipped",
    "coordinate_median",
    "flatten",
    "fltrust",
    "fltrust_trimmed_mean",
    "krum_scores",
    "merge_params",
    "multi_krum",
    "norm_clipped_mean",
    "rescaled",
    "tie_keys",
    "trimmed_mean",
    "trust_scores",
    "unflatten",
    "weighted_mean",
]

Vector = npt.NDArray[np.float64]


@dataclass(frozen=True)
class AggregationContext:
    """What a rule may use besides the updates and weights.

    ``tie_keys``: one per row, ties are broken by the lowest key (``tie_keys(salt, ids)``; empty:
    row order). ``reference``: the validator's own update Δ_ref (``None`` when it has none).
    ``byzantine_fraction``: the share of rows a rule must tolerate (f = ⌊β n⌋ for Krum and Bulyan,
    the trim of the trimmed means). ``clip_radius``: centered clipping's τ in units of ‖Δ_ref‖;
    ``clip_tau``: its τ in parameter units when there is no reference. ``clip_scales``: per row, the
    factor on ‖Δ_ref‖ that ``fltrust_trimmed_mean`` clips it to (empty: 1 for every row).
    ``trust_floor``: the least trust it gives a row screening let through (0: FLTrust's ReLU)."""

    tie_keys: tuple[bytes, ...] = ()
    reference: Vector | None = None
    byzantine_fraction: float = 0.2
    clip_radius: float = 1.0
    clip_tau: float = 1.0
    trust_floor: float = 0.0
    clip_scales: tuple[float, ...] = ()


Aggregator = Callable[[Vector, Vector, AggregationContext], Vector]


def flatten(spec: Model, params: Mapping[str, np.ndarray]) -> Vector:
    """All parameters as one float64 vector, in the spec's name order."""
    return np.concatenate([np.asarray(params[name], np.float64).ravel() for name in spec.shapes])


def unflatten(spec: Model, vector: Vector) -> Params:
    params: Params = {}
    offset = 0
    for name, shape in spec.shapes.items():
        size = int(np.prod(shape))
        params[name] = vector[offset : offset + size].reshape(shape).astype(np.float32)
        offset += size
    return params


def tie_keys(salt: bytes, ids: Sequence[str]) -> tuple[bytes, ...]:
    """Per id, sha256(salt ‖ 0 ‖ id): the order ties are broken in. Unknown to a submitter as long
    as the salt is, so grinding content ids cannot buy a tie."""
    return tuple(hashlib.sha256(salt + b"\x00" + i.encode()).digest() for i in ids)


def _ranks(keys: Sequence[bytes], n: int) -> npt.NDArray[np.int64]:
    """Each row's position in the tie order (0 first); row order when no keys are given."""
    if not keys:
        return np.arange(n, dtype=np.int64)
    if len(keys) != n:
        raise ValueError(f"{len(keys)} tie keys for {n} rows")
    ranks = np.empty(n, np.int64)
    ranks[sorted(range(n), key=lambda i: keys[i])] = np.arange(n)
    return ranks


# -- plain rules -------------------------------------------------------------------------------
def weighted_mean(deltas: Vector, weights: Vector) -> Vector:
    w = np.asarray(weights, np.float64)
    return np.asarray((w[:, None] * deltas).sum(axis=0) / w.sum())


def norm_clipped_mean(deltas: Vector, weights: Vector) -> Vector:
    norms = np.linalg.norm(deltas, axis=1)
    bound = float(np.median(norms))
    scale = np.minimum(1.0, bound / np.maximum(norms, 1e-12))
    return weighted_mean(deltas * scale[:, None], weights)


def coordinate_median(deltas: Vector, weights: Vector) -> Vector:
    return np.asarray(np.median(deltas, axis=0))


def _trim_count(n: int, fraction: float) -> int:
    """How many values to drop at each end: ⌊fraction · n⌋, at least one once n ≥ 3 (unless
    ``fraction`` is 0), always < n/2."""
    if n < 3 or fraction <= 0:
        return 0
    return min(max(int(n * fraction), 1), (n - 1) // 2)


def _sorted_columns(values: Vector, ranks: npt.NDArray[np.int64]) -> tuple[Vector, npt.NDArray[np.intp]]:
    """Each column sorted (ties in value by rank), and the row each sorted entry came from."""
    order = np.lexsort((np.broadcast_to(ranks[:, None], values.shape), values), axis=0)
    return np.take_along_axis(values, order, axis=0), order


def trimmed_mean(deltas: Vector, weights: Vector, *, trim: int, ranks: npt.NDArray[np.int64] | None = None) -> Vector:
    """Per coordinate, drop the ``trim`` smallest and ``trim`` largest values; weighted mean of the
    rest (``weights`` all equal: the unweighted trimmed mean of Yin et al. 2018; where every kept
    value weighs 0, their plain mean)."""
    n = len(deltas)
    if not 0 <= 2 * trim < n:
        raise ValueError(f"cannot trim {trim} from each end of {n} values")
    ranks = np.arange(n, dtype=np.int64) if ranks is None else ranks
    values, order = _sorted_columns(deltas, ranks)
    w = np.asarray(weights, np.float64)[order]
    kept, kept_w = values[trim : n - trim], w[trim : n - trim]
    total = kept_w.sum(axis=0)
    weighted = (kept * kept_w).sum(axis=0) / np.where(total > 0, total, 1.0)
    return np.asarray(np.where(total > 0, weighted, kept.mean(axis=0)))


# -- Krum, multi-Krum, Bulyan ------------------------------------------------------------------
def _squared_distances(deltas: Vector) -> Vector:
    sq = (deltas**2).sum(axis=1)
    return np.asarray(np.maximum(sq[:, None] + sq[None, :] - 2 * deltas @ deltas.T, 0.0))


def krum_scores(distances: Vector, f: int) -> Vector:
    """Krum's score of each row: the sum of squared distances to its n − f − 2 nearest others
    (at least one), from a matrix of pairwise squared distances."""
    n = len(distances)
    neighbours = min(max(n - f - 2, 1), n - 1)
    others = np.sort(distances + np.diag(np.full(n, np.inf)), axis=1)
    return np.asarray(others[:, :neighbours].sum(axis=1))


def _lowest(scores: Vector, ranks: npt.NDArray[np.int64], count: int) -> list[int]:
    """The ``count`` rows with the lowest score; equal scores by tie rank."""
    return sorted(range(len(scores)), key=lambda i: (float(scores[i]), int(ranks[i])))[:count]


def multi_krum(deltas: Vector, weights: Vector, *, f: int, m: int | None = None, keys: Sequence[bytes] = ()) -> Vector:
    """Weighted mean of the ``m`` rows (default n − f) with the lowest Krum scores; ``m = 1`` is Krum."""
    n = len(deltas)
    if n <= 2:
        return weighted_mean(deltas, weights)
    keep = _lowest(krum_scores(_squared_distances(deltas), f), _ranks(keys, n), n - f if m is None else m)
    return weighted_mean(deltas[keep], np.asarray(weights, np.float64)[keep])


def bulyan(deltas: Vector, weights: Vector, *, f: int, keys: Sequence[bytes] = ()) -> Vector:
    """Bulyan over Krum (El Mhamdi, Guerraoui & Rouault 2018), for n ≥ 4f + 3 (f = 0: any n).

    Selection: θ = n − 2f times, run Krum on the rows not yet selected and move its choice into the
    selection. Aggregation: per coordinate, the mean of the β = θ − 2f values closest to the
    coordinate's median over the selection (weights are not used, as published)."""
    n = len(deltas)
    if n < 1 or (f > 0 and n < 4 * f + 3):
        raise ValueError(f"Bulyan needs n >= 4f + 3, got n={n}, f={f}")  # f = 0: the mean of any n
    ranks = _ranks(keys, n)
    distances = _squared_distances(deltas)
    remaining, selected = list(range(n)), []
    for _ in range(n - 2 * f):
        sub = np.asarray(remaining)
        scores = krum_scores(distances[np.ix_(sub, sub)], f) if len(sub) > 1 else np.zeros(1)
        choice = remaining[_lowest(scores, ranks[sub], 1)[0]]
        selected.append(choice)
        remaining.remove(choice)
    chosen = deltas[selected]
    beta = len(selected) - 2 * f
    median = np.median(chosen, axis=0)
    distance = np.abs(chosen - median)
    order = np.lexsort((np.broadcast_to(ranks[selected][:, None], chosen.shape), distance), axis=0)
    closest = np.take_along_axis(chosen, order[:beta], axis=0)
    return np.asarray(closest.mean(axis=0))


# -- centered clipping -------------------------------------------------------------------------
def centered_clipping(deltas: Vector, weights: Vector, *, tau: float, centre: Vector, iterations: int = 1) -> Vector:
    """Centered clipping (Karimireddy, He & Jaggi, ICML 2021), as published:

        v ← v + (1/n) Σᵢ clip_τ(Δᵢ − v),   clip_τ(z) = z · min(1, τ / ‖z‖),

    ``iterations`` times from ``centre`` (the paper's previous momentum; here the validator's
    reference update, or 0), with a fixed radius ``tau`` (not adapted to the cohort); weights are
    not used, as published."""
    if tau <= 0:
        raise ValueError("centered clipping needs a positive radius")
    v = np.asarray(centre, np.float64).copy()
    for _ in range(iterations):
        offsets = deltas - v
        norms = np.linalg.norm(offsets, axis=1)
        scale = np.minimum(1.0, tau / np.maximum(norms, 1e-300))
        v = v + (offsets * scale[:, None]).sum(axis=0) / len(deltas)
    return v


# -- FLTrust and the anchored trimmed mean -----------------------------------------------------
def trust_scores(deltas: Vector, reference: Vector, floor: float = 0.0) -> Vector:
    """FLTrust's trust score of each row: ReLU(cos(Δᵢ, Δ_ref)), at least ``floor`` (0 for a zero row)."""
    ref_norm = float(np.linalg.norm(reference))
    norms = np.linalg.norm(deltas, axis=1)
    if ref_norm == 0.0:
        raise ValueError("the reference update is zero")
    cosines = (deltas @ reference) / np.maximum(norms * ref_norm, 1e-300)
    return np.asarray(np.where(norms > 0, np.maximum(cosines, floor), 0.0))


def rescaled(deltas: Vector, reference: Vector) -> Vector:
    """Each row scaled to ‖Δ_ref‖ (zero rows stay zero)."""
    norms = np.linalg.norm(deltas, axis=1)
    scale = np.where(norms > 0, float(np.linalg.norm(reference)) / np.maximum(norms, 1e-300), 0.0)
    return np.asarray(deltas * scale[:, None])


def fltrust(deltas: Vector, weights: Vector, *, reference: Vector) -> Vector:
    """FLTrust (Cao, Fang, Liu & Gong, NDSS 2021), weighted by examples:

        tᵢ = ReLU(cos(Δᵢ, Δ_ref)),   Δ̂ᵢ = Δᵢ · ‖Δ_ref‖ / ‖Δᵢ‖,   result = Σ tᵢ wᵢ Δ̂ᵢ / Σ tᵢ wᵢ

    (equal weights: the published rule). Zero when no row is trusted."""
    trust = trust_scores(deltas, reference) * np.asarray(weights, np.float64)
    if trust.sum() == 0:
        return np.zeros_like(reference)
    return np.asarray((trust[:, None] * rescaled(deltas, reference)).sum(axis=0) / trust.sum())


def clipped(deltas: Vector, radius: float | Vector) -> Vector:
    """Each row scaled down to norm at most ``radius`` (one for all rows, or one per row; never up,
    zero rows stay zero)."""
    norms = np.linalg.norm(deltas, axis=1)
    scale = np.minimum(1.0, np.asarray(radius, np.float64) / np.maximum(norms, 1e-300))
    return np.asarray(deltas * scale[:, None])


def fltrust_trimmed_mean(
    deltas: Vector,
    weights: Vector,
    *,
    reference: Vector,
    trim_fraction: float = 0.2,
    ranks: npt.NDArray[np.int64] | None = None,
    trust_floor: float = 0.0,
    clip_scales: Vector | None = None,
) -> Vector:
    """The default preset's rule when the validator has a reference update Δ_ref:

    1. trust tᵢ = max(ReLU(cos(Δᵢ, Δ_ref)), ``trust_floor``); untrusted rows (tᵢ = 0) take no part.
       The floor is for rows screening let through although their cosine is near zero (near
       convergence honest updates are nearly orthogonal to any reference: their trust carries no
       information, and a floor keeps them from being ignored all together);
    2. each trusted Δᵢ is clipped to ‖Δ_ref‖ × ``clip_scales``ᵢ (default 1; validators pass √ of the
       windows of steps a candidate declares, ``protocol.screening.counted_windows``) (``clipped``: a
       boosted update gains nothing, and a converged trainer's small step stays small: the step size
       follows the trainers, FLTrust's rescaling up to ‖Δ_ref‖ made it the fresh-optimizer reference's);
    3. weight tᵢ · wᵢ (identities that send one direction many times get one vote before this: the
       judge keeps one of a window's near-copies, ``protocol.near_duplicates``);
    4. a no-change vote (a zero row, weight 0) joins the m rows: it takes a place in each coordinate's
       order and adds nothing to the mean, so nothing the validator trained enters a head, and a
       coordinate where it alone survives the trim does not move;
    5. per coordinate, the k smallest and k largest of the m values are dropped, k = max(1,
       ⌊``trim_fraction`` · m⌋) once m ≥ 3, and the rest averaged with their weights.

    Steps 4 and 5 are what stop a trigger backdoor: it lives on coordinates (input pixels honest data
    never lights) where every honest update is exactly zero, and with the no-change vote even one
    honest update beside one attacker outvotes it there (a median of three). A lone candidate is
    merged as it is, clipped (FedAvg of one)."""
    trust = trust_scores(deltas, reference, trust_floor)
    keep = np.flatnonzero(trust > 0)
    if len(keep) == 0:
        return np.zeros_like(reference)
    scales = np.ones(len(deltas)) if clip_scales is None else np.asarray(clip_scales, np.float64)
    rows = clipped(deltas[keep], float(np.linalg.norm(reference)) * scales[keep])
    w = trust[keep] * np.asarray(weights, np.float64)[keep]
    values = np.concatenate([rows, np.zeros((1, rows.shape[1]))])
    all_w = np.concatenate([w, [0.0]])
    row_ranks = np.arange(len(deltas), dtype=np.int64) if ranks is None else ranks
    all_ranks = np.concatenate([row_ranks[keep], [len(deltas)]]).astype(np.int64)
    return trimmed_mean(values, all_w, trim=_trim_count(len(values), trim_fraction), ranks=all_ranks)


# -- the registry ------------------------------------------------------------------------------
def _need_reference(context: AggregationContext) -> Vector:
    if context.reference is None:
        raise ValueError("this aggregator needs the validator's reference update")
    return context.reference


def _f(n: int, context: AggregationContext) -> int:
    return int(n * context.byzantine_fraction)


def _weighted_mean(d: Vector, w: Vector, c: AggregationContext) -> Vector:
    return weighted_mean(d, w)


def _norm_clipped_mean(d: Vector, w: Vector, c: AggregationContext) -> Vector:
    return norm_clipped_mean(d, w)


def _coordinate_median(d: Vector, w: Vector, c: AggregationContext) -> Vector:
    return coordinate_median(d, w)


def _trimmed_mean(d: Vector, w: Vector, c: AggregationContext) -> Vector:
    ranks = _ranks(c.tie_keys, len(d))
    return trimmed_mean(d, w, trim=_trim_count(len(d), c.byzantine_fraction), ranks=ranks)


def _multi_krum(d: Vector, w: Vector, c: AggregationContext) -> Vector:
    return multi_krum(d, w, f=min(_f(len(d), c), max(len(d) - 3, 0)), keys=c.tie_keys)


def _bulyan(d: Vector, w: Vector, c: AggregationContext) -> Vector:
    return bulyan(d, w, f=min(_f(len(d), c), max((len(d) - 3) // 4, 0)), keys=c.tie_keys)


def _centered_clipping(d: Vector, w: Vector, c: AggregationContext) -> Vector:
    if c.reference is not None:
        return centered_clipping(
            d, w, tau=c.clip_radius * float(np.linalg.norm(c.reference)), centre=c.reference, iterations=1
        )
    return centered_clipping(d, w, tau=c.clip_tau, centre=np.zeros(d.shape[1]), iterations=3)


def _fltrust(d: Vector, w: Vector, c: AggregationContext) -> Vector:
    return fltrust(d, w, reference=_need_reference(c))


def _fltrust_trimmed_mean(d: Vector, w: Vector, c: AggregationContext) -> Vector:
    return fltrust_trimmed_mean(
        d,
        w,
        reference=_need_reference(c),
        trim_fraction=c.byzantine_fraction,
        ranks=_ranks(c.tie_keys, len(d)),
        trust_floor=c.trust_floor,
        clip_scales=np.asarray(c.clip_scales, np.float64) if c.clip_scales else None,
    )


AGGREGATORS: dict[str, Aggregator] = {
    "weighted_mean": _weighted_mean,
    "norm_clipped_mean": _norm_clipped_mean,
    "coordinate_median": _coordinate_median,
    "trimmed_mean": _trimmed_mean,
    "multi_krum": _multi_krum,
    "bulyan": _bulyan,
    "centered_clipping": _centered_clipping,
    "fltrust": _fltrust,
    "fltrust_trimmed_mean": _fltrust_trimmed_mean,
}
NEEDS_REFERENCE = frozenset({"fltrust", "fltrust_trimmed_mean"})


def merge_params(
    spec: Model,
    base: Mapping[str, np.ndarray],
    candidates: Sequence[tuple[str, Mapping[str, np.ndarray], float]],
    aggregator: str = "weighted_mean",
    *,
    salt: bytes = b"",
    reference: Mapping[str, np.ndarray] | None = None,
    byzantine_fraction: float = 0.2,
) -> Params:
    """``base + aggregator(θᵢ − base, wᵢ)`` over ``(content_id, params, weight)`` triples.

    With ``weighted_mean`` this is FedAvg: ``base + Σ wᵢ(θᵢ − base) / Σ wᵢ``. ``reference`` is the
    validator's own trained parameters (from ``base``) for the rules that need it."""
    if not candidates:
        raise ValueError("merge needs at least one candidate")
    ordered = sorted(candidates, key=lambda c: c[0])
    base_vector = flatten(spec, base)
    deltas = np.stack([flatten(spec, params) - base_vector for _, params, _ in ordered])
    weights = np.array([w for _, _, w in ordered], np.float64)
    context = AggregationContext(
        tie_keys=tie_keys(salt, [c[0] for c in ordered]),
        reference=None if reference is None else flatten(spec, reference) - base_vector,
        byzantine_fraction=byzantine_fraction,
    )
    return unflatten(spec, base_vector + AGGREGATORS[aggregator](deltas, weights, context))
