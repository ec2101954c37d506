"""Artifacts by content id: head and candidate model bytes, immutable, over HTTP."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from protocol.errors import InvalidMessage
from protocol.ids import ContentId

from .deps import State
from .errors import Forbidden, NotFound, Unauthorized, documented
from .responses import immutable_file

router = APIRouter(prefix="/v1", tags=["artifacts"])


@router.get("/artifacts/{cid}", responses=documented(InvalidMessage, NotFound, Unauthorized, Forbidden))
@router.head("/artifacts/{cid}")
async def artifact(cid: str, state: State, request: Request) -> Response:
    """An artifact by content id: immutable, ETag = content id, conditional GET, HEAD and Range.

    Heads are public; with admission on, a candidate's artifact is served to validators only."""
    content = ContentId(cid)
    if not state.blobs.exists(content):
        raise NotFound(f"no artifact {cid}")
    restricted = state.admission.required and state.store.is_candidate_only(content)
    if restricted:
        state.admission.check_header(request.headers.get("authorization"), "read_candidates")
    return immutable_file(request, state.blobs.path(content), content, private=restricted)
