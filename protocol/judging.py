"""Judging one window, pure: from prechecked submissions to screens and the merged parameters.

Validators do the I/O-side checks first (signature, lease, artifact download) and pass each
candidate as a ``Submission`` with that ``precheck``; ``judge_window`` then applies, in order:
quarantine, one candidate per peer and lease window, schema and finiteness, screening (against the validator's
reference update when it passes one, else against the cohort), the per-candidate leave-one-out
validation-loss check, weight caps per peer kind (a delayed update discounted: ``staleness_weight``),
the preset's aggregator and the promotion rule.
It is pure: the trust book it is given is not changed, the decision carries the next one. The
attack suite calls the same function, so what it scores is what runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from .aggregation import (
    AGGREGATORS,
    NEEDS_REFERENCE,
    AggregationContext,
    Vector,
    clipped,
    flatten,
    tie_keys,
    unflatten,
)
from .errors import ProtocolError
from .manifests import ExperimentSpec, FetchManifest
from .messages import Candidate, HeadDescriptor, Lease
from .model import ModelSpec, Params
from .outer import OuterOptimizer
from .reasons import Reason
from .screening import (
    ACCEPT,
    Screen,
    ScreeningPolicy,
    counted_windows,
    judge_promotion,
    screen_cohort,
    screen_reference,
    screen_schema,
)
from .trust import TrustBook
from .window import lease_covers

__all__ = [
    "REFERENCE_BATCH_FACTOR",
    "Submission",
    "WindowDecision",
    "judge_window",
    "precheck",
    "reference_batches",
    "reference_steps",
    "stale_base",
    "staleness",
    "staleness_weight",
    "validator_examples",
]

FRESH_TRUST = TrustBook()  # no peer has a history yet
FEDAVG = OuterOptimizer()
Evaluate = Callable[[Mapping[str, np.ndarray]], dict[str, float]]


def stale_base(base_head: str, current_head: str) -> Screen:
    return Screen(Reason.STALE_BASE, f"trained on {base_head[:19]}, current is {current_head[:19]}")


def staleness(base_head: str, current: HeadDescriptor) -> int | None:
    """How many windows behind ``current`` a candidate on ``base_head`` is: 0 on the current head,
    1 on the head before it (it arrived after its window closed: a delayed update, judged and merged
    in the current window on top of the current head), ``None`` for anything older (``stale_base``)."""
    if base_head == current.head_id:
        return 0
    return 1 if base_head == current.parent else None


def staleness_weight(windows_behind: int) -> float:
    """The factor a delayed update is scaled by in the merge: FedBuff's polynomial staleness discount
    1/√(1 + τ) (Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous Aggregation")."""
    return float(1.0 / np.sqrt(1.0 + windows_behind))


def precheck(
    candidate: Candidate,
    *,
    current: HeadDescriptor,
    base: HeadDescriptor | None,
    judged: Mapping[str, object] | set[str],
    lease: Lease | None,
    leased_examples: int,
    edge_key: bytes | None,
) -> Screen:
    """Checks on a candidate's descriptor and lease, before its artifact is looked at.

    ``current`` is the head of the window being judged, ``base`` the descriptor of the head the
    candidate names (``current`` or its parent; ``None`` when unknown); ``judged`` holds the ids
    already decided (a re-signed old artifact is a replay); ``lease`` is the lease the candidate
    names, as the edge stores it (``None`` when unknown)."""
    if staleness(candidate.base_head, current) is None:
        return stale_base(candidate.base_head, current.head_id)
    if candidate.candidate_id in judged:
        return Screen(Reason.REPLAY, "this artifact was already submitted")
    try:
        candidate.verify_own()
    except ProtocolError as exc:
        return Screen(Reason.BAD_SIGNATURE, str(exc))
    if lease is None or not lease_covers(lease, candidate, base):
        return Screen(Reason.WRONG_LEASE, "lease is missing or not this peer's lease for its window")
    if edge_key is not None:
        try:
            lease.verify(edge_key)
        except ProtocolError:
            return Screen(Reason.WRONG_LEASE, "lease not signed by the edge")
    if candidate.examples > leased_examples:
        return Screen(Reason.OUT_OF_LEASE, f"claims {candidate.examples} examples, lease covers {leased_examples}")
    return ACCEPT


@dataclass(frozen=True)
class Submission:
    candidate_id: str
    peer_id: str
    peer_kind: str
    examples: float
    params: Mapping[str, np.ndarray] | None
    precheck: Screen
    windows: float = 1.0  # the windows' worth of optimizer steps it declares (``screen_reference``)
    lease_window: int = 0  # the window its lease was for: one candidate per peer and lease window
    windows_behind: int = 0  # 0, or 1 for a delayed update (``staleness``), merged scaled by ``staleness_weight``


@dataclass(frozen=True)
class WindowDecision:
    screens: dict[str, Screen]
    accepted: tuple[str, ...]
    merged: Params | None
    merged_metrics: dict[str, float] | None
    candidate_metrics: dict[str, dict[str, float]]  # each screened-in candidate alone, on the evaluation split
    trust: TrustBook  # the book after this window's decisions
    anchored: bool = False  # judged against the validator's reference update
    reference_cosines: dict[str, float] = field(default_factory=dict)  # cos(Δ, Δ_ref) per screened candidate
    marginal_losses: dict[str, float] = field(default_factory=dict)  # val loss with it − without it
    outer_state: Vector | None = None  # the outer optimizer's state after this window (``protocol.outer``)
    update_norm: float | None = None  # the lineage's step size: accepted updates' median norm (the base's if none)

    @property
    def promoted(self) -> bool:
        return self.merged is not None


REFERENCE_BATCH_FACTOR = 2  # the validator's own update's batches: this × the trainers', same step count


def reference_steps(spec: ExperimentSpec, manifest: FetchManifest) -> int:
    """Optimizer steps of the validator's own update in a window of ``spec``: as many as one trainer
    window takes (a lease's examples × ``local_epochs`` / ``batch_size``)."""
    per_shard = sum(s.examples for s in manifest.shards) // max(len(manifest.shards), 1)
    return max(1, spec.shards_per_lease * per_shard * spec.local_epochs // spec.batch_size)


def validator_examples(spec: ExperimentSpec, manifest: FetchManifest) -> int:
    """Examples a validator trains on per window of an anchored experiment: its own update,
    ``reference_steps`` at ``REFERENCE_BATCH_FACTOR`` × the batch (it screens, it never enters a head)."""
    return reference_steps(spec, manifest) * REFERENCE_BATCH_FACTOR * spec.batch_size


def reference_batches(base_head: str, examples: int, steps: int, batch_size: int) -> npt.NDArray[np.int64]:
    """Indices ``[steps, batch_size]`` into the validator's reference split of ``examples`` for its
    update in the window on ``base_head``: shuffled epochs of the split, seeded by the head id, so
    every validator of a quorum that holds the same split draws the same batches."""
    if examples < 1 or steps < 1 or batch_size < 1:
        raise ValueError("reference batches need examples, steps and a batch size")
    seed = hashlib.sha256(f"dtn-reference/{base_head}".encode()).digest()[:8]
    rng = np.random.default_rng(int.from_bytes(seed))
    needed = steps * batch_size
    order = np.concatenate([rng.permutation(examples) for _ in range(-(-needed // examples))])
    return np.asarray(order[:needed].reshape(steps, batch_size), np.int64)


def judge_window(
    spec: ModelSpec,
    base: Mapping[str, np.ndarray],
    base_metrics: Mapping[str, float],
    submissions: Sequence[Submission],
    policy: ScreeningPolicy,
    evaluate: Evaluate,
    trust: TrustBook = FRESH_TRUST,
    *,
    reference: Mapping[str, np.ndarray] | None = None,
    salt: bytes = b"",
    outer: OuterOptimizer = FEDAVG,
    momentum: Vector | None = None,
) -> WindowDecision:
    """Screens for every submission, the merged parameters when the window promotes, the next trust book.

    ``base_metrics["loss"]`` is the base head's loss on the validator's evaluation split (the
    ``holdout``), ``base_metrics["loss_se"]`` its standard error when known, and
    ``base_metrics["update_norm"]`` the lineage's step size when known (``WindowDecision.update_norm``
    of the window that made the base head); ``evaluate`` measures parameters on that same split
    (``{"loss", "accuracy"}``, and ``"loss_se"``).

    ``reference`` is the trust anchor: the validator's own update from this base on data no trainer
    gets, given as the trained parameters θ_ref (Δ_ref = θ_ref − base). The validator computes it as
    a trainer computes a window: start from ``base`` (the current head) with the experiment's
    optimizer (fresh state, or state kept across windows as a trainer keeps it; the attack suite
    uses a fresh one), take the same number of optimizer steps as one trainer window (leased
    examples × ``local_epochs`` / ``batch_size``), on the prepared dataset's ``reference`` split
    (validators only, never served, disjoint from the ``holdout`` that ``evaluate`` uses), in batches
    drawn with ``reference_batches(base head id, ...)``. A batch 2× the trainers' gives a steadier
    direction at the same step count (``REFERENCE_BATCH_FACTOR``; at 4× the reference drifts away
    from honest updates whose optimizers carry state over many windows, at 1× label-skewed updates
    are rejected more often). The anchor screens and bounds; it never enters a merge: a validator
    update merged into every head fits the heads to the same few thousand examples window after
    window (a lone trainer's run stalled at 0.95 test accuracy with its holdout loss climbing and
    its merges blocked). Every validator of a quorum must pass the same bytes (the same prepared
    copy, ``reference_batches`` and deterministic training, or the proposer's published update).

    With a reference and an ``anchored`` preset, candidates are screened against it (norm bounds
    relative to ‖Δ_ref‖, FLTrust trust ReLU(cos(Δ, Δ_ref)): trust 0 is ``untrusted_direction``),
    whatever the cohort's size or who controls most identities, and the merge uses
    ``policy.anchored_aggregator``. The free-rider bound follows the trainers: ``min_reference_ratio``
    × the smaller of ‖Δ_ref‖ and the lineage's step size, because a fresh-optimizer reference keeps
    its step size while converged trainers' steps shrink. With ``None`` the cohort rules apply
    (``screen_cohort`` and ``policy.aggregator``), which need an honest majority of identities.

    ``salt`` breaks ties in the robust rules (``tie_keys``): the same at every validator and unknown
    to submitters until the window is closed (e.g. derived from the closed window's candidate set and
    validator signatures); never random state.

    Each screened-in candidate is then checked leave-one-out: it is rejected (``regression``) when
    the linear merge of the screened-in updates (``_Merge.probe``: the example-weighted mean, of the
    updates clipped to ‖Δ_ref‖ when anchored) has a validation loss higher with it than without it by
    more than ``policy.candidate_margin`` (a single candidate is compared with not merging). A
    label-skewed honest update is judged by what it adds to the merge, not by how it does alone; the
    linear merge keeps the comparison free of the robust rule's own jumps (a trimmed mean of three
    participants is a median, of two a mean). If the merged head's loss rises past the promotion
    margin (``promotion_margin``, or ``policy.noise_z`` standard errors of the two holdout losses when
    that is more: a rise the holdout cannot tell from noise never blocks), the merge is blocked;
    candidates whose removal would have lowered the linear merge's loss by more than half the
    candidate margin share the blame (``regression``, a half strike), the others are
    ``merge_blocked`` (no strike).

    The merged parameters are the ``outer`` optimizer's step from ``base`` with the merge rule's
    update (``protocol.outer``: FedAvg takes it as it is, DiLoCo's Nesterov step uses ``momentum``,
    the state the base head names); the promotion rule judges that step, and the decision carries
    the next state (``outer_state``: unchanged when nothing merges, ``None`` after a blocked step)."""
    screens: dict[str, Screen] = {}
    contributed: set[tuple[str, int]] = set()
    valid: list[Submission] = []
    for sub in sorted(submissions, key=lambda s: s.candidate_id):
        if not sub.precheck.accepted:
            screen = sub.precheck
        elif trust.quarantined(sub.peer_id):
            screen = Screen(Reason.QUARANTINED, "too many rejected submissions from this peer")
        elif (sub.peer_id, sub.lease_window) in contributed:
            screen = Screen(Reason.REPLAY, "this peer already contributed to this window")
        elif sub.params is None:
            screen = Screen(Reason.UNDECODABLE, "no parameters")
        else:
            screen = screen_schema(spec, sub.params)
        screens[sub.candidate_id] = screen
        if screen.accepted:
            contributed.add((sub.peer_id, sub.lease_window))
            valid.append(sub)
    anchored = reference is not None and policy.anchored
    rule = policy.merge_rule(anchored)
    if rule in NEEDS_REFERENCE and not anchored:
        raise ValueError(f"aggregator {rule!r} needs a reference update")
    cohort = [_params(s) for s in valid]
    cosines: dict[str, float] = {}
    if anchored:
        assert reference is not None
        checked = screen_schema(spec, reference)
        if not checked.accepted:
            raise ValueError(f"the validator's own update is not usable: {checked}")
        cohort_screens, cosine_list = screen_reference(
            spec, base, cohort, reference, policy, [s.windows for s in valid], base_metrics.get("update_norm")
        )
        cosines = {s.candidate_id: c for s, c in zip(valid, cosine_list, strict=True)}
    else:
        cohort_screens = screen_cohort(spec, base, cohort, policy)
    metrics: dict[str, dict[str, float]] = {}
    trusted: list[Submission] = []
    for sub, screen in zip(valid, cohort_screens, strict=True):
        alone = None
        if screen.reason is Reason.UNTRUSTED_DIRECTION and policy.holdout_overrides_direction:
            alone = evaluate(_params(sub))
            screen = _measured_direction(screen, alone["loss"], float(base_metrics["loss"]))
        screens[sub.candidate_id] = screen
        if screen.accepted:
            metrics[sub.candidate_id] = alone if alone is not None else evaluate(_params(sub))
            trusted.append(sub)
    merge = _Merge(spec, base, trusted, policy, rule, salt, reference if anchored else None)
    marginal: dict[str, float] = {}
    accepted = list(trusted)
    merged: Params | None = None
    merged_metrics: dict[str, float] | None = None
    if trusted and np.isfinite(policy.candidate_margin):
        with_all = evaluate(merge.probe())["loss"]
        for i, sub in enumerate(trusted):
            without = evaluate(merge.probe(without=i))["loss"] if len(trusted) > 1 else float(base_metrics["loss"])
            marginal[sub.candidate_id] = with_all - without
            if marginal[sub.candidate_id] > policy.candidate_margin:
                screens[sub.candidate_id] = Screen(
                    Reason.REGRESSION,
                    f"val loss with this update {with_all:.4f} > without {without:.4f} + {policy.candidate_margin}",
                )
        accepted = [s for s in trusted if screens[s.candidate_id].accepted]
    next_momentum = momentum  # a window that merges nothing leaves the outer state as it was
    rows = [i for i, s in enumerate(trusted) if screens[s.candidate_id].accepted]  # ``accepted``, as rows
    if accepted:
        stepped, next_momentum = outer.step(merge.base, merge.update(rows), momentum)
        merged = unflatten(spec, stepped)
        merged_metrics = evaluate(merged)
    if merged is not None and merged_metrics is not None:
        outcome = judge_promotion(base_metrics, merged_metrics, policy.promotion_margin, policy.noise_z)
        if not outcome.accepted:
            for sub in accepted:
                harm = marginal.get(sub.candidate_id, 0.0)
                screens[sub.candidate_id] = (
                    Screen(Reason.REGRESSION, f"{outcome.detail}; without this update val loss is {harm:.4f} lower")
                    if harm > policy.candidate_margin / 2
                    else Screen(Reason.MERGE_BLOCKED, outcome.detail)
                )
            merged, next_momentum = None, None  # a blocked step restarts the outer momentum
    promoted = merged is not None
    next_trust = trust.after_window(
        (sub.peer_id, screens[sub.candidate_id].accepted and promoted, screens[sub.candidate_id].reason)
        for sub in sorted(submissions, key=lambda s: s.candidate_id)
    )
    step = merge.median_norm(rows) if promoted else base_metrics.get("update_norm")
    return WindowDecision(
        screens=screens,
        accepted=tuple(s.candidate_id for s in accepted) if promoted else (),
        merged=merged,
        merged_metrics=merged_metrics,
        candidate_metrics=metrics,
        trust=next_trust,
        anchored=anchored,
        reference_cosines=cosines,
        marginal_losses=marginal,
        outer_state=next_momentum,
        update_norm=step,
    )


def _measured_direction(untrusted: Screen, loss_alone: float, base_loss: float) -> Screen:
    """An update the anchor calls opposed passes (at the merge's trust floor) when, applied alone, it
    lowers the validator's holdout loss: near convergence the reference's direction is noise, what the
    holdout measures is not."""
    if loss_alone < base_loss:
        return ACCEPT
    return Screen(
        Reason.UNTRUSTED_DIRECTION,
        f"{untrusted.detail}, and alone it does not lower the holdout loss ({loss_alone:.4f} >= {base_loss:.4f})",
    )


def _params(sub: Submission) -> Mapping[str, np.ndarray]:
    assert sub.params is not None  # only schema-checked submissions get here
    return sub.params


class _Merge:
    """The window's merge rule over any subset of its screened-in candidates (content-id order,
    float64, per-kind weight caps, salted tie keys, the reference update when anchored)."""

    def __init__(
        self,
        spec: ModelSpec,
        base: Mapping[str, np.ndarray],
        trusted: Sequence[Submission],
        policy: ScreeningPolicy,
        rule: str,
        salt: bytes,
        reference: Mapping[str, np.ndarray] | None,
    ) -> None:
        self.spec, self.policy, self.rule = spec, policy, AGGREGATORS[rule]
        self.base = flatten(spec, base)
        caps = dict(policy.max_examples_by_kind)
        # a delayed update counts as s(τ)·Δ (FedBuff's server step: the discount shrinks the update
        # itself, so a lone late update is discounted too, not only relative to the others)
        self.deltas = (
            np.stack([(flatten(spec, _params(s)) - self.base) * staleness_weight(s.windows_behind) for s in trusted])
            if trusted
            else np.zeros((0, len(self.base)))
        )
        self.weights = np.array([min(s.examples, caps.get(s.peer_kind, s.examples)) for s in trusted], np.float64)
        self.keys = tie_keys(salt, [s.candidate_id for s in trusted])
        self.reference = None if reference is None else flatten(spec, reference) - self.base
        # each update's clip radius in units of ‖Δ_ref‖: √ of the windows of steps it declares (an
        # update's norm grows about as the square root of its steps: benchmarks/update_norms.py)
        self.clip_scales = tuple(float(np.sqrt(counted_windows(policy, s.windows))) for s in trusted)
        # the linear merge the leave-one-out check probes, as running sums (one row out costs O(D))
        self._rows = self.deltas
        if self.reference is not None:
            radius = float(np.linalg.norm(self.reference)) * np.asarray(self.clip_scales, np.float64)
            self._rows = clipped(self.deltas, radius)
        self._sum = (self.weights[:, None] * self._rows).sum(axis=0)
        self._total = float(self.weights.sum())

    def probe(self, without: int | None = None) -> Params:
        """The linear merge the leave-one-out check compares, of every screened-in update or of all
        but row ``without``: the example-weighted mean of the updates, each clipped to ‖Δ_ref‖ when
        anchored. Running sums minus one row: O(D) a probe, so a window's n probes cost O(n·D), not
        O(n²·D)."""
        total, weighted = self._sum, self._total
        if without is not None:
            total = total - self.weights[without] * self._rows[without]
            weighted -= float(self.weights[without])
        return unflatten(self.spec, self.base + total / weighted)

    def median_norm(self, rows: Sequence[int]) -> float:
        """The median norm of the updates ``rows`` before clipping (a delayed one discounted)."""
        return float(np.median(np.linalg.norm(self.deltas[list(rows)], axis=1)))

    def update(self, rows: Sequence[int] | range) -> Vector:
        """The merge rule's update Δ over ``rows`` (the outer optimizer turns it into a step)."""
        index = list(rows)
        context = AggregationContext(
            tie_keys=tuple(self.keys[i] for i in index),
            reference=self.reference,
            byzantine_fraction=self.policy.byzantine_fraction,
            clip_radius=self.policy.clip_radius,
            clip_tau=self.policy.clip_tau,
            trust_floor=self.policy.trust_floor,
            clip_scales=tuple(self.clip_scales[i] for i in index),
        )
        return self.rule(self.deltas[index], self.weights[index], context)
