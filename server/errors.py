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
     ├── RateLimited        429 / 4429
     └── QuotaExceeded      507 / 4507   e.g. a window's candidate storage is full

Close codes the relay uses on its own: 4408 (join or heartbeat timeout), 4413 (slow consumer),
1001 (server shutting down), 1009 (frame over the size limit, sent by the WebSocket layer).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request

from protocol.errors import CodecError, IntegrityError, InvalidMessage, ProtocolError, SignatureError, TooLarge

from .responses import JSON

__all__ = [
    "CLOSE_HEARTBEAT_TIMEOUT",
    "CLOSE_SLOW_CONSUMER",
    "Conflict",
    "EdgeError",
    "Forbidden",
    "NotFound",
    "QuotaExceeded",
    "RateLimited",
    "Unauthorized",
    "close_code_for",
    "install_handlers",
    "status_for",
]

log = logging.getLogger(__name__)

CLOSE_HEARTBEAT_TIMEOUT = 4408
CLOSE_SLOW_CONSUMER = 4413


class EdgeError(Exception):
    """A well-formed request that the edge refuses."""


class NotFound(EdgeError):
    pass


class Unauthorized(EdgeError):
    pass


class Forbidden(EdgeError):
    pass


class Conflict(EdgeError):
    pass


class RateLimited(EdgeError):
    pass


class QuotaExceeded(EdgeError):
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
}


def _lookup(exc: Exception) -> tuple[int, int]:
    for cls in type(exc).__mro__:
        if cls in _TABLE:
            return _TABLE[cls]
    return 500, 1011


def status_for(exc: Exception) -> int:
    return _lookup(exc)[0]


def close_code_for(exc: Exception) -> int:
    return _lookup(exc)[1]


def install_handlers(app: FastAPI) -> None:
    async def handle(request: Request, exc: Exception) -> JSON:
        status = status_for(exc)
        log.info("%s %s -> %d %s: %s", request.method, request.url.path, status, type(exc).__name__, exc)
        return JSON({"error": type(exc).__name__, "detail": str(exc)}, status_code=status)

    app.add_exception_handler(ProtocolError, handle)
    app.add_exception_handler(EdgeError, handle)
