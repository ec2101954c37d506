"""Screening of parameter updates (θ − base) and the acceptance rules. Pure NumPy.

Validators never trust reported metrics: everything here looks at the actual parameters. A rule
returns a ``Screen`` (a typed ``Reason`` and a human-readable detail), never raises for a bad update.

Per-candidate checks, in order: schema (names, shapes, float32), finiteness, then one of two screens:

* anchored (``screen_reference``, when the validator passes its own reference update Δ_ref and the
  preset is ``anchored``; decision 0002): the update norm relative to ‖Δ_ref‖ (too large:
  ``norm_too_large``; near zero: ``free_rider``, relative to the lineage's step when that is smaller)
  and the cosine to Δ_ref: at or below ``min_trust`` (clearly opposed; FLTrust's trust 0 in the
  ``fltrust`` preset) is ``untrusted_direction``, anything above it merges at ``trust_floor`` or more
  (decision 0004); with ``holdout_overrides_direction`` the judge (``protocol.judging``) lets an
  opposed update through when alone it lowers the holdout loss (decision 0007). Nothing here
  depends on the other candidates, so identities an attacker controls cannot move the bounds, and a
  cohort of one or two is judged like any other.
* cohort (``screen_cohort``, the fallback without a reference): the update norm relative to the
  cohort median norm and the cosine to the cohort's coordinate median (``outlier``). With fewer than
  ``min_cohort`` candidates the norm is bounded relative to the base parameters' norm instead, and
  the cosine check is skipped. Whoever controls most identities controls this centre: it is only as
  good as the honest majority.

Before those, once the head has learned (``lease_evidence_applies``), a candidate with no evidence
that it trained on its own lease is ``no_lease_evidence`` (``screen_lease_evidence``), and accepted work
earns credit only with stronger evidence (``lease_evidence_credits``; ``protocol.evidence``).

``PRESETS`` name documented threshold sets; ``judge_promotion`` compares validation losses on the
validator's own split (used per candidate by ``judging`` as a leave-one-out test with
``candidate_margin``, and for the merged head with ``promotion_margin``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from .aggregation import flatten
from .errors import InvalidMessage
from .model import Model
from .reasons import Reason

__all__ = [
    "ACCEPT",
    "PRESETS",
    "Screen",
    "ScreeningPolicy",
    "counted_windows",
    "judge_promotion",
    "lease_evidence_applies",
    "lease_evidence_credits",
    "screen_cohort",
    "screen_lease_evidence",
    "screen_reference",
    "screen_schema",
]


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
    """Thresholds and rules for one preset (see ``PRESETS`` for the documented values)."""

    name: str
    aggregator: str  # the merge rule (``protocol.aggregation.AGGREGATORS``) without a reference
    max_norm_ratio: float  # cohort: reject ‖Δ‖ > ratio × cohort median norm
    min_norm_ratio: float  # cohort: free rider when ‖Δ‖ ≤ ratio × cohort median norm
    min_cosine: float  # cohort: reject cos(Δ, robust centre) below this
    max_relative_norm: float  # small cohorts without a reference: reject ‖Δ‖ > this × ‖base‖
    min_relative_norm: float  # small cohorts without a reference: free rider when ‖Δ‖ ≤ this × ‖base‖
    min_cohort: int = 3
    candidate_margin: float = 0.03  # reject a candidate when the merge with it loses this much val loss vs. without
    promotion_margin: float = 0.05  # block a head whose val loss rises by more than this
    # the shares of the merge's step measured on the holdout; the head takes the best (decision 0028)
    step_shares: tuple[float, ...] = (1.0, 0.5, 0.25)
    max_examples_by_kind: tuple[tuple[str, float], ...] = (("browser", 8000.0), ("native", 32000.0))
    anchored: bool = True  # screen against the validator's reference update when one is given
    anchored_aggregator: str | None = None  # the merge rule when a reference is given (None: ``aggregator``)
    max_reference_ratio: float = 3.0  # anchored: reject ‖Δ‖ > ratio × ‖Δ_ref‖
    min_reference_ratio: float = 0.1  # anchored: free rider when ‖Δ‖ ≤ ratio × ‖Δ_ref‖
    max_declared_windows: float = 3.0  # anchored: the most windows of steps a candidate's norm bound counts
    min_trust: float = -0.1  # anchored: reject when cos(Δ, Δ_ref) ≤ this: clearly opposed (FLTrust: 0)
    holdout_overrides_direction: bool = True  # anchored: an opposed update that alone lowers the holdout loss passes
    trust_floor: float = 0.05  # anchored: the least merge trust of a candidate screening let through
    byzantine_fraction: float = 0.2  # f = ⌊fraction × n⌋ for Krum / Bulyan, the trim of the trimmed means
    clip_radius: float = 1.0  # centered clipping: τ = radius × ‖Δ_ref‖
    clip_tau: float = 1.0  # centered clipping without a reference: τ in parameter units
    noise_z: float = 3.0  # promotion: a rise within this many standard errors of the holdout losses never blocks
    # lease evidence (``protocol.evidence``): below this z, ``no_lease_evidence`` (``screen_lease_evidence``) ...
    min_lease_evidence_z: float = 2.0
    lease_evidence_below: float = 0.5  # ... once the head's holdout loss < this × chance (``lease_evidence_applies``)
    credit_lease_evidence_z: float = 3.0  # accepted work earns credit only with this z (``lease_evidence_credits``)
    rejects_copies: bool = True  # of near-duplicate updates one is judged (``protocol.near_duplicates``)

    def merge_rule(self, anchored: bool) -> str:
        """The aggregator's name, with or without a reference update."""
        return (self.anchored_aggregator or self.aggregator) if anchored else self.aggregator

    @property
    def asks_lease_evidence(self) -> bool:
        """Whether acceptance or credit needs a candidate's lease evidence measured."""
        return bool(self.min_lease_evidence_z > -np.inf or self.credit_lease_evidence_z > -np.inf)

    def without_lease_evidence(self) -> ScreeningPolicy:
        """This policy asking for no lease evidence: every candidate as if it showed it, credit as claimed."""
        return replace(self, min_lease_evidence_z=-np.inf, credit_lease_evidence_z=-np.inf)


PRESETS: dict[str, ScreeningPolicy] = {
    # schema + finiteness + zero-update free riders only; FedAvg; the reference and lease evidence are not used.
    "minimal": ScreeningPolicy(
        "minimal",
        "weighted_mean",
        np.inf,
        0.0,
        -np.inf,
        np.inf,
        1e-9,
        candidate_margin=np.inf,
        anchored=False,
        step_shares=(1.0,),
        rejects_copies=False,
    ).without_lease_evidence(),  # the undefended control
    # the default. With the validator's reference update: FLTrust trust (ReLU cos) and norm bounds
    # against the reference, each update clipped to its norm, then a trust-weighted coordinate-wise
    # trimmed mean with a no-change vote. Without: cohort screening and a weighted trimmed mean.
    "balanced": ScreeningPolicy(
        "balanced", "trimmed_mean", 3.0, 0.1, 0.2, 0.5, 1e-6, anchored_aggregator="fltrust_trimmed_mean"
    ),
    # tighter bounds; Bulyan without a reference, a wider trim with one.
    "strict": ScreeningPolicy(
        "strict",
        "bulyan",
        2.0,
        0.25,
        0.3,
        0.25,
        1e-5,
        candidate_margin=0.02,
        promotion_margin=0.02,
        anchored_aggregator="fltrust_trimmed_mean",
        max_reference_ratio=2.0,
        min_reference_ratio=0.2,
        min_trust=-0.05,
        byzantine_fraction=0.3,
    ),
    # FLTrust as published (Cao et al. 2021) when a reference is given; trimmed mean otherwise.
    "fltrust": ScreeningPolicy(
        "fltrust",
        "trimmed_mean",
        3.0,
        0.1,
        0.2,
        0.5,
        1e-6,
        anchored_aggregator="fltrust",
        min_trust=0.0,
        trust_floor=0.0,
        holdout_overrides_direction=False,
    ),
    # the classic robust rules, each alone (screening as ``balanced``).
    "multi_krum": ScreeningPolicy("multi_krum", "multi_krum", 3.0, 0.1, 0.2, 0.5, 1e-6),
    "bulyan": ScreeningPolicy("bulyan", "bulyan", 3.0, 0.1, 0.2, 0.5, 1e-6),
    "median": ScreeningPolicy("median", "coordinate_median", 3.0, 0.1, 0.2, 0.5, 1e-6),
    "centered_clipping": ScreeningPolicy("centered_clipping", "centered_clipping", 3.0, 0.1, 0.2, 0.5, 1e-6),
}


def counted_windows(policy: ScreeningPolicy, declared: float) -> float:
    """The windows of steps a candidate's declaration counts for: at least 1, at most
    ``policy.max_declared_windows`` (declared, not checked: a liar gains at most that)."""
    return min(max(declared, 1.0), policy.max_declared_windows)


def screen_schema(spec: Model, params: Mapping[str, np.ndarray]) -> Screen:
    """Names, shapes and dtype per the model spec, and every value finite."""
    try:
        spec.check(params)
    except InvalidMessage as exc:
        return Screen(Reason.WRONG_SHAPE, str(exc))
    if not all(np.isfinite(array).all() for array in params.values()):
        return Screen(Reason.NON_FINITE, "update contains NaN or Inf")
    return ACCEPT


def screen_cohort(
    spec: Model,
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
        return [
            _norm_screen(n, reference, policy.max_relative_norm, policy.min_relative_norm, "base norm") for n in norms
        ]
    median_norm = float(np.median(norms))
    centre = np.median(deltas, axis=0)
    centre_norm = float(np.linalg.norm(centre))
    results = []
    for delta, norm in zip(deltas, norms, strict=True):
        screen = _norm_screen(norm, median_norm, policy.max_norm_ratio, policy.min_norm_ratio, "cohort median")
        if screen.accepted and centre_norm > 0 and norm > 0:
            cosine = float(delta @ centre) / (float(norm) * centre_norm)
            if cosine < policy.min_cosine:
                screen = Screen(Reason.OUTLIER, f"cosine {cosine:.3f} to cohort centre below {policy.min_cosine}")
        results.append(screen)
    return results


def screen_reference(
    spec: Model,
    base: Mapping[str, np.ndarray],
    cohort: Sequence[Mapping[str, np.ndarray]],
    reference: Mapping[str, np.ndarray],
    policy: ScreeningPolicy,
    windows: Sequence[float] | None = None,
    lineage_step: float | None = None,
) -> tuple[list[Screen], list[float]]:
    """Screen each schema-valid candidate against the validator's reference update alone: norm
    within [``min_reference_ratio`` × s, ``max_reference_ratio`` × w × ‖Δ_ref‖], cos(Δ, Δ_ref) above
    ``min_trust``. Returns the screens and each candidate's cosine to the reference.

    s, the scale of the free-rider bound, is the smaller of ‖Δ_ref‖ and ``lineage_step`` (the median
    norm of the updates the lineage last merged): the bound follows the trainers' shrinking steps, not
    a fresh-optimizer reference's (decision 0013).

    w counts the windows' worth of optimizer steps each candidate declares (``windows``; the reference
    takes one window's), at least 1 and at most ``max_declared_windows`` (``counted_windows``): a
    continuous trainer's update carries more than one window of steps, declared, not checked, so a
    liar gains at most that factor, and the merge clips every update to √w × ‖Δ_ref‖ (decision 0008)."""
    base_vector = flatten(spec, base)
    ref = flatten(spec, reference) - base_vector
    ref_norm = float(np.linalg.norm(ref))
    if not np.isfinite(ref_norm) or ref_norm == 0.0:
        raise ValueError("the reference update must be finite and non-zero")
    floor = (lineage_step, "the lineage's step") if lineage_step is not None and 0 < lineage_step < ref_norm else None
    screens, cosines = [], []
    for params, declared in zip(cohort, windows or [1.0] * len(cohort), strict=True):
        delta = flatten(spec, params) - base_vector
        norm = float(np.linalg.norm(delta))
        cosine = float(delta @ ref) / (norm * ref_norm) if norm > 0 else 0.0
        most = policy.max_reference_ratio * counted_windows(policy, declared)
        screen = _norm_screen(norm, ref_norm, most, policy.min_reference_ratio, "reference", floor)
        if screen.accepted and cosine <= policy.min_trust:
            screen = Screen(
                Reason.UNTRUSTED_DIRECTION,
                f"cosine {cosine:.3f} to the validator's reference update <= {policy.min_trust}",
            )
        screens.append(screen)
        cosines.append(cosine)
    return screens, cosines


def _norm_screen(
    norm: float, reference: float, max_ratio: float, min_ratio: float, what: str, floor: tuple[float, str] | None = None
) -> Screen:
    """``norm_too_large`` above ``max_ratio`` × ``reference``, ``free_rider`` at or below ``min_ratio`` ×
    ``reference`` (or × ``floor``'s scale when given, named by it) or at zero, else accepted."""
    if norm > max_ratio * reference:
        return Screen(Reason.NORM_TOO_LARGE, f"update norm {norm:.4g} > {max_ratio} x {what} {reference:.4g}")
    low, low_what = floor or (reference, what)
    if norm <= min_ratio * low or norm == 0.0:
        return Screen(Reason.FREE_RIDER, f"update norm {norm:.4g} <= {min_ratio} x {low_what} {low:.4g}")
    return ACCEPT


def lease_evidence_applies(policy: ScreeningPolicy | None, head_loss: float | None, classes: int) -> bool:
    """Whether acceptance needs lease evidence on a head with holdout loss ``head_loss``: once it is
    below ``policy.lease_evidence_below`` × the chance loss ln(``classes``). From (near) random
    parameters an honest update generalizes almost fully, its lease gains little more than other
    examples (decision 0020), so acceptance asks for none there; credit always does
    (``lease_evidence_credits``). Unknown loss: it applies."""
    below = ScreeningPolicy.lease_evidence_below if policy is None else policy.lease_evidence_below
    return head_loss is None or head_loss < below * float(np.log(classes))


def screen_lease_evidence(z: float, policy: ScreeningPolicy | None = None) -> Screen:
    """``no_lease_evidence`` when the evidence z (``protocol.evidence.lease_evidence_z``) is below
    ``policy.min_lease_evidence_z`` (or not a number): nothing shows the candidate trained on its
    lease, whatever its update looks like. A statistical refusal an honest peer can draw now and
    then: half a strike (``Reason.strike_weight``), which only a repeat offender adds up to quarantine."""
    least = ScreeningPolicy.min_lease_evidence_z if policy is None else policy.min_lease_evidence_z
    if not z >= least:
        return Screen(Reason.NO_LEASE_EVIDENCE, f"no evidence it trained on its lease: z {z:.2f} < {least}")
    return ACCEPT


def lease_evidence_credits(z: float | None, policy: ScreeningPolicy) -> bool:
    """Whether accepted work with lease evidence ``z`` earns credit (its examples, ``server.credit``):
    z ≥ ``policy.credit_lease_evidence_z``. Unmeasured (``None``) or not a number earns none, unless
    the policy asks for no evidence (−inf: credit as claimed)."""
    least = policy.credit_lease_evidence_z
    return least == -np.inf or (z is not None and z >= least)


def judge_promotion(
    current: Mapping[str, float], merged: Mapping[str, float], margin: float, noise_z: float = 0.0
) -> Screen:
    """Accept unless ``merged``'s validation loss exceeds ``current``'s by more than ``margin``, or by
    more than ``noise_z`` standard errors of the difference when both carry one (``loss_se``,
    independent errors: σ = √(se₁² + se₂²)) and that is the larger: on a small holdout a rise its
    own noise explains never blocks a merge."""
    allowed = margin
    if "loss_se" in current and "loss_se" in merged:
        allowed = max(margin, noise_z * float(np.hypot(current["loss_se"], merged["loss_se"])))
    if merged["loss"] > current["loss"] + allowed:
        return Screen(Reason.REGRESSION, f"val loss {merged['loss']:.4f} > {current['loss']:.4f} + {allowed:.4f}")
    return ACCEPT
