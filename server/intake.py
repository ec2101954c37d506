"""What the edge takes in: candidates, heads and verdicts, by HTTP or WebSocket alike.

Each upload is checked in the same order everywhere: size, envelope, descriptor shape, (for
candidates: the client address's budget of signature checks,) signature, then for candidates: the
key's binding to its admission token, the sender's rate limit (``check_peer_rate``, per peer and
experiment, which lease requests count against too), a trainer kind, a lease its trainer holds for this
window (``protocol.window.lease_covers``, the rule validators apply too) and has not used yet (one
candidate per lease, else 409), room in the window's storage quota (else 507); then the artifact's
hash and that it is exactly an artifact of the experiment's model (``protocol.updates.read_artifact``:
size, names, shapes, dtypes of the experiment's update codec; heads are float32 parameters), stored
fsynced; then the record is committed and only then acknowledged
and announced. Whether a candidate is any good is the validators' call, not the edge's.

An envelope without artifact bytes publishes the artifact staged under the id its descriptor names
(``server.uploads``): the same checks run on the staged bytes, and the stage is deleted once they are
stored. Publishing again what is stored already (a retry whose answer was lost) is answered as the
first time was, without the bytes: the stage is gone by then (an envelope with the bytes is checked
again, as it always was).

A head that names an outer optimizer state (``protocol.outer``) is taken only once that state is
stored: its proposer uploads it first, in an envelope with the signed head, checked like a head's
parameters (the proposer's signature, parent is the current head, hash, the model's float32 layout).

Heads are proposals until ``NetworkManifest.quorum`` distinct validators vouch for them: the
proposer's signature and validators' ``Attestation`` of exactly that head (same parent, window, merge
and bytes). The first proposal on the current head to gather its quorum becomes canonical; rival
proposals on one parent and attestations of another merge are published on the ``quorum`` topic and
counted (``dtn_quorum_conflicts_total``), so viewers see validators disagree.

Each validator key has budgets per window of an experiment (the window on a head's parent): at most
``validator_proposals_per_window`` proposed heads (past it 429, checked before any bytes are read)
and ``EdgeState.validator_window_bytes`` of heads and outer states stored (past it 413), so one key
flooding proposals neither fills the edge's storage nor gives the other validators more than a few
proposals to judge; other keys' proposals are not touched by it.

Verdicts count toward credit and standing by ``protocol.credit``: one the canonical lineage
contradicts is refused (409), one on a candidate never received here too (404); a rejection the
lineage bears out counts at once; one on a candidate whose verdict counts already must make the same
decision (else 409) and changes nothing; any other is held as its validator's vote (202) and counts once
``NetworkManifest.quorum`` validators signed the same decision (an acceptance: into the same head,
vouching for the same examples), or, a rejection, once the heads that decide it are canonical
(``_settle_votes``, at each promotion), where a contradicted vote is dropped. With a quorum above one the
agreeing votes of a verdict that counts are kept, and listed (``.../verdicts/{candidate_id}/votes``): another edge that
follows this one counts it from them as this one did (``server.follower``). The examples credited are
those vouched for, capped by the candidate's own count and its lease.

A run-control order (``protocol.run_control``) is taken once a quorum of the network's validators
signed it, for the experiment it is submitted to, a rollback only to a head made canonical here, and
in sequence (``EdgeStore.apply_run_control``); it is published on the ``control`` topic.

An evaluation of a head (``protocol.messages.Evaluation``: a validator's test-split metrics, measured
after the head was published) is kept when a listed validator signed it for a head of this edge's
lineage (else 404), its window that head's; the first copy per validator, head and split stays. It is
published on the ``evaluations`` topic.

Retention: when a head is promoted, artifacts of candidates whose window is
``candidate_retention_windows`` heads behind are deleted (descriptors, verdicts and heads stay).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import anyio

from protocol.credit import (
    DECIDING_HEADS,
    Settled,
    agree,
    counts,
    credited_examples,
    leased_examples,
    same_decision,
    settle,
)
from protocol.envelope import MAX_DESCRIPTOR_BYTES, unpack_envelope
from protocol.errors import InvalidMessage, SignatureError, TooLarge
from protocol.hashing import verify_content
from protocol.ids import ContentId, ExperimentKey, HeadId
from protocol.manifests import ExperimentSpec
from protocol.messages import TRAINER_KINDS, Attestation, Candidate, Evaluation, HeadDescriptor, Verdict
from protocol.network_pins import fingerprint
from protocol.network_revisions import order_network
from protocol.run_control import SignedRunControl
from protocol.signing import b64encode
from protocol.updates import read_artifact
from protocol.window import lease_covers

from .errors import Conflict, Forbidden, NotFound, QuotaExceeded, RateLimited
from .state import EdgeState

__all__ = [
    "accept_attestation",
    "accept_candidate",
    "accept_head",
    "accept_order",
    "accept_outer_state",
    "accept_verdict",
    "accept_verdicts",
    "applied_order",
    "check_peer_rate",
    "counting_rejections",
    "head_taken",
]


@contextmanager
def counting_rejections(state: EdgeState) -> Iterator[None]:
    """An upload's intake: whatever it raises is counted as a refused upload, by error class
    (``dtn_rejected_uploads_total``), and raised on."""
    try:
        yield
    except Exception as exc:
        state.metrics.rejected_uploads.labels(type(exc).__name__).inc()
        raise


def check_peer_rate(state: EdgeState, peer_id: str, experiment: ExperimentKey) -> None:
    """Count a lease request or candidate upload of ``peer_id`` (signature checked) in ``experiment``
    (one of this network's: a made-up one must get no budget of its own); ``RateLimited`` past
    ``peer_requests_per_min``. Per experiment, because an honest trainer asks once of each per window
    of every experiment it trains."""
    state.peer_limits.check(f"{peer_id} in {experiment}")


async def _store_artifact(
    state: EdgeState, artifact: bytes, cid: ContentId, spec: ExperimentSpec, codec: str = "fp32"
) -> None:
    """Store ``artifact`` once it hashes to ``cid`` and is exactly an artifact of the experiment's
    model under ``codec`` (candidates: the experiment's; heads: plain float32 parameters), and no larger
    than the experiment's model allows (``EdgeState.artifact_limit``: over HTTP and the relay alike)."""
    if len(artifact) > (limit := state.artifact_limit(spec.key)):
        raise TooLarge(f"an artifact of {len(artifact)} bytes; {spec.model.name} artifacts are at most {limit}")

    def work() -> None:
        verify_content(artifact, cid)
        read_artifact(spec.model, artifact, codec)
        state.blobs.put(artifact, cid)

    await anyio.to_thread.run_sync(work)
    state.uploads.discard(spec.key, cid)


async def _artifact(state: EdgeState, inline: bytes, key: ExperimentKey, cid: ContentId) -> bytes:
    """The artifact an envelope carries, or, when it carries none, the upload staged as ``cid``."""
    return inline or await state.uploads.take(key, cid)


def _open(state: EdgeState, body: bytes) -> tuple[object, bytes]:
    if len(body) > state.settings.max_inline_bytes + MAX_DESCRIPTOR_BYTES:
        raise TooLarge(
            f"upload of {len(body)} bytes exceeds {state.settings.max_inline_bytes}; stage larger artifacts in chunks"
        )
    return unpack_envelope(body)


def _same_experiment(claimed: ExperimentKey, route: ExperimentKey | None) -> None:
    if route is not None and claimed != route:
        raise InvalidMessage(f"descriptor is for {claimed}, not {route}")


async def accept_candidate(
    state: EdgeState,
    body: bytes,
    *,
    via: str,
    address: str,
    token: str | None = None,
    route: ExperimentKey | None = None,
) -> tuple[Candidate, bool]:
    """Store a trainer's signed candidate, sent from client ``address`` with admission ``token`` (its
    role already checked by the caller); returns it and whether it was new."""
    with counting_rejections(state):
        descriptor, inline = _open(state, body)
        candidate = Candidate.from_wire(descriptor)
        _same_experiment(candidate.experiment, route)
        spec = state.experiment(candidate.experiment)
        state.address_limits.check(address)  # before the signature is checked
        candidate.verify_own()
        state.admission.bind(token, candidate.peer_id)  # the sender checked the token's role
        check_peer_rate(state, candidate.peer_id, candidate.experiment)
        if candidate.peer_kind not in TRAINER_KINDS:
            raise Forbidden(f"only trainers ({', '.join(TRAINER_KINDS)}) upload candidates, not {candidate.peer_kind}")
        base = state.store.head(candidate.experiment, candidate.base_head)
        if not lease_covers(state.store.lease(candidate.lease_id), candidate, base):
            raise Forbidden("a candidate must name a lease its trainer holds for this experiment")
        delivered = state.store.lease_delivered(candidate.lease_id)
        if delivered is not None and delivered != candidate.candidate_id:
            raise Conflict(f"lease {candidate.lease_id} already delivered candidate {delivered}")
        if delivered is not None and not inline:
            return candidate, False  # a staged publish again: stored already, its stage gone
        artifact = await _artifact(state, inline, candidate.experiment, candidate.candidate_id)
        used = state.store.window_bytes(candidate.experiment, candidate.base_head)
        if delivered is None and used + len(artifact) > state.settings.window_quota_bytes:
            raise QuotaExceeded(f"this window's candidate storage is full ({used} bytes stored)")
        await _store_artifact(state, artifact, candidate.candidate_id, spec, spec.codec)
    created = state.store.add_candidate(candidate, len(artifact), state.clock.now_ms())
    if created:
        state.metrics.candidates.labels(via).inc()
        state.store.saw_peer(candidate.peer_id, candidate.peer_kind, state.clock.now_ms())
        state.hub.publish(candidate.experiment, "candidates", candidate.to_wire())
    return candidate, created


def _proposed_head(state: EdgeState, body: bytes, route: ExperimentKey | None) -> tuple[HeadDescriptor, bytes]:
    """The validator-signed head of an upload and the artifact bytes that came with it (none: staged)."""
    descriptor, artifact = _open(state, body)
    head = HeadDescriptor.from_wire(descriptor)
    _same_experiment(head.experiment, route)
    head.verify_trusted(state.network.validator_key_set)  # its proposer is a validator of the network
    return head, artifact


async def accept_outer_state(state: EdgeState, body: bytes, *, route: ExperimentKey) -> ContentId:
    """Store the outer optimizer state a validator's proposed head names (``protocol.outer``), before
    the head itself: the envelope of that signed head and the state artifact, exactly the model's
    float32 tensors under the id the head names."""
    with counting_rejections(state):
        head, inline = _proposed_head(state, body, route)
        spec = state.experiment(head.experiment)
        if head.outer_state is None:
            raise InvalidMessage("this head names no outer optimizer state")
        _on_current(state, head.experiment, head.parent, state.store.current_head(head.experiment))
        if inline or not state.blobs.exists(head.outer_state):  # a staged publish again: stored already
            _within_proposals(state, head)
            artifact = await _artifact(state, inline, head.experiment, head.outer_state)
            _charge(state, head, head.outer_state, len(artifact))
            await _store_artifact(state, artifact, head.outer_state, spec)
    return head.outer_state


async def accept_head(
    state: EdgeState, body: bytes, *, route: ExperimentKey | None = None
) -> tuple[HeadDescriptor, bool]:
    """Take a validator-signed head proposed on top of the current head; returns it (with the
    certificate gathered so far) and whether it is canonical now (``NetworkManifest.quorum``
    validators vouch for it: with a quorum of 1, at once). The outer state it names must be stored
    first (``accept_outer_state``)."""
    with counting_rejections(state):
        head, inline = _proposed_head(state, body, route)
        spec = state.experiment(head.experiment)
        current = state.store.current_head(head.experiment)
        if current is not None and current.head_id == head.head_id:
            return current, True
        _on_current(state, head.experiment, head.parent, current)
        if head.outer_state is not None and not state.blobs.exists(head.outer_state):
            raise Conflict(f"the outer state {head.outer_state} this head names is not stored; upload it first")
        stored = state.store.proposal(head.experiment, head.head_id)
        if stored is not None and stored.validator_key not in state.network.validator_key_set:
            # proposed by a validator a revision retired: a listed validator that computed the same head takes it over
            state.store.take_over_proposal(head, stored.validator_key)
        elif inline or stored is None:  # staged again: stored
            _within_proposals(state, head)
            artifact = await _artifact(state, inline, head.experiment, head.head_id)
            _charge(state, head, head.head_id, len(artifact))
            await _store_artifact(state, artifact, head.head_id, spec)
    added = state.store.add_proposal(
        replace(head, certificate=()), state.clock.now_ms(), state.settings.validator_proposals_per_window
    )
    if added is None:  # another request of its proposer took the last of the budget meanwhile
        state.metrics.rejected_uploads.labels(RateLimited.__name__).inc()
        raise _over_proposals(state, head)
    if added and state.network.quorum > 1:
        rivals = [p.head_id for p in state.store.proposals(head.experiment, head.parent) if p.head_id != head.head_id]
        state.hub.publish(head.experiment, "quorum", _quorum_event("proposed", head, rivals))
        if rivals:  # validators computed different heads from the same window: visible to viewers
            state.metrics.quorum_conflicts.inc()
    return _promote_if_certified(state, head.experiment, head.head_id)


def accept_attestation(state: EdgeState, value: object, *, route: ExperimentKey) -> tuple[HeadDescriptor, bool]:
    """Add a validator's attestation to the proposed head it names; returns that head and whether
    it is canonical now."""
    attestation = Attestation.from_wire(value)
    _same_experiment(attestation.experiment, route)
    state.experiment(attestation.experiment)
    _signed_by_validator(state, attestation, "attestation")
    head = state.store.proposal(attestation.experiment, attestation.head_id)
    if head is None:
        current = state.store.current_head(attestation.experiment)
        if current is not None and current.head_id == attestation.head_id:
            return current, True  # certified already; one more voice changes nothing
        raise NotFound(f"no proposed head {attestation.head_id}")
    if head.validator_key not in state.network.validator_key_set:  # a revision retired it while it waited
        raise Conflict(
            f"head {attestation.head_id} was proposed by {b64encode(head.validator_key)}, whom network revision"
            f" {state.network.revision} does not list: it can never be certified"
        )
    if not attestation.attests(head):
        state.metrics.quorum_conflicts.inc()
        state.hub.publish(head.experiment, "quorum", _quorum_event("disputed", head, [], attestation.validator_key))
        raise Conflict("the attestation names this head with another parent, window or merge")
    if state.store.add_attestation(attestation):
        state.metrics.attestations.inc()
        event = _quorum_event("attested", head, [], attestation.validator_key)
        state.hub.publish(head.experiment, "quorum", event)
    return _promote_if_certified(state, head.experiment, head.head_id)


def accept_evaluation(state: EdgeState, value: object, *, route: ExperimentKey) -> tuple[Evaluation, bool]:
    """Keep a validator's evaluation of a head of this edge's lineage; returns it and whether it was
    new (the first copy per validator, head and split stays)."""
    evaluation = Evaluation.from_wire(value)
    _same_experiment(evaluation.experiment, route)
    state.experiment(evaluation.experiment)
    _signed_by_validator(state, evaluation, "evaluation")
    head = state.store.head(evaluation.experiment, evaluation.head_id)
    if head is None:
        raise NotFound(f"no head {evaluation.head_id} in the lineage of {evaluation.experiment}")
    if head.window != evaluation.window:
        raise InvalidMessage(f"head {head.head_id} is of window {head.window}, not {evaluation.window}")
    created = state.store.add_evaluation(evaluation)
    if created:
        state.hub.publish(evaluation.experiment, "evaluations", evaluation.to_wire())
    return evaluation, created


def _within_proposals(state: EdgeState, head: HeadDescriptor) -> None:
    """``RateLimited`` when ``head`` is a new proposal past its proposer's budget of heads for the
    window on its parent (``validator_proposals_per_window``): one validator key cannot flood a window
    with proposals that the other validators would judge, nor the edge's storage."""
    if state.store.proposal(head.experiment, head.head_id) is not None:
        return  # stored already: publishing it again costs nothing
    if state.store.proposed_by(head.experiment, head.parent, head.validator_key) >= (
        state.settings.validator_proposals_per_window
    ):  # before any bytes are read; ``EdgeStore.add_proposal`` checks it again as it stores the head
        raise _over_proposals(state, head)


def _over_proposals(state: EdgeState, head: HeadDescriptor) -> RateLimited:
    budget = state.settings.validator_proposals_per_window
    return RateLimited(
        f"validator {b64encode(head.validator_key)} proposed its {budget} heads for the window on {head.parent}"
    )


def _charge(state: EdgeState, head: HeadDescriptor, cid: ContentId, size: int) -> None:
    """Charge ``size`` bytes stored as ``cid`` to ``head``'s proposer in its window; ``TooLarge`` past
    its budget (``EdgeState.validator_window_bytes``)."""
    budget = state.validator_window_bytes(head.experiment)
    used = state.store.charge_validator(head, cid, size, budget)
    if used is not None:
        raise TooLarge(
            f"validator {b64encode(head.validator_key)} stored {used} bytes in the window on {head.parent};"
            f" {size} more exceed its {budget}"
        )


def _signed_by_validator(state: EdgeState, message: Attestation | Evaluation | Verdict, what: str) -> None:
    """Raise ``SignatureError`` unless a validator listed in the network manifest signed ``message``."""
    if message.validator_key not in state.network.validator_key_set:
        raise SignatureError(f"{what} is not signed by a validator of this network")
    message.verify(message.validator_key)


def _on_current(
    state: EdgeState, experiment: ExperimentKey, parent: HeadId | None, current: HeadDescriptor | None
) -> None:
    if parent != (None if current is None else current.head_id):
        raise Conflict(f"head parent {parent} is not the current head {None if current is None else current.head_id}")


def _promote_if_certified(state: EdgeState, experiment: ExperimentKey, head_id: HeadId) -> tuple[HeadDescriptor, bool]:
    head = state.store.proposal(experiment, head_id)
    assert head is not None  # the callers stored or found it
    vouching = head.signers(state.network.validator_key_set)
    if len(vouching) < state.network.quorum:
        return head, False
    certificate = tuple(
        a for a in head.certificate if a.validator_key in vouching and a.validator_key != head.validator_key
    )
    head = replace(head, certificate=certificate)
    if state.store.promote_head(head, state.clock.now_ms(), state.network.revision):
        head_taken(state, head)
    return head, True


def head_taken(state: EdgeState, head: HeadDescriptor) -> None:
    """What follows ``head`` becoming this edge's current head (certified here, or mirrored from the
    edge it follows: ``server.follower``): it is announced, long polls on the head wake, old
    candidates' artifacts go and the pending verdicts it decides are settled."""
    state.metrics.heads.inc()
    state.hub.publish(head.experiment, "heads", head.to_wire())
    state.hub.head_changed(head.experiment)
    _retire(state, head.experiment)
    _settle_votes(state, head)


def _quorum_event(
    what: str, head: HeadDescriptor, rivals: list[HeadId], validator_key: bytes | None = None
) -> dict[str, object]:
    return {
        "event": what,
        "head_id": head.head_id,
        "parent": head.parent,
        "window": head.window,
        "proposer": b64encode(head.validator_key),
        "validator": b64encode(validator_key or head.validator_key),
        "rivals": rivals,
    }


def _retire(state: EdgeState, experiment: ExperimentKey) -> None:
    """Delete the artifacts of candidates whose window is judged and old enough; lineage keeps heads
    (blobs are content-addressed: one whose bytes are also a head's stays). Forget the leases of
    windows older still (``lease_retention_windows``)."""
    keep = state.settings.candidate_retention_windows
    if keep > 0:
        for cid in state.store.retire_candidates(experiment, keep):
            if state.store.head(experiment, HeadId(cid)) is None:
                state.blobs.delete(ContentId(cid))
    if state.settings.lease_retention_windows > 0:
        state.store.retire_leases(experiment, state.settings.lease_retention_windows)


def accept_verdicts(
    state: EdgeState, descriptors: Sequence[object], *, route: ExperimentKey | None = None
) -> tuple[int, int]:
    """Check every verdict (its experiment, a validator's signature, its candidate received here and
    not contradicted by the canonical lineage: ``protocol.credit.settle``) before keeping any, so a
    batch with one bad verdict is refused whole; then count those that count now
    (``protocol.credit.counts``) and hold the others as pending. Returns how many count now and how
    many are held."""
    verdicts = [Verdict.from_wire(descriptor) for descriptor in descriptors]
    settled = []
    for verdict in verdicts:
        _same_experiment(verdict.experiment, route)
        _signed_by_validator(state, verdict, "verdict")
        outcome, why, examples = _settle(state, verdict)
        if outcome is Settled.CONTRADICTS:
            raise Conflict(f"the verdict on {verdict.candidate_id} contradicts the canonical lineage: {why}")
        settled.append((verdict, outcome, examples))
    counted = sum(_keep(state, verdict, outcome, examples) for verdict, outcome, examples in settled)
    return counted, len(settled) - counted


def _settle(state: EdgeState, verdict: Verdict) -> tuple[Settled, str, int]:
    """How ``verdict`` stands against the canonical lineage (``protocol.credit.settle``), why, and the
    examples it credits should it count; ``NotFound`` when its candidate was never received here."""
    found = state.store.decided_by(verdict.experiment, ContentId(verdict.candidate_id), DECIDING_HEADS)
    if found is None:
        raise NotFound(f"no candidate {verdict.candidate_id} of {verdict.experiment} was received here")
    candidate, lease, deciding = found
    leased = 0
    if lease is not None:
        local_epochs = state.experiment(verdict.experiment).local_epochs
        leased = leased_examples(lease, state.dataset(lease.dataset_id), local_epochs)
    outcome, why = settle(verdict, candidate, deciding)
    counted = state.store.counted_verdict(verdict.experiment, candidate.candidate_id)
    if outcome is not Settled.CONTRADICTS and counted is not None and not agree(verdict, counted):
        outcome, why = Settled.CONTRADICTS, f"the verdict that counts for {candidate.candidate_id} decided otherwise"
    return outcome, why, credited_examples(verdict, candidate, leased)


def _keep(state: EdgeState, verdict: Verdict, outcome: Settled, examples: int) -> bool:
    """Count ``verdict`` (crediting ``examples``) if it counts now, else hold it as this validator's
    vote on its candidate; True when it counts."""
    cid = ContentId(verdict.candidate_id)
    if state.store.counted_verdict(verdict.experiment, cid) is not None:
        return True  # the same decision counts already (``_settle`` refused another): nothing to hold
    agreeing = 0
    if not (outcome is Settled.BORNE_OUT and not verdict.accepted):
        state.store.add_vote(verdict)
        agreeing = same_decision(verdict, state.store.votes(verdict.experiment, cid), state.network.validator_key_set)
    if not counts(verdict, outcome, agreeing, state.network.quorum):
        return False
    if state.store.add_verdict(verdict, examples):
        state.hub.publish(verdict.experiment, "verdicts", verdict.to_wire())
    if state.network.quorum == 1:
        state.store.drop_votes(verdict.experiment, cid)  # the verdict is its own certificate
    else:  # the agreeing votes stay: what made it count, for the edges that follow this one
        for vote in state.store.votes(verdict.experiment, cid):
            if not agree(vote, verdict):
                state.store.drop_votes(verdict.experiment, cid, vote.validator_key)
    return True


def _settle_votes(state: EdgeState, head: HeadDescriptor) -> None:
    """Settle the pending verdicts that ``head``, canonical now, decides (on candidates of its parent's
    and grandparent's windows): one that counts now is counted, contradicted ones are dropped."""
    parent = None if head.parent is None else state.store.head(head.experiment, head.parent)
    bases = tuple(h for h in (head.parent, None if parent is None else parent.parent) if h is not None)
    if not bases:
        return
    for cid in state.store.voted_candidates(head.experiment, bases):
        for vote in state.store.votes(head.experiment, cid):
            outcome, _, examples = _settle(state, vote)
            if outcome is Settled.CONTRADICTS:
                state.store.drop_votes(head.experiment, cid, vote.validator_key)
            elif _keep(state, vote, outcome, examples):
                break


def accept_verdict(state: EdgeState, descriptor: object, *, route: ExperimentKey | None = None) -> tuple[Verdict, bool]:
    """Take one verdict as ``accept_verdicts`` does; returns it and whether it counts now (else held)."""
    verdict = Verdict.from_wire(descriptor)
    counted, _ = accept_verdicts(state, [descriptor], route=route)
    return verdict, counted == 1


async def accept_order(state: EdgeState, signed: SignedRunControl, *, route: ExperimentKey) -> dict[str, Any]:
    """Apply a run-control order submitted for experiment ``route`` (or mirrored from the edge this one
    follows) and publish it: ``InvalidMessage`` for an order of another experiment, ``SignatureError``
    without the network's quorum, ``NotFound`` for a rollback to a head not canonical here, ``Conflict``
    out of sequence or after ``stop``. Returns the published event: ``applied_order`` and the state it
    leaves."""
    if signed.order.experiment != route:
        raise InvalidMessage(f"the order is for experiment {signed.order.experiment}, not {route}")
    signed.effective_signers(order_network(state.networks, route, signed.order.sequence))
    target = signed.order.target
    if signed.order.action == "rollback" and target is not None and state.store.head(route, HeadId(target)) is None:
        raise NotFound(f"experiment {route} has no canonical head {target} to roll back to")
    now_ms = state.clock.now_ms()
    run_state = await state.offload(state.store.apply_run_control, signed, now_ms, state.network.revision)
    event = {**applied_order(state, signed, now_ms), "state": run_state.to_wire()}
    state.hub.publish(route, "control", event)
    return event


def applied_order(state: EdgeState, signed: SignedRunControl, applied_at_ms: int) -> dict[str, Any]:
    """An applied order as the edge shows it: the order and its signatures, when this edge's store
    applied it, and the fingerprints of the validators whose signature is valid (``signers``: of the network
    whose validators applied it, ``order_network``)."""
    order = signed.order
    signers = sorted(
        fingerprint(key) for key in signed.signers(order_network(state.networks, order.experiment, order.sequence))
    )
    return {**signed.to_wire(), "applied_at_ms": applied_at_ms, "signers": signers}
