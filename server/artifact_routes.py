"""Artifacts by content id: head and candidate model bytes, immutable, over HTTP."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from protocol.errors import InvalidMessage
from protocol.ids import ContentId

from .admission import reads_as_validator
from .deps import State
from .errors import Forbidden, NotFound, RateLimited, Unauthorized, documented
from .responses import immutable_file

router = APIRouter(prefix="/v1", tags=["artifacts"])


@router.get("/artifacts/{cid}", responses=documented(InvalidMessage, NotFound, Unauthorized, Forbidden, RateLimited))
@router.head("/artifacts/{cid}")
async def artifact(cid: str, state: State, request: Request) -> Response:
    """An artifact by content id: immutable, ETag = content id, conditional GET, HEAD and Range.

    Heads are public. A candidate's artifact is served to validators only while its window is open
    (a signed ``READ_PROOF_HEADER``), to anyone after (with admission on: to validator tokens only)."""
    content = ContentId(cid)
    if not state.blobs.exists(content):
        raise NotFound(f"no artifact {cid}")
    window = state.store.candidate_window(content)
    if window is not None:
        state.admission.check_header(request.headers.get("authorization"), "read_candidates")
        experiment, base = window
        current = state.store.current_head(experiment)
        open_window = current is not None and current.head_id == base
        if open_window and not reads_as_validator(
            request, state.network.validator_key_set, state.clock.now_ms(), state.read_proofs
        ):
            raise Forbidden("a candidate of an open window is read by validators only, until the window closes")
    path = state.blobs.path(content)
    response = immutable_file(request, path, content, private=window is not None)
    if window is None and request.method == "GET" and response.status_code == 200 and "range" not in request.headers:
        state.metrics.head_bytes.inc(path.stat().st_size)  # a head (or its outer state), in full
    return response
