"""Judging one window, pure: from prechecked submissions to screens and the merged parameters.

Validators do the I/O-side checks first (signature, lease, artifact download: ``precheck``) and pass
each candidate as a ``Submission``; ``judge_window`` is the composition of these stages, in order:

    admit            its precheck, quarantine, one candidate per peer and lease window, schema, finiteness,
                     lease evidence once the head has learned
    reject_copies    of a window's copies of one update, only the one of most lease evidence goes on
                     (``protocol.near_duplicates``); the others are ``near_duplicate``
    screen_updates   against the validator's reference update when anchored, else against the cohort
    measure_alone    the holdout overrides an opposed direction; each screened-in candidate alone
    leave_one_out    a candidate the linear merge is worse with than without is a regression (a lone
                     one: at the share of its step below the base's loss, where one is)
    outer_step       the merge rule over the rest (weight caps per peer kind, ``staleness_weight``),
                     then the outer optimizer's step from the base
    promote          of that step's shares (``policy.step_shares``), shortened while the holdout loss falls
    blocked_screens  the promotion rule on it, and the blame when it blocks the merge
    next_trust       the trust book after the window

and of the accepted, those whose lease evidence earns credit (``screening.lease_evidence_credits``).

Each is pure: the trust book given is not changed, the decision carries the next one. The attack
suite calls the same function, so what it scores is what runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

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
from .head_grid import snap
from .manifests import ExperimentSpec, FetchManifest
from .messages import Candidate, HeadDescriptor, Lease
from .model import Model, Params
from .near_duplicates import Sketcher, copies
from .outer import OuterOptimizer
from .reasons import Reason
from .screening import (
    ACCEPT,
    PRESETS,
    Screen,
    ScreeningPolicy,
    counted_windows,
    judge_promotion,
    lease_evidence_applies,
    lease_evidence_credits,
    screen_cohort,
    screen_lease_evidence,
    screen_reference,
    screen_schema,
)
from .trust import TrustBook
from .window import lease_covers

__all__ = [
    "REFERENCE_BATCH_FACTOR",
    "Merge",
    "Submission",
    "WindowDecision",
    "admit",
    "anchor_window",
    "blocked_screens",
    "judge_window",
    "leave_one_out",
    "measure_alone",
    "next_trust",
    "outer_step",
    "precheck",
    "promote",
    "reference_batches",
    "reference_steps",
    "reject_copies",
    "screen_updates",
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
    lease_evidence_z: float | None = None  # ``evidence.lease_evidence_z`` as measured; None: not measured


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
    lease_evidence: dict[str, float] = field(default_factory=dict)  # each measured candidate's evidence z
    credited: tuple[str, ...] = ()  # the accepted whose lease evidence earns credit (``lease_evidence_credits``)

    @property
    def promoted(self) -> bool:
        return self.merged is not None


REFERENCE_BATCH_FACTOR = 2  # the validator's own update's batches: this × the trainers', same steps (decision 0003)


def reference_steps(spec: ExperimentSpec, manifest: FetchManifest) -> int:
    """Optimizer steps of the validator's own update in a window of ``spec``: as many as one trainer
    window takes (a lease's examples × ``local_epochs`` / ``batch_size``)."""
    per_shard = sum(s.examples for s in manifest.shards) // max(len(manifest.shards), 1)
    return max(1, spec.shards_per_lease * per_shard * spec.local_epochs // spec.batch_size)


def anchor_window(window: int, every: int) -> int:
    """The window whose head the validator's own update (the anchor) is trained from, for the window
    on the head of ``window``: the last multiple of ``every`` at or before it (``every`` 1: its own).
    Between anchors a window is judged against its base + the anchor's Δ_ref (``native_peer.anchor``):
    the validator trains one update per ``every`` windows, not one per window (decision 0017)."""
    if every < 1 or window < 0:
        raise ValueError("anchor windows need a window of 0 or more and every of 1 or more")
    return window - window % every


def validator_examples(spec: ExperimentSpec, manifest: FetchManifest) -> int:
    """Examples a validator trains on per anchor (every ``spec.anchor_every`` windows, ``anchor_window``)
    in an anchored experiment: its own update, ``reference_steps`` at ``REFERENCE_BATCH_FACTOR`` × the
    batch (it screens, it never enters a head); none in an experiment its preset judges without one."""
    if not PRESETS[spec.screening].anchored:
        return 0
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
    spec: Model,
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
    grid: str = "exact",
) -> WindowDecision:
    """Screens for every submission, the merged parameters when the window promotes, the next trust book:
    ``admit`` → ``screen_updates`` → ``measure_alone`` → ``leave_one_out`` → ``promote`` (``outer_step``)
    → ``blocked_screens`` → ``next_trust``, over the submissions in content-id order (``reject_copies``
    after ``admit`` where ``policy.rejects_copies``).

    ``base_metrics`` holds the base head's ``loss`` on the validator's holdout, and its ``loss_se`` and
    the lineage's step (``update_norm``, ``WindowDecision.update_norm`` of the window that made the base
    head) when known; ``evaluate`` measures parameters on that holdout (``{"loss", "accuracy"}``, and
    ``"loss_se"``). ``reference`` is θ_ref, the validator's own update from ``base`` on its reference
    split (``reference_steps`` steps on ``reference_batches``, ``REFERENCE_BATCH_FACTOR``): with an
    ``anchored`` preset it screens and bounds and never enters a merge (decisions 0002, 0013), and every
    validator of a quorum must pass the same bytes. The merge rule is ``policy.merge_rule(anchored)``:
    ``ValueError`` when it needs a reference the window lacks. ``salt`` breaks the robust rules' ties
    (``tie_keys``): the same at every validator, unknown to submitters until the window closes, never
    random. ``outer`` steps from ``base`` with ``momentum``, the state the base head names
    (``protocol.outer``), onto ``grid`` (``protocol.head_grid``: "int8" snaps the step, seeded by ``salt``)."""
    anchor = reference if reference is not None and policy.anchored else None
    rule = policy.merge_rule(anchor is not None)
    if rule in NEEDS_REFERENCE and anchor is None:
        raise ValueError(f"aggregator {rule!r} needs a reference update")
    ordered = sorted(submissions, key=lambda s: s.candidate_id)
    screens, admitted = admit(spec, ordered, trust, policy, base_metrics.get("loss"))
    if policy.rejects_copies:
        copied, admitted = reject_copies(spec, base, admitted, salt)
        screens.update(copied)
    screened, cosines = screen_updates(spec, base, admitted, policy, anchor, base_metrics.get("update_norm"))
    screened, metrics = measure_alone(admitted, screened, policy, evaluate, base_metrics)
    screens.update((sub.candidate_id, screen) for sub, screen in zip(admitted, screened, strict=True))
    trusted = [sub for sub, screen in zip(admitted, screened, strict=True) if screen.accepted]
    merge = Merge(spec, base, trusted, policy, rule, salt, anchor)
    marginal, regressions = leave_one_out(merge, trusted, policy, evaluate, base_metrics)
    screens.update(regressions)
    rows = [i for i, sub in enumerate(trusted) if screens[sub.candidate_id].accepted]
    merged: Params | None = None
    merged_metrics: dict[str, float] | None = None
    state = momentum  # a window that merges nothing leaves the outer state as it was
    if rows:
        merged, merged_metrics, state = promote(merge, rows, outer, momentum, evaluate, base_metrics, policy, grid)
        blocked = blocked_screens(base_metrics, merged_metrics, [trusted[i] for i in rows], marginal, policy)
        if blocked:
            screens.update(blocked)
            merged, state = None, None  # a blocked step restarts the outer momentum
    promoted = merged is not None
    accepted = [trusted[i] for i in rows] if promoted else []
    return WindowDecision(
        screens=screens,
        accepted=tuple(sub.candidate_id for sub in accepted),
        merged=merged,
        merged_metrics=merged_metrics,
        candidate_metrics=metrics,
        trust=next_trust(trust, ordered, screens, promoted),
        anchored=anchor is not None,
        reference_cosines=cosines,
        marginal_losses=marginal,
        outer_state=state,
        update_norm=merge.median_norm(rows) if promoted else base_metrics.get("update_norm"),
        lease_evidence={s.candidate_id: s.lease_evidence_z for s in ordered if s.lease_evidence_z is not None},
        credited=tuple(sub.candidate_id for sub in accepted if lease_evidence_credits(sub.lease_evidence_z, policy)),
    )


def admit(
    spec: Model,
    submissions: Sequence[Submission],
    trust: TrustBook,
    policy: ScreeningPolicy | None = None,
    head_loss: float | None = None,
) -> tuple[dict[str, Screen], list[Submission]]:
    """Each submission's admission screen, in the order given, and the admitted submissions: its
    ``precheck``, then ``quarantined`` (decision 0006), ``replay`` for a peer's second candidate of one
    lease window, ``undecodable`` without parameters, schema and finiteness (``screen_schema``), then,
    when measured, the evidence that it trained on its lease (``screen_lease_evidence``:
    ``no_lease_evidence``; ``policy``'s bound, the default ``ScreeningPolicy.min_lease_evidence_z``
    without one), when it applies on a head of holdout loss ``head_loss`` (``lease_evidence_applies``)."""
    evidence = lease_evidence_applies(policy, head_loss, spec.classes)
    screens: dict[str, Screen] = {}
    contributed: set[tuple[str, int]] = set()
    admitted: list[Submission] = []
    for sub in submissions:
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
            if screen.accepted and evidence and sub.lease_evidence_z is not None:
                screen = screen_lease_evidence(sub.lease_evidence_z, policy)
        screens[sub.candidate_id] = screen
        if screen.accepted:
            contributed.add((sub.peer_id, sub.lease_window))
            admitted.append(sub)
    return screens, admitted


def reject_copies(
    spec: Model, base: Mapping[str, np.ndarray], admitted: Sequence[Submission], salt: bytes
) -> tuple[dict[str, Screen], list[Submission]]:
    """The admitted submissions that copy another's update (``protocol.near_duplicates.copies``), each
    ``near_duplicate``, and the rest in the order given. Of a group of copies the one of highest lease
    evidence z is kept (unmeasured lowest), ties broken by ``tie_keys(salt, ...)``."""
    if len(admitted) < 2:
        return {}, list(admitted)
    origin = flatten(spec, base)
    deltas = (flatten(spec, _params(sub)) - origin for sub in admitted)  # sketched one at a time
    keys = tie_keys(salt, [sub.candidate_id for sub in admitted])
    z = [
        -np.inf if sub.lease_evidence_z is None or np.isnan(sub.lease_evidence_z) else sub.lease_evidence_z
        for sub in admitted
    ]
    order = sorted(range(len(admitted)), key=lambda i: (-z[i], keys[i]))
    found = copies(Sketcher.of(salt, len(origin)), deltas, order)
    screens = {
        admitted[i].candidate_id: Screen(
            Reason.NEAR_DUPLICATE, f"a copy of {admitted[kept].candidate_id[:19]}'s update (cos {cosine:.4f})"
        )
        for i, (kept, cosine) in found.items()
    }
    return screens, [sub for i, sub in enumerate(admitted) if i not in found]


def screen_updates(
    spec: Model,
    base: Mapping[str, np.ndarray],
    admitted: Sequence[Submission],
    policy: ScreeningPolicy,
    reference: Mapping[str, np.ndarray] | None,
    lineage_step: float | None,
) -> tuple[list[Screen], dict[str, float]]:
    """Each admitted update's screen, and its cosine to Δ_ref by candidate id: against the
    ``reference`` (``screen_reference``, whatever the cohort; decision 0002) or, with ``None``, against
    the cohort (``screen_cohort``, no cosines), which needs an honest majority of identities.
    ``ValueError`` when the reference is not this model's finite parameters."""
    cohort = [_params(sub) for sub in admitted]
    if reference is None:
        return screen_cohort(spec, base, cohort, policy), {}
    checked = screen_schema(spec, reference)
    if not checked.accepted:
        raise ValueError(f"the validator's own update is not usable: {checked}")
    windows = [sub.windows for sub in admitted]
    screens, cosines = screen_reference(spec, base, cohort, reference, policy, windows, lineage_step)
    return screens, {sub.candidate_id: cosine for sub, cosine in zip(admitted, cosines, strict=True)}


def measure_alone(
    admitted: Sequence[Submission],
    screens: Sequence[Screen],
    policy: ScreeningPolicy,
    evaluate: Evaluate,
    base_metrics: Mapping[str, float],
) -> tuple[list[Screen], dict[str, dict[str, float]]]:
    """The screens, an ``untrusted_direction`` turned accepted where ``policy.holdout_overrides_direction``
    and the update alone lowers the holdout loss below ``base_metrics["loss"]`` (decision 0007), and
    each screened-in candidate's holdout metrics alone (each candidate evaluated once)."""
    measured: list[Screen] = []
    metrics: dict[str, dict[str, float]] = {}
    for sub, screen in zip(admitted, screens, strict=True):
        alone = None
        if screen.reason is Reason.UNTRUSTED_DIRECTION and policy.holdout_overrides_direction:
            alone = evaluate(_params(sub))
            screen = _measured_direction(screen, alone["loss"], float(base_metrics["loss"]))
        measured.append(screen)
        if screen.accepted:
            metrics[sub.candidate_id] = alone if alone is not None else evaluate(_params(sub))
    return measured, metrics


def leave_one_out(
    merge: Merge,
    trusted: Sequence[Submission],
    policy: ScreeningPolicy,
    evaluate: Evaluate,
    base_metrics: Mapping[str, float],
) -> tuple[dict[str, float], dict[str, Screen]]:
    """Each of ``merge``'s candidates (``trusted``, its rows) judged by what it adds: its marginal loss,
    the holdout loss of the linear merge (``Merge.probe``) with it − without it, and ``regression``
    where that exceeds ``policy.candidate_margin``; nothing when the margin is infinite. The linear
    merge keeps the robust rule's own jumps out of the comparison (decision 0004).

    A lone candidate is compared with the base head, and the window takes the share of its step the
    holdout prefers (``promote``). Where its whole step rises past the margin, its shares
    (``policy.step_shares``) are measured with that search: if one has a lower holdout loss than the
    base, that share's is its marginal loss, and the window takes a share of it; else its whole
    step's, so an update that raises the loss at every share stays a regression (decision 0044)."""
    if not trusted or not np.isfinite(policy.candidate_margin):
        return {}, {}
    with_all = evaluate(merge.probe())["loss"]
    share = 1.0
    if len(trusted) == 1 and with_all - float(base_metrics["loss"]) > policy.candidate_margin:
        whole = with_all
        shorter, loss = line_search(
            policy.step_shares, lambda s: whole if s == 1.0 else evaluate(merge.probe(share=s))["loss"], float
        )
        if loss < float(base_metrics["loss"]):  # else it is judged by its whole step
            share, with_all = shorter, loss
    marginal: dict[str, float] = {}
    regressions: dict[str, Screen] = {}
    for i, sub in enumerate(trusted):
        without = evaluate(merge.probe(without=i))["loss"] if len(trusted) > 1 else float(base_metrics["loss"])
        marginal[sub.candidate_id] = with_all - without
        if marginal[sub.candidate_id] > policy.candidate_margin:
            at = "" if share == 1.0 else f" (at its best share, {share:g} of its step)"
            regressions[sub.candidate_id] = Screen(
                Reason.REGRESSION,
                f"val loss with this update {with_all:.4f}{at} > without {without:.4f} + {policy.candidate_margin}",
            )
    return marginal, regressions


T = TypeVar("T")


def line_search(shares: Sequence[float], measure: Callable[[float], T], loss: Callable[[T], float]) -> tuple[float, T]:
    """The share of ``shares`` whose ``measure`` has the lowest ``loss``, measured longest first until a
    share does not lower it below the share before (the first of equals): along a step the holdout loss
    falls then rises, so once a shorter share is no better a shorter one still would not be (a
    backtracking line search). Returns the share and its measure."""
    if not shares:
        raise ValueError("the policy names no share of the merge's step")
    best: tuple[float, T] | None = None
    for share in sorted(shares, reverse=True):
        measured = measure(share)
        if best is not None and loss(measured) >= loss(best[1]):
            break
        best = share, measured
    assert best is not None
    return best


def outer_step(
    merge: Merge,
    update: Vector,
    outer: OuterOptimizer,
    momentum: Vector | None,
    share: float = 1.0,
    grid: str = "exact",
) -> tuple[Params, Vector | None]:
    """The merged parameters, ``outer``'s step from the merge's base with ``share`` × ``update`` (the
    merge rule's, ``Merge.update``), on ``grid`` (``protocol.head_grid``), and the next outer state
    (``protocol.outer``: FedAvg has none, DiLoCo's Nesterov step carries ``momentum``)."""
    stepped, state = outer.step(merge.base, share * update, momentum)
    params = unflatten(merge.spec, stepped)
    return (snap(merge.base_params, params, merge.salt) if grid == "int8" else params), state


def promote(
    merge: Merge,
    rows: Sequence[int],
    outer: OuterOptimizer,
    momentum: Vector | None,
    evaluate: Evaluate,
    base_metrics: Mapping[str, float],
    policy: ScreeningPolicy,
    grid: str = "exact",
) -> tuple[Params, dict[str, float], Vector | None]:
    """The step the window proposes, its holdout metrics and the next outer state: ``outer_step`` at
    the share of ``policy.step_shares`` of the merge's update that ``line_search`` finds on the
    holdout. ``blocked_screens`` then applies the promotion rule to it.

    Peers that each hold a few classes each fit their own; the mean of their updates overshoots
    where a shorter step along it lowers the loss, and the whole step, blocked, leaves the head where
    it was for the next window to overshoot the same way (decision 0028). A share only shortens the
    merge's step along the direction the merge rule chose; a window whose whole step is best pays two
    evaluations, not one per share."""
    update = merge.update(rows)  # the merge rule runs once; each share scales its update

    def measure(share: float) -> tuple[Params, dict[str, float], Vector | None]:
        merged, state = outer_step(merge, update, outer, momentum, share, grid)
        return merged, evaluate(merged), state

    return line_search(policy.step_shares, measure, lambda step: step[1]["loss"])[1]


def blocked_screens(
    base_metrics: Mapping[str, float],
    merged_metrics: Mapping[str, float],
    accepted: Sequence[Submission],
    marginal: Mapping[str, float],
    policy: ScreeningPolicy,
) -> dict[str, Screen]:
    """Nothing when the merged head passes the promotion rule (``judge_promotion``: a rise within
    ``promotion_margin`` or ``noise_z`` standard errors of the holdout losses; decision 0013); else each
    ``accepted`` candidate's screen: ``regression`` (a half strike) when its marginal loss exceeds half
    ``policy.candidate_margin``, ``merge_blocked`` (no strike) otherwise."""
    outcome = judge_promotion(base_metrics, merged_metrics, policy.promotion_margin, policy.noise_z)
    if outcome.accepted:
        return {}
    blocked: dict[str, Screen] = {}
    for sub in accepted:
        harm = marginal.get(sub.candidate_id, 0.0)
        blocked[sub.candidate_id] = (
            Screen(Reason.REGRESSION, f"{outcome.detail}; without this update val loss is {harm:.4f} lower")
            if harm > policy.candidate_margin / 2
            else Screen(Reason.MERGE_BLOCKED, outcome.detail)
        )
    return blocked


def next_trust(
    trust: TrustBook, submissions: Sequence[Submission], screens: Mapping[str, Screen], promoted: bool
) -> TrustBook:
    """The book after the window (``TrustBook.after_window``, a new book): every submission's peer took
    part, its candidate accepted only when its screen is and the window promoted."""
    return trust.after_window(
        (sub.peer_id, screens[sub.candidate_id].accepted and promoted, screens[sub.candidate_id].reason)
        for sub in submissions
    )


def _measured_direction(untrusted: Screen, loss_alone: float, base_loss: float) -> Screen:
    """Accepted when the update alone lowers the holdout loss, else ``untrusted`` saying it does not."""
    if loss_alone < base_loss:
        return ACCEPT
    return Screen(
        Reason.UNTRUSTED_DIRECTION,
        f"{untrusted.detail}, and alone it does not lower the holdout loss ({loss_alone:.4f} >= {base_loss:.4f})",
    )


def _params(sub: Submission) -> Mapping[str, np.ndarray]:
    assert sub.params is not None  # only schema-checked submissions get here
    return sub.params


class Merge:
    """The window's merge rule over any subset of its screened-in candidates (content-id order,
    float64, per-kind weight caps, salted tie keys, the reference update when anchored)."""

    def __init__(
        self,
        spec: Model,
        base: Mapping[str, np.ndarray],
        trusted: Sequence[Submission],
        policy: ScreeningPolicy,
        rule: str,
        salt: bytes,
        reference: Mapping[str, np.ndarray] | None,
    ) -> None:
        self.spec, self.policy, self.rule, self.salt = spec, policy, AGGREGATORS[rule], salt
        self.base_params, self.base = base, flatten(spec, base)
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

    def probe(self, without: int | None = None, share: float = 1.0) -> Params:
        """The linear merge the leave-one-out check compares, of every screened-in update or of all
        but row ``without``: the example-weighted mean of the updates, each clipped to ‖Δ_ref‖ when
        anchored, ``share`` of it stepped from the base. Running sums minus one row: O(D) a probe, so a
        window's n probes cost O(n·D), not O(n²·D)."""
        total, weighted = self._sum, self._total
        if without is not None:
            total = total - self.weights[without] * self._rows[without]
            weighted -= float(self.weights[without])
        return unflatten(self.spec, self.base + share * total / weighted)

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
