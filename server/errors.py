"""The one place where errors become HTTP statuses and WebSocket close codes.

    ProtocolError (protocol.errors)        bad input from the network
     ├── InvalidMessage     400 / 4400
     ├── CodecError         400 / 4400
     ├── IntegrityError     422 / 4422
     ├── SignatureError     401 / 4401
     └── TooLarge           413 / 1009
    EdgeError (here)                       a request the edge understands but refuses
     ├── NotFound           404 / 4404
     ├── Unauthorized       401 / 4401   missing credentials (lease, join)
     ├── Forbidden          403 / 4403   credentials that do not cover the request
     ├── Conflict           409 / 4409   e.g. a head whose parent is not the current head
     │    └── Halted        409 / 4409   the experiment is paused or stopped by run control
     ├── RateLimited        429 / 4429
     ├── QuotaExceeded      507 / 4507   e.g. a window's candidate storage is full
     └── Unavailable        503 / 1013   e.g. the shared store is unreachable for now (try again later)

The framework's own refusals (no such route 404, method not allowed 405, a path or query parameter
out of bounds 400 ``InvalidMessage``) answer in the same ``{"error", "detail"}`` shape.

A client that closes its connection mid-request (starlette's ``ClientDisconnect``: an aborted
upload) costs one log line, without a traceback; there is no one left to answer.

Close codes the relay uses on its own: 4408 (join or heartbeat timeout), 4410 (the admission token the
connection joined with was revoked or expired), 4413 (slow consumer), 1001 (server shutting down),
1009 (frame over the size limit, sent by the WebSocket layer).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from protocol.errors import CodecError, IntegrityError, InvalidMessage, ProtocolError, SignatureError, TooLarge

from .responses import JSON

__all__ = [
    "CLOSE_HEARTBEAT_TIMEOUT",
    "CLOSE_REVOKED",
    "CLOSE_SLOW_CONSUMER",
    "Conflict",
    "EdgeError",
    "ErrorBody",
    "Forbidden",
    "Halted",
    "NotFound",
    "QuotaExceeded",
    "RateLimited",
    "Unauthorized",
    "Unavailable",
    "close_code_for",
    "documented",
    "install_handlers",
    "replace_validation_docs",
    "status_for",
]

log = logging.getLogger(__name__)

CLOSE_HEARTBEAT_TIMEOUT = 4408
CLOSE_REVOKED = 4410
CLOSE_SLOW_CONSUMER = 4413


class EdgeError(Exception):
    """A well-formed request that the edge refuses; ``headers`` go with the HTTP answer (e.g. where a
    staged upload goes on: ``protocol.uploads.OFFSET_HEADER``)."""

    def __init__(self, detail: str = "", headers: Mapping[str, str] | None = None) -> None:
        super().__init__(detail)
        self.headers = dict(headers or {})


class NotFound(EdgeError):
    pass


class Unauthorized(EdgeError):
    pass


class Forbidden(EdgeError):
    pass


class Conflict(EdgeError):
    pass


class Halted(Conflict):
    """An experiment that run control paused or stopped (``protocol.run_control``): ask again later, on
    the same head."""


class RateLimited(EdgeError):
    pass


class QuotaExceeded(EdgeError):
    pass


class Unavailable(EdgeError):
    pass


_TABLE: dict[type[Exception], tuple[int, int]] = {
    InvalidMessage: (400, 4400),
    CodecError: (400, 4400),
    IntegrityError: (422, 4422),
    SignatureError: (401, 4401),
    TooLarge: (413, 1009),
    NotFound: (404, 4404),
    Unauthorized: (401, 4401),
    Forbidden: (403, 4403),
    Conflict: (409, 4409),
    RateLimited: (429, 4429),
    QuotaExceeded: (507, 4507),
    Unavailable: (503, 1013),
}


def _lookup(exc: Exception) -> tuple[int, int]:
    for cls in type(exc).__mro__:
        if cls in _TABLE:
            return _TABLE[cls]
    return 500, 1011


class ErrorBody(BaseModel):
    """What every refusal answers over HTTP."""

    error: str
    detail: str


def documented(*errors: type[Exception]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for a route that may refuse with ``errors``: each status they map to,
    with the error names it stands for and the ``ErrorBody`` schema."""
    names: dict[int, list[str]] = {}
    for error in errors:
        names.setdefault(_lookup(error())[0], []).append(error.__name__)
    return {
        status: {"model": ErrorBody, "description": " or ".join(sorted(error_names))}
        for status, error_names in sorted(names.items())
    }


def replace_validation_docs(schema: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI ``schema`` with FastAPI's generated "422 Validation Error" answers documented as what
    the edge really sends for them (``install_handlers``): 400 ``InvalidMessage`` as an ``ErrorBody``."""
    schemas = schema.get("components", {}).get("schemas", {})
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if responses.get("422", {}).get("description") == "Validation Error":
                del responses["422"]
                body = {"schema": {"$ref": "#/components/schemas/ErrorBody"}}
                responses.setdefault("400", {"description": "InvalidMessage", "content": {"application/json": body}})
    if "ErrorBody" not in schemas and schemas:
        schemas["ErrorBody"] = ErrorBody.model_json_schema()
    for generated in ("HTTPValidationError", "ValidationError"):
        schemas.pop(generated, None)
    return schema


def status_for(exc: Exception) -> int:
    return _lookup(exc)[0]


def close_code_for(exc: Exception) -> int:
    return _lookup(exc)[1]


def install_handlers(app: FastAPI) -> None:
    """Every refusal answers ``{"error": <name>, "detail": <text>}``: the edge's own errors by the table,
    the framework's (no such route, method not allowed, a parameter out of bounds) in the same shape."""

    def answer(request: Request, status: int, error: str, detail: str) -> JSON:
        log.info("%s %s -> %d %s: %s", request.method, request.url.path, status, error, detail)
        return JSON({"error": error, "detail": detail}, status_code=status)

    async def handle(request: Request, exc: Exception) -> JSON:
        response = answer(request, status_for(exc), type(exc).__name__, str(exc))
        response.headers.update(getattr(exc, "headers", {}))
        return response

    async def handle_http(request: Request, exc: Exception) -> JSON:
        assert isinstance(exc, StarletteHTTPException)
        error = HTTPStatus(exc.status_code).phrase.title().replace(" ", "").replace("-", "")
        response = answer(request, exc.status_code, error, str(exc.detail))
        response.headers.update(exc.headers or {})
        return response

    async def handle_validation(request: Request, exc: Exception) -> JSON:
        assert isinstance(exc, RequestValidationError)
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        return answer(request, 400, InvalidMessage.__name__, problems)

    async def handle_gone(request: Request, exc: Exception) -> Response:
        client = request.client.host if request.client else "unknown"
        log.info("%s %s: client %s closed the connection mid-request", request.method, request.url.path, client)
        return Response(status_code=400)  # sent nowhere: uvicorn drops what goes to a closed connection

    app.add_exception_handler(ProtocolError, handle)
    app.add_exception_handler(EdgeError, handle)
    app.add_exception_handler(StarletteHTTPException, handle_http)
    app.add_exception_handler(RequestValidationError, handle_validation)
    app.add_exception_handler(ClientDisconnect, handle_gone)
