"""Staged uploads over HTTP (``protocol.uploads``): an artifact too large for one request, in chunks
that resume after a broken connection, before the envelope that publishes it (``intake``).

Writing and asking both need the ``candidate`` role on an admission network (trainers and
validators). Nothing here serves staged bytes back: they are no artifact until published.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from protocol.errors import IntegrityError, InvalidMessage, TooLarge
from protocol.ids import ContentId
from protocol.uploads import OFFSET_HEADER, parse_content_range

from .deps import Experiment, State, body_doc, client_address, read_body
from .errors import Conflict, Forbidden, NotFound, QuotaExceeded, Unauthorized, documented
from .experiment_routes import EXPERIMENT
from .intake import counting_rejections
from .responses import JSON

router = APIRouter(prefix="/v1", tags=["experiments"])

UPLOAD = f"{EXPERIMENT}/uploads/{{cid}}"
ContentPath = Annotated[str, Path(max_length=80)]


@router.put(
    UPLOAD,
    responses=documented(
        InvalidMessage, IntegrityError, TooLarge, Unauthorized, Forbidden, NotFound, Conflict, QuotaExceeded
    ),
    openapi_extra=body_doc(
        "application/octet-stream", "one chunk: the bytes of the artifact that the Content-Range header names"
    ),
)
async def put_chunk(key: Experiment, cid: ContentPath, state: State, request: Request) -> JSON:
    """Stage one chunk of the artifact ``cid`` (``Content-Range: bytes first-last/total``, at most
    ``upload_chunk_bytes``) where the stage ends; answers the offset after it.

    409 (with ``Upload-Offset``) for a chunk that starts anywhere else, 413 for a chunk or an artifact
    over the limits, 507 past the staging budgets; when the last byte arrives, 422 if the artifact
    does not hash to ``cid`` (the stage is discarded). Publish it with an envelope without artifact
    bytes."""
    with counting_rejections(state):
        state.admission.check_header(request.headers.get("authorization"), "candidate")
        content = ContentId(cid)
        limit = state.artifact_limit(key)
        start, end, total = parse_content_range(request.headers.get("content-range"))
        if end - start > state.settings.upload_chunk_bytes:
            raise TooLarge(f"a chunk of {end - start} bytes; chunks are at most {state.settings.upload_chunk_bytes}")
        state.uploads.expect(key, content, start, total, client_address(request), limit)
        chunk = await read_body(request, end - start)
        if len(chunk) != end - start:
            raise InvalidMessage(f"Content-Range names {end - start} bytes, the body has {len(chunk)}")
        offset = await state.uploads.append(key, content, start, chunk)
    return _offset(offset, total, state.settings.upload_chunk_bytes)


@router.get(UPLOAD, responses=documented(InvalidMessage, Unauthorized, Forbidden, NotFound))
@router.head(UPLOAD)
async def upload_offset(key: Experiment, cid: ContentPath, state: State, request: Request) -> JSON:
    """How much of ``cid`` this edge holds staged: ``offset`` bytes (0 when nothing: start there) of
    ``total`` (null when unknown), also in ``Upload-Offset``, and the largest chunk it takes."""
    state.admission.check_header(request.headers.get("authorization"), "candidate")
    state.experiment(key)
    offset, total = state.uploads.offset(key, ContentId(cid))
    return _offset(offset, total, state.settings.upload_chunk_bytes)


def _offset(offset: int, total: int | None, chunk_bytes: int) -> JSON:
    return JSON(
        {"offset": offset, "total": total, "complete": offset == total, "chunk_bytes": chunk_bytes},
        headers={OFFSET_HEADER: str(offset), "cache-control": "no-store"},
    )
