"""Aggregation rules: how accepted updates become one update. Pure NumPy, inputs never mutated.

Every rule has the signature ``rule(deltas, weights) -> delta`` where ``deltas`` is an ``[n, d]``
float64 matrix of parameter updates (θᵢ − base), ``weights`` the n sample weights, and the result a
``[d]`` vector. ``merge_params`` turns candidates into the next head's parameters with one of them:

    weighted_mean        FedAvg: Σ wᵢ Δᵢ / Σ wᵢ  (the default; exact for honest peers)
    norm_clipped_mean    each Δᵢ scaled down to at most the median norm, then weighted mean
    coordinate_median    per-coordinate median (weights ignored)
    trimmed_mean         per-coordinate mean after dropping the ``trim`` largest and smallest
    multi_krum           weighted mean of the m updates closest to their n−f−2 neighbours
    centered_clipping    iterative clipping around a running centre (Karimireddy et al. 2021)

Inputs are ordered by content id before stacking and accumulation is float64, so every validator
gets the same bytes from the same candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

import numpy as np
import numpy.typing as npt

from .model import ModelSpec, Params

__all__ = [
    "AGGREGATORS",
    "Aggregator",
    "centered_clipping",
    "coordinate_median",
    "flatten",
    "merge_params",
    "multi_krum",
    "norm_clipped_mean",
    "trimmed_mean",
    "unflatten",
    "weighted_mean",
]

Vector = npt.NDArray[np.float64]
Aggregator = Callable[[Vector, Vector], Vector]


def flatten(spec: ModelSpec, params: Mapping[str, np.ndarray]) -> Vector:
    """All parameters as one float64 vector, in the spec's name order."""
    return np.concatenate([np.asarray(params[name], np.float64).ravel() for name in spec.shapes])


def unflatten(spec: ModelSpec, vector: Vector) -> Params:
    params: Params = {}
    offset = 0
    for name, shape in spec.shapes.items():
        size = int(np.prod(shape))
        params[name] = vector[offset : offset + size].reshape(shape).astype(np.float32)
        offset += size
    return params


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


def trimmed_mean(deltas: Vector, weights: Vector, *, trim_fraction: float = 0.2) -> Vector:
    n = len(deltas)
    trim = min(int(n * trim_fraction), (n - 1) // 2)
    ordered = np.sort(deltas, axis=0)
    return np.asarray(ordered[trim : n - trim].mean(axis=0))


def multi_krum(deltas: Vector, weights: Vector, *, byzantine_fraction: float = 0.33) -> Vector:
    n = len(deltas)
    f = min(int(n * byzantine_fraction), max(n - 3, 0))
    if n <= 2:
        return weighted_mean(deltas, weights)
    sq = (deltas**2).sum(axis=1)
    distances = np.maximum(sq[:, None] + sq[None, :] - 2 * deltas @ deltas.T, 0.0)
    neighbours = max(n - f - 2, 1)
    scores = np.sort(distances, axis=1)[:, 1 : neighbours + 1].sum(axis=1)
    keep = np.argsort(scores, kind="stable")[: n - f]
    return weighted_mean(deltas[keep], np.asarray(weights)[keep])


def centered_clipping(deltas: Vector, weights: Vector, *, iterations: int = 3) -> Vector:
    centre = np.asarray(np.median(deltas, axis=0))
    w = np.asarray(weights, np.float64) / np.sum(weights)
    for _ in range(iterations):
        offsets = deltas - centre
        norms = np.linalg.norm(offsets, axis=1)
        tau = float(np.median(norms))
        scale = np.minimum(1.0, tau / np.maximum(norms, 1e-12))
        centre = centre + (w[:, None] * offsets * scale[:, None]).sum(axis=0)
    return centre


AGGREGATORS: dict[str, Aggregator] = {
    "weighted_mean": weighted_mean,
    "norm_clipped_mean": norm_clipped_mean,
    "coordinate_median": coordinate_median,
    "trimmed_mean": partial(trimmed_mean, trim_fraction=0.2),
    "multi_krum": partial(multi_krum, byzantine_fraction=0.33),
    "centered_clipping": centered_clipping,
}


def merge_params(
    spec: ModelSpec,
    base: Mapping[str, np.ndarray],
    candidates: Sequence[tuple[str, Mapping[str, np.ndarray], float]],
    aggregator: Aggregator = weighted_mean,
) -> Params:
    """``base + aggregator(θᵢ − base, wᵢ)`` over ``(content_id, params, weight)`` triples.

    With ``weighted_mean`` this is FedAvg: ``base + Σ wᵢ(θᵢ − base) / Σ wᵢ``.
    """
    if not candidates:
        raise ValueError("merge needs at least one candidate")
    ordered = sorted(candidates, key=lambda c: c[0])
    base_vector = flatten(spec, base)
    deltas = np.stack([flatten(spec, params) - base_vector for _, params, _ in ordered])
    weights = np.array([w for _, _, w in ordered], np.float64)
    return unflatten(spec, base_vector + aggregator(deltas, weights))
