"""FastAPI dependencies shared by the route modules."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Depends, Path, Request
from starlette.requests import HTTPConnection

from protocol.errors import InvalidMessage, TooLarge
from protocol.ids import ExperimentId, ExperimentKey, RevisionId, StudyId

from .leasing import LeaseIssuer
from .state import EdgeState

__all__ = ["Experiment", "Issuer", "State", "body_doc", "client_address", "read_body", "read_json"]


# Coroutines, so that FastAPI resolves them on the event loop instead of handing each to a worker
# thread as it does a plain function (a few times cheaper on the hot routes).
async def _state(request: Request) -> EdgeState:
    state: EdgeState = request.app.state.edge
    return state


async def _issuer(request: Request) -> LeaseIssuer:
    issuer: LeaseIssuer = request.app.state.issuer
    return issuer


async def _experiment(
    study: Annotated[str, Path(max_length=64)],
    experiment: Annotated[str, Path(max_length=64)],
    revision: Annotated[str, Path(max_length=64)],
) -> ExperimentKey:
    return ExperimentKey(StudyId(study), ExperimentId(experiment), RevisionId(revision))


State = Annotated[EdgeState, Depends(_state)]
Issuer = Annotated[LeaseIssuer, Depends(_issuer)]
Experiment = Annotated[ExperimentKey, Depends(_experiment)]


def body_doc(media_type: str, description: str) -> dict[str, Any]:
    """OpenAPI ``openapi_extra`` for a route that reads its body itself with ``read_body``."""
    schema = {"type": "string", "format": "binary"} if media_type == "application/octet-stream" else {"type": "object"}
    return {"requestBody": {"required": True, "description": description, "content": {media_type: {"schema": schema}}}}


def client_address(connection: HTTPConnection) -> str:
    """The client's address as the edge sees it (behind a proxy: the proxy's, unless uvicorn is told
    to trust its forwarded headers)."""
    return connection.client.host if connection.client else "unknown"


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (``TooLarge``) as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"body of {declared} bytes exceeds {limit}")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, limit: int) -> Any:
    """The request body parsed as JSON (``InvalidMessage`` if it is not), refused past ``limit`` bytes."""
    try:
        return orjson.loads(await read_body(request, limit))
    except orjson.JSONDecodeError:
        raise InvalidMessage("body is not JSON") from None
