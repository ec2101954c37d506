"""Heads, candidates, verdicts, leases and artifacts of an experiment, over HTTP."""

from __future__ import annotations

import time
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request, Response

from protocol.envelope import MAX_DESCRIPTOR_BYTES
from protocol.errors import InvalidMessage
from protocol.ids import ContentId, HeadId, LeaseId, PeerId
from protocol.messages import PeerProof

from .deps import Experiment, Issuer, State, read_body
from .errors import NotFound
from .intake import accept_candidate, accept_head, accept_verdict
from .responses import JSON, immutable_file

router = APIRouter(prefix="/v1", tags=["artifacts"])

LEASE_PROOF_MAX_AGE_MS = 120_000


@router.get("/network")
async def network(state: State) -> JSON:
    """The network manifest: validator keys, the edge's key, experiments."""
    return JSON(state.network.to_wire())


@router.get("/experiments/{study}/{experiment}/{revision}/head")
async def current_head(
    key: Experiment,
    state: State,
    after: Annotated[str | None, Query(max_length=80)] = None,
    wait_s: Annotated[float, Query(ge=0)] = 0.0,
) -> JSON:
    """The current head; with ``after=<head id>&wait_s=N`` waits up to N s for a newer one."""
    state.experiment(key)
    head = state.store.current_head(key)
    if after is not None and head is not None and head.head_id == after and wait_s > 0:
        await state.hub.wait_head_change(key, min(wait_s, state.settings.max_long_poll_s))
        head = state.store.current_head(key)
    if head is None:
        raise NotFound(f"experiment {key} has no head yet")
    return JSON(head.to_wire())


@router.get("/experiments/{study}/{experiment}/{revision}/heads")
async def head_lineage(key: Experiment, state: State) -> JSON:
    """Every head of the experiment, oldest first."""
    state.experiment(key)
    return JSON([head.to_wire() for head in state.store.heads(key)])


@router.post("/experiments/{study}/{experiment}/{revision}/heads", status_code=201)
async def publish_head(key: Experiment, state: State, request: Request) -> JSON:
    """Promote a head: DTN1 envelope of a validator-signed HeadDescriptor and the artifact."""
    state.admission.check_header(request.headers.get("authorization"), "head")
    body = await read_body(request, state.settings.max_artifact_bytes + MAX_DESCRIPTOR_BYTES)
    head = await accept_head(state, body, route=key)
    return JSON(head.to_wire(), status_code=201)


@router.post("/experiments/{study}/{experiment}/{revision}/candidates")
async def publish_candidate(key: Experiment, state: State, request: Request) -> JSON:
    """Upload a candidate: DTN1 envelope of a trainer-signed Candidate and the artifact.

    201 when stored (durably, before this answer), 200 when it was already there."""
    state.admission.check_header(request.headers.get("authorization"), "candidate")
    body = await read_body(request, state.settings.max_artifact_bytes + MAX_DESCRIPTOR_BYTES)
    candidate, created = await accept_candidate(state, body, via="http", route=key)
    return JSON(candidate.to_wire(), status_code=201 if created else 200)


@router.get("/experiments/{study}/{experiment}/{revision}/candidates")
async def list_candidates(
    key: Experiment, state: State, base_head: Annotated[str | None, Query(max_length=80)] = None
) -> JSON:
    state.experiment(key)
    return JSON([c.to_wire() for c in state.store.candidates(key, None if base_head is None else HeadId(base_head))])


@router.post("/experiments/{study}/{experiment}/{revision}/leases")
async def request_lease(key: Experiment, state: State, issuer: Issuer, request: Request) -> JSON:
    """Lease shards for the current window; the body is a ``PeerProof`` with purpose ``lease``."""
    state.admission.check_header(request.headers.get("authorization"), "lease")
    proof = PeerProof.from_wire(_json(await read_body(request, 4096)))
    if proof.purpose != "lease" or abs(proof.issued_at_ms - time.time() * 1000) > LEASE_PROOF_MAX_AGE_MS:
        raise InvalidMessage("lease proof must have purpose 'lease' and a current timestamp")
    proof.verify_own()
    state.peer_limits.check(proof.peer_id)
    state.store.saw_peer(proof.peer_id, proof.peer_kind, int(time.time() * 1000))
    lease = await issuer.issue(key, proof.peer_id)
    return JSON(lease.to_wire())


@router.get("/experiments/{study}/{experiment}/{revision}/leases")
async def list_leases(key: Experiment, state: State, base_head: Annotated[str, Query(max_length=80)]) -> JSON:
    state.experiment(key)
    return JSON([lease.to_wire() for lease in state.store.leases(key, HeadId(base_head))])


@router.get("/leases/{lease_id}")
async def get_lease(lease_id: str, state: State) -> JSON:
    lease = state.store.lease(LeaseId(lease_id))
    if lease is None:
        raise NotFound(f"no lease {lease_id}")
    return JSON(lease.to_wire())


@router.post("/experiments/{study}/{experiment}/{revision}/verdicts", status_code=201)
async def publish_verdict(key: Experiment, state: State, request: Request) -> JSON:
    state.admission.check_header(request.headers.get("authorization"), "verdict")
    verdict = accept_verdict(state, _json(await read_body(request, 16384)), route=key)
    return JSON(verdict.to_wire(), status_code=201)


@router.get("/experiments/{study}/{experiment}/{revision}/verdicts")
async def list_verdicts(
    key: Experiment, state: State, peer_id: Annotated[str | None, Query(max_length=60)] = None
) -> JSON:
    state.experiment(key)
    return JSON([v.to_wire() for v in state.store.verdicts(key, None if peer_id is None else PeerId(peer_id))])


@router.get("/artifacts/{cid}")
async def artifact(cid: str, state: State, request: Request) -> Response:
    """An artifact by content id: immutable, ETag = content id, Range supported."""
    content = ContentId(cid)
    if not state.blobs.exists(content):
        raise NotFound(f"no artifact {cid}")
    return immutable_file(request, state.blobs.path(content), content)


def _json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidMessage("body is not JSON") from None
