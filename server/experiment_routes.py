"""An experiment's window, over HTTP: its heads, leases, candidates and verdicts.

Reads of heads and verdicts are public (anyone may verify the model); with admission on, leases and
candidates are read by validators only. Writes carry their own signatures and, with admission on, a
token whose role allows them (``admission``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import StringConstraints

from protocol.envelope import MAX_DESCRIPTOR_BYTES
from protocol.errors import CodecError, IntegrityError, InvalidMessage, SignatureError, TooLarge
from protocol.ids import ContentId, HeadId, LeaseId, PeerId
from protocol.lease_work import MAX_NONCE
from protocol.leases import MAX_CACHE_BYTES
from protocol.messages import (
    CANDIDATE_PAGE,
    CURRENT_HEAD_HEADER,
    EVALUATION_PAGE,
    NEXT_SINCE_HEADER,
    VERDICT_BATCH,
    PeerProof,
)
from protocol.signing import b64encode

from .admission import reads_as_validator
from .deps import Experiment, Issuer, State, body_doc, client_address, read_body, read_json
from .errors import Conflict, Forbidden, NotFound, QuotaExceeded, RateLimited, Unauthorized, documented
from .intake import (
    accept_attestation,
    accept_candidate,
    accept_evaluation,
    accept_head,
    accept_outer_state,
    accept_verdict,
    accept_verdicts,
)
from .responses import IMMUTABLE, JSON, conditional_get

router = APIRouter(prefix="/v1", tags=["experiments"])

EXPERIMENT = "/experiments/{study}/{experiment}/{revision}"
LEASE_PROOF_MAX_AGE_MS = 120_000
ENVELOPE = (
    "DTN1 envelope: b'DTN1', a 4-byte big-endian descriptor length, the signed descriptor as JSON, "
    "then the safetensors artifact it names by content id"
)
_READ = documented(InvalidMessage, NotFound)
MAX_EVALUATION_BYTES = 16 << 10
_GUARDED_READ = documented(InvalidMessage, NotFound, Unauthorized, Forbidden)
_PROVEN_READ = documented(InvalidMessage, NotFound, Unauthorized, Forbidden, RateLimited)  # read proofs: replay.Once
_UPLOAD = (InvalidMessage, CodecError, IntegrityError, SignatureError, TooLarge, Unauthorized, Forbidden, NotFound)


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        continue


async def _long_poll(request: Request, waiting: Awaitable[Any]) -> None:
    """Await ``waiting`` unless the client leaves first: a long poll whose client closed its connection
    (a peer that stopped, or moved on) ends then, instead of holding a task for the rest of its wait."""
    tasks = {asyncio.ensure_future(waiting), asyncio.ensure_future(_until_disconnected(request))}
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for task in done:
        task.result()  # a failed wait is the request's error, not a lost task exception


@router.get("/activity", responses=_READ)
async def activity(
    request: Request,
    state: State,
    since: Annotated[str | None, Query(max_length=40)] = None,
    wait_s: Annotated[float, Query(ge=0)] = 0.0,
) -> JSON:
    """``{"since": <token>, "edge_key": <base64>, "network_revision": <n>}``: this edge's activity token
    (``server.hub``), with ``since=<token>&wait_s=N`` answered once a candidate, lease, head, quorum or
    network event of any experiment moved it, or after N s, the key this edge signs leases with and the revision of the network it
    serves (as ``/v1/network`` serves them). Validators wait here instead of polling; the token says only
    that something happened, the key that the edge is still the one they follow (a replaced edge signs
    with another), the revision whether the network's terms changed."""
    await _long_poll(request, state.hub.wait_activity(since, min(wait_s, state.settings.max_long_poll_s)))
    key = state.network.edge_key
    answer = {"since": state.hub.activity, "edge_key": None if key is None else b64encode(key)}
    return JSON({**answer, "network_revision": state.network.revision})


@router.get(f"{EXPERIMENT}/head", responses=_READ)
async def current_head(
    request: Request,
    key: Experiment,
    state: State,
    after: Annotated[str | None, Query(max_length=80)] = None,
    wait_s: Annotated[float, Query(ge=0)] = 0.0,
) -> JSON:
    """The current head; with ``after=<head id>&wait_s=N`` waits up to N s for a newer one."""
    state.experiment(key)
    head = state.store.current_head(key)
    if after is not None and head is not None and head.head_id == after and wait_s > 0:
        await _long_poll(request, state.hub.wait_head_change(key, min(wait_s, state.settings.max_long_poll_s)))
        head = state.store.current_head(key)
    if head is None:
        raise NotFound(f"experiment {key} has no head yet")
    return JSON(head.to_wire())


@router.get(f"{EXPERIMENT}/heads", responses=_READ)
async def head_lineage(key: Experiment, state: State) -> JSON:
    """Every head of the experiment, oldest first."""
    state.experiment(key)
    return JSON([head.to_wire() for head in state.store.heads(key)])


@router.get(f"{EXPERIMENT}/heads/{{head_id}}", responses=_READ)
async def one_head(key: Experiment, state: State, head_id: Annotated[str, Path(max_length=80)]) -> JSON:
    """One head of the experiment's lineage, by id."""
    state.experiment(key)
    head = state.store.head(key, HeadId(head_id))
    if head is None:
        raise NotFound(f"experiment {key} has no head {head_id}")
    return JSON(head.to_wire())


@router.get(f"{EXPERIMENT}/heads/{{head_id}}/delta", responses=_READ)
async def head_delta(
    request: Request,
    key: Experiment,
    state: State,
    head_id: Annotated[str, Path(max_length=80)],
    base: Annotated[str, Query(alias="from", max_length=80)],
) -> Response:
    """Head ``head_id``'s artifact as a delta from its parent ``from`` (``protocol.head_delta``: apply it
    to the parent's artifact and check the result against ``head_id``), for a peer that holds the parent;
    immutable. 404 when ``from`` is not the head's parent, or the delta would be no smaller than the head:
    download the artifact then."""
    grid = state.experiment(key).head_grid  # "int8": its heads are on their parents' grid (``protocol.head_grid``)
    delta = await state.head_deltas.delta(state.store, state.blobs, key, HeadId(head_id), base, grid)
    response = conditional_get(request, delta.data, delta.delta_id, cache_control=IMMUTABLE)
    if request.method == "GET" and response.status_code == 200:
        state.metrics.head_delta_bytes.inc(len(delta.data))
    return response


@router.post(
    f"{EXPERIMENT}/heads",
    status_code=201,
    responses=documented(*_UPLOAD, Conflict, RateLimited),
    openapi_extra=body_doc("application/octet-stream", f"{ENVELOPE} (a validator-signed HeadDescriptor)"),
)
async def publish_head(key: Experiment, state: State, request: Request) -> JSON:
    """Propose a head: DTN1 envelope of a validator-signed HeadDescriptor and the artifact.

    201 when it is canonical (``quorum`` validators vouch for it: with a quorum of 1, at once), 202
    while it waits for attestations; 409 when its parent is not the current head; 429 past its
    proposer's budget of proposals for the window, 413 past its budget of bytes (``server.intake``)."""
    state.admission.check_header(request.headers.get("authorization"), "head")
    body = await read_body(request, state.inline_limit(key) + MAX_DESCRIPTOR_BYTES)
    head, canonical = await accept_head(state, body, route=key)
    return JSON(head.to_wire(), status_code=201 if canonical else 202)


@router.post(
    f"{EXPERIMENT}/outer-states",
    status_code=201,
    responses=documented(*_UPLOAD, Conflict, RateLimited),
    openapi_extra=body_doc("application/octet-stream", f"{ENVELOPE} (the proposed head, then its outer state)"),
)
async def publish_outer_state(key: Experiment, state: State, request: Request) -> JSON:
    """Store the outer optimizer state (DiLoCo momentum) a proposed head names, before the head:
    DTN1 envelope of the validator-signed HeadDescriptor and the state artifact. Served like any
    artifact at ``/v1/artifacts/{outer_state}``; 409 when the head's parent is not the current head;
    charged to the proposer's budgets as its head is (429, 413)."""
    state.admission.check_header(request.headers.get("authorization"), "head")
    body = await read_body(request, state.inline_limit(key) + MAX_DESCRIPTOR_BYTES)
    return JSON({"outer_state": await accept_outer_state(state, body, route=key)}, status_code=201)


@router.post(
    f"{EXPERIMENT}/attestations",
    status_code=201,
    responses=documented(InvalidMessage, SignatureError, Unauthorized, Forbidden, NotFound, Conflict),
    openapi_extra=body_doc("application/json", "an Attestation signed by a validator of the network"),
)
async def publish_attestation(key: Experiment, state: State, request: Request) -> JSON:
    """Vouch for a proposed head: a validator-signed ``Attestation`` of exactly that head.

    Answers the head with its certificate so far: 201 once it is canonical, 202 while it waits;
    409 for an attestation of the same head id with another parent, window or merge."""
    state.admission.check_header(request.headers.get("authorization"), "head")
    head, canonical = accept_attestation(state, await read_json(request, 1 << 20), route=key)
    return JSON(head.to_wire(), status_code=201 if canonical else 202)


@router.post(
    f"{EXPERIMENT}/evaluations",
    status_code=201,
    responses=documented(InvalidMessage, SignatureError, TooLarge, Unauthorized, Forbidden, NotFound),
    openapi_extra=body_doc("application/json", "an Evaluation of a head, signed by a validator of the network"),
)
async def publish_evaluation(key: Experiment, state: State, request: Request) -> JSON:
    """Add a validator's evaluation of a head of the lineage (its test-split metrics, measured after
    the head was published): 201 when new, 200 when that validator's evaluation of the head and split
    was there already (the first copy stays); 404 for a head not in the lineage."""
    state.admission.check_header(request.headers.get("authorization"), "head")
    evaluation, created = accept_evaluation(state, await read_json(request, MAX_EVALUATION_BYTES), route=key)
    return JSON(evaluation.to_wire(), status_code=201 if created else 200)


@router.get(f"{EXPERIMENT}/evaluations", responses=_READ)
async def list_evaluations(
    key: Experiment,
    state: State,
    since_window: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=EVALUATION_PAGE)] = EVALUATION_PAGE,
) -> JSON:
    """Validators' evaluations of the experiment's heads of window ``since_window`` or later, by window,
    ``limit`` at most (``EVALUATION_PAGE``): continue from the last one's window to read on (a page
    may repeat the window it ends in). Each is signed: check it against the network's validator keys
    (``protocol.messages.evaluated_metrics``)."""
    state.experiment(key)
    return JSON([e.to_wire() for e in state.store.evaluations(key, since_window, limit)])


@router.get(f"{EXPERIMENT}/proposals", responses=_READ)
async def list_proposals(
    key: Experiment, state: State, parent: Annotated[str | None, Query(max_length=80)] = None
) -> JSON:
    """Heads proposed on top of ``parent`` (the current head when omitted), each with the attestations
    gathered so far as its ``certificate``: rival proposals on one parent are validators disagreeing."""
    state.experiment(key)
    if parent is None:
        current = state.store.current_head(key)
        parent = None if current is None else current.head_id
    return JSON([head.to_wire() for head in state.store.proposals(key, None if parent is None else HeadId(parent))])


@router.post(
    f"{EXPERIMENT}/candidates",
    status_code=201,
    responses=documented(*_UPLOAD, Conflict, RateLimited, QuotaExceeded),
    openapi_extra=body_doc("application/octet-stream", f"{ENVELOPE} (a trainer-signed Candidate)"),
)
async def publish_candidate(key: Experiment, state: State, request: Request) -> JSON:
    """Upload a candidate: DTN1 envelope of a trainer-signed Candidate and the artifact.

    201 when stored (durably, before this answer), 200 when it was already there; 409 when its lease
    already delivered another candidate, 507 when the window's storage quota is full."""
    token = state.admission.check_header(request.headers.get("authorization"), "candidate")
    body = await read_body(request, state.inline_limit(key) + MAX_DESCRIPTOR_BYTES)
    candidate, created = await accept_candidate(
        state, body, via="http", address=client_address(request), token=token, route=key
    )
    return JSON(candidate.to_wire(), status_code=201 if created else 200)


@router.get(f"{EXPERIMENT}/candidates", responses=_PROVEN_READ)
async def list_candidates(
    key: Experiment,
    state: State,
    request: Request,
    base_head: Annotated[str | None, Query(max_length=80)] = None,
    since: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=CANDIDATE_PAGE)] = CANDIDATE_PAGE,
) -> JSON:
    """Candidate descriptors in arrival order (of ``base_head`` when given), one page at a time: at
    most ``limit`` (``CANDIDATE_PAGE`` at most) received after cursor ``since`` (0, the default: from
    the first), and the cursor to continue from in the ``NEXT_SINCE_HEADER`` header (a page shorter
    than ``limit``: nothing more for now), so a follower never lists history twice; the current head's
    id as the page was read in ``CURRENT_HEAD_HEADER`` (none before the genesis), so a follower that
    knows that head need not ask for it. Those of the open window only to validators (a signed
    ``READ_PROOF_HEADER``): a page for anyone else ends before the open window's first candidate (it
    continues there once the window closes). With admission on, to validator tokens only."""
    state.admission.check_header(request.headers.get("authorization"), "read_candidates")
    state.experiment(key)
    validator = reads_as_validator(request, state.network.validator_key_set, state.clock.now_ms(), state.read_proofs)
    current = state.store.current_head(key)
    head = None if base_head is None else HeadId(base_head)
    page, cursor = [], since
    for position, candidate in state.store.candidates_since(key, since, limit, head):
        if not (validator or current is None or candidate.base_head != current.head_id):
            break
        page.append(candidate.to_wire())
        cursor = position
    headers = {NEXT_SINCE_HEADER: str(cursor)} | ({} if current is None else {CURRENT_HEAD_HEADER: current.head_id})
    return JSON(page, headers=headers)


@router.post(
    f"{EXPERIMENT}/leases",
    responses=documented(*_UPLOAD, Conflict, RateLimited),
    openapi_extra=body_doc("application/json", "a PeerProof signed by the trainer, purpose 'lease', issued now"),
)
async def request_lease(
    key: Experiment,
    state: State,
    issuer: Issuer,
    request: Request,
    after: Annotated[str | None, Query(max_length=80)] = None,
    shards: Annotated[int | None, Query(ge=1, le=256)] = None,
    cache_bytes: Annotated[int | None, Query(ge=0, le=MAX_CACHE_BYTES)] = None,
    work: Annotated[int | None, Query(ge=0, le=MAX_NONCE)] = None,
) -> JSON:
    """Lease shards for the current window, or with ``after=<current head id>`` for the window after
    it, before its head exists (``server.leasing``); the body is a ``PeerProof`` with purpose ``lease``.
    ``shards=N`` asks for N shards, within the experiment's ``shards_per_lease`` and
    ``max_shards_per_lease``. ``cache_bytes=B``: the peer keeps B bytes of shards; when they hold the
    whole split, its leases do not keep to its home (``protocol.leases.keeps_home``). ``work=N``: the
    lease's proof of work, where the experiment asks for one (``lease_work_bits``, ``protocol.lease_work``:
    403 without it, 409 when it is not on the current head or its parent).

    The answer is a ``LeaseGrant``: the signed lease and the secret that unlocks its shards."""
    token = state.admission.check_header(request.headers.get("authorization"), "lease")
    proof = PeerProof.from_wire(await read_json(request, 4096))
    if proof.purpose != "lease" or abs(proof.issued_at_ms - state.clock.now_ms()) > LEASE_PROOF_MAX_AGE_MS:
        raise InvalidMessage("lease proof must have purpose 'lease' and a current timestamp")
    state.address_limits.check(client_address(request))  # before the signature is checked
    proof.verify_own()
    state.admission.bind(token, proof.peer_id)
    grant = await issuer.grant(
        key,
        proof.peer_id,
        proof.peer_kind,
        state.admission.principal(token),
        address=client_address(request),
        after=None if after is None else HeadId(after),
        shards=shards,
        cache_bytes=cache_bytes,
        work=work,
    )
    return JSON(grant.to_wire())


@router.get(f"{EXPERIMENT}/leases", responses=_GUARDED_READ)
async def list_leases(
    key: Experiment,
    state: State,
    request: Request,
    base_head: Annotated[list[Annotated[str, StringConstraints(max_length=80)]], Query(min_length=1, max_length=2)],
) -> JSON:
    """The leases granted on one head or two (``base_head`` given once or twice; never their secrets):
    each head's window's, and the next window's granted ahead (``server.leasing``), so a window's leases
    (on its head, and ahead on its parent) are one request; with admission on, validators only."""
    state.admission.check_header(request.headers.get("authorization"), "read_leases")
    state.experiment(key)
    return JSON(
        [lease.to_wire() for head in dict.fromkeys(base_head) for lease in state.store.leases(key, HeadId(head))]
    )


@router.get("/leases/{lease_id}", responses=_GUARDED_READ)
async def get_lease(lease_id: str, state: State, request: Request) -> JSON:
    """One lease (never its secret); with admission on, validators only."""
    state.admission.check_header(request.headers.get("authorization"), "read_leases")
    lease = state.store.lease(LeaseId(lease_id))
    if lease is None:
        raise NotFound(f"no lease {lease_id}")
    return JSON(lease.to_wire())


@router.post(
    f"{EXPERIMENT}/verdicts",
    status_code=201,
    responses={
        202: {"description": "held as pending: it counts once the lineage or the quorum bears it out"},
        **documented(*_UPLOAD, Conflict),
    },
    openapi_extra=body_doc("application/json", "a Verdict signed by a validator of the network"),
)
async def publish_verdict(key: Experiment, state: State, request: Request) -> JSON:
    """Publish a validator-signed verdict on a candidate received here (``server.intake``): 201 when it
    counts (the canonical lineage bears it out, or the quorum signed its decision; the first one per
    candidate is kept), 202 when it is held as pending; 404 for a candidate never received, 409 for a
    verdict the canonical lineage contradicts."""
    state.admission.check_header(request.headers.get("authorization"), "verdict")
    verdict, counted = accept_verdict(state, await read_json(request, 16384), route=key)
    return JSON(verdict.to_wire(), status_code=201 if counted else 202)


@router.post(
    f"{EXPERIMENT}/verdict-batches",
    status_code=201,
    responses=documented(*_UPLOAD, Conflict),
    openapi_extra=body_doc("application/json", f"a list of at most {VERDICT_BATCH} validator-signed Verdicts"),
)
async def publish_verdicts(key: Experiment, state: State, request: Request) -> JSON:
    """Publish a window's verdicts in one request, each checked as ``POST .../verdicts`` checks one;
    refused whole when any of them is refused. Answers how many count now and how many are held."""
    state.admission.check_header(request.headers.get("authorization"), "verdict")
    body = await read_json(request, 16384 * VERDICT_BATCH)
    if not isinstance(body, list) or len(body) > VERDICT_BATCH:
        raise InvalidMessage(f"a verdict batch is a list of at most {VERDICT_BATCH} verdicts")
    counted, pending = accept_verdicts(state, body, route=key)
    return JSON({"published": counted + pending, "counted": counted, "pending": pending}, status_code=201)


@router.get(f"{EXPERIMENT}/verdicts", responses=_READ)
async def list_verdicts(
    key: Experiment, state: State, peer_id: Annotated[str | None, Query(max_length=60)] = None
) -> JSON:
    """The experiment's signed verdicts, newest first (500 at most), optionally of one peer."""
    state.experiment(key)
    return JSON([v.to_wire() for v in state.store.verdicts(key, None if peer_id is None else PeerId(peer_id))])


@router.get(f"{EXPERIMENT}/verdicts/{{candidate_id}}/votes", responses=_READ)
async def verdict_votes(key: Experiment, state: State, candidate_id: Annotated[str, Path(max_length=80)]) -> JSON:
    """The validators' signed verdicts on one candidate held as votes: those waiting for a quorum, or the
    agreeing ones that made its verdict count (from which an edge that follows this one counts it)."""
    state.experiment(key)
    return JSON([v.to_wire() for v in state.store.votes(key, ContentId(candidate_id))])


@router.get(f"{EXPERIMENT}/credit", responses=_READ)
async def leaderboard(key: Experiment, state: State, limit: Annotated[int, Query(ge=1, le=100)] = 20) -> JSON:
    """Contributors by accepted examples, tallied from validator-signed verdicts (``server.credit``)."""
    state.experiment(key)
    return JSON([standing.to_wire() for standing in state.credit.leaderboard(key, limit)])


@router.get(f"{EXPERIMENT}/credit/{{peer_id}}", responses=_READ)
async def standing(key: Experiment, state: State, peer_id: Annotated[str, Path(max_length=60)]) -> JSON:
    """One contributor's standing (zeros for a key with no verdict yet)."""
    state.experiment(key)
    return JSON(state.credit.standing(key, PeerId(peer_id)).to_wire())
