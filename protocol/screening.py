"""Screening of parameter updates (θ − base) and the acceptance rules. Pure NumPy.

Validators never trust reported metrics: everything here looks at the actual parameters. A rule
returns a ``Screen`` (a typed ``Reason`` and a human-readable detail), never raises for a bad update.

Per-candidate checks, in order: schema (names, shapes, float32), finiteness, then, against the
cohort of candidates for the same window, the update norm (relative to the cohort median norm: too
large is rejected, near zero is a free rider) and the cosine to the cohort's robust centre
(coordinate median). With fewer than ``min_cohort`` candidates the norm is bounded relative to the
base parameters' norm instead, and the cosine check is skipped.

``PRESETS`` name documented threshold sets; ``judge_promotion`` rejects a single update whose
validation loss is worse than the base's by more than ``candidate_margin`` (a single small-shard
update is noisy, so this margin is loose) and blocks a merged head worse than the current head by
more than ``promotion_margin``, both on the validator's own validation split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .aggregation import flatten
from .errors import InvalidMessage
from .model import ModelSpec
from .reasons import Reason

__all__ = ["ACCEPT", "PRESETS", "Screen", "ScreeningPolicy", "judge_promotion", "screen_cohort", "screen_schema"]


@dataclass(frozen=True)
class Screen:
    """One rule's outcome: ``reason`` decides, ``detail`` explains (for people, never parsed)."""

    reason: Reason
    detail: str = ""

    @property
    def accepted(self) -> bool:
        return self.reason.accepted

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else str(self.reason)


ACCEPT = Screen(Reason.ACCEPTED)


@dataclass(frozen=True)
class ScreeningPolicy:
    """Thresholds for one preset (see ``PRESETS`` for the documented values)."""

    name: str
    aggregator: str
    max_norm_ratio: float  # reject ‖Δ‖ > ratio × cohort median norm
    min_norm_ratio: float  # free rider when ‖Δ‖ < ratio × cohort median norm
    min_cosine: float  # reject cos(Δ, robust centre) below this
    max_relative_norm: float  # small cohorts: reject ‖Δ‖ > this × ‖base‖
    min_relative_norm: float  # small cohorts: free rider when ‖Δ‖ < this × ‖base‖
    min_cohort: int = 3
    candidate_margin: float = 0.1  # reject a single update whose val loss rises by more than this
    promotion_margin: float = 0.02  # block a head whose val loss rises by more than this
    max_examples_by_kind: tuple[tuple[str, float], ...] = (("browser", 8000.0), ("native", 32000.0))


PRESETS: dict[str, ScreeningPolicy] = {
    # schema + finiteness + zero-update free riders only; FedAvg.
    "minimal": ScreeningPolicy("minimal", "weighted_mean", np.inf, 0.0, -np.inf, np.inf, 1e-9, candidate_margin=np.inf),
    # the default: catches scaled, sign-flipped and free-riding updates; norm-clipped mean.
    "balanced": ScreeningPolicy("balanced", "norm_clipped_mean", 3.0, 0.1, 0.2, 0.5, 1e-6),
    # tighter bounds and a robust aggregator for open networks with many anonymous peers.
    "strict": ScreeningPolicy(
        "strict", "trimmed_mean", 2.0, 0.25, 0.3, 0.25, 1e-5, candidate_margin=0.05, promotion_margin=0.0
    ),
}


def screen_schema(spec: ModelSpec, params: Mapping[str, np.ndarray]) -> Screen:
    """Names, shapes and dtype per the model spec, and every value finite."""
    try:
        spec.check(params)
    except InvalidMessage as exc:
        return Screen(Reason.WRONG_SHAPE, str(exc))
    if not all(np.isfinite(array).all() for array in params.values()):
        return Screen(Reason.NON_FINITE, "update contains NaN or Inf")
    return ACCEPT


def screen_cohort(
    spec: ModelSpec,
    base: Mapping[str, np.ndarray],
    cohort: Sequence[Mapping[str, np.ndarray]],
    policy: ScreeningPolicy,
) -> list[Screen]:
    """Screen each schema-valid candidate's update against the others of its window."""
    if not cohort:
        return []
    base_vector = flatten(spec, base)
    deltas = np.stack([flatten(spec, params) - base_vector for params in cohort])
    norms = np.linalg.norm(deltas, axis=1)
    if len(cohort) < policy.min_cohort:
        reference = float(np.linalg.norm(base_vector))
        return [_norm_screen(n, reference, policy.max_relative_norm, policy.min_relative_norm) for n in norms]
    median_norm = float(np.median(norms))
    centre = np.median(deltas, axis=0)
    centre_norm = float(np.linalg.norm(centre))
    results = []
    for delta, norm in zip(deltas, norms, strict=True):
        screen = _norm_screen(norm, median_norm, policy.max_norm_ratio, policy.min_norm_ratio)
        if screen.accepted and centre_norm > 0 and norm > 0:
            cosine = float(delta @ centre) / (float(norm) * centre_norm)
            if cosine < policy.min_cosine:
                screen = Screen(Reason.OUTLIER, f"cosine {cosine:.3f} to cohort centre below {policy.min_cosine}")
        results.append(screen)
    return results


def _norm_screen(norm: float, reference: float, max_ratio: float, min_ratio: float) -> Screen:
    if norm > max_ratio * reference:
        return Screen(Reason.NORM_TOO_LARGE, f"update norm {norm:.4g} > {max_ratio} x {reference:.4g}")
    if norm <= min_ratio * reference or norm == 0.0:
        return Screen(Reason.FREE_RIDER, f"update norm {norm:.4g} <= {min_ratio} x {reference:.4g}")
    return ACCEPT


def judge_promotion(current: Mapping[str, float], merged: Mapping[str, float], margin: float) -> Screen:
    """Accept unless ``merged``'s validation loss exceeds ``current``'s by more than ``margin``."""
    if merged["loss"] > current["loss"] + margin:
        return Screen(Reason.REGRESSION, f"val loss {merged['loss']:.4f} > {current['loss']:.4f} + {margin}")
    return ACCEPT
