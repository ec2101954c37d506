"""Connection limits for a public edge: what uvicorn does not bound by itself.

uvicorn (0.55) keeps a connection open for as long as its client trickles request bytes, and
accepts connections until file descriptors run out. ``guarded_protocols`` returns uvicorn's httptools
HTTP protocol and websockets-sansio WebSocket protocol with, per server:

* a header deadline: a request's headers (and a new connection's first request) must be complete
  within ``header_timeout_s``, however slowly bytes arrive;
* a body deadline: a request body must be complete within ``body_timeout_s`` of its headers;
* a budget of open connections, HTTP and WebSocket alike (``server.budget``): at most
  ``max_connections_per_address`` from one address (an IPv6 /64 counts as one), at most
  ``connection_cap`` in total, where the heaviest address gives way to a newcomer from a lighter one
  (its oldest connection is shed), and ``reserved_connections`` more that only ``/healthz``,
  ``/livez`` and ``/readyz`` are answered on. The cap and the reserve stay inside the process's
  file-descriptor limit, with room for the edge's own files and one batch of accepted connections
  (``ACCEPT_BACKLOG``): the listening socket never fails for want of a descriptor.

Refusals follow ``server.errors``: over the per-address cap, 429 ``RateLimited`` at once; over the
cap with no reserve left, 503 ``Unavailable`` at once; a request other than health on a reserved
connection, 503 once its headers are in; all with ``Retry-After`` and the connection closed. A
connection shed to make room gets 503 if it has no answer under way (else it is closed); a shed
WebSocket is closed with 1013 (``Unavailable``: try again later). A connection past a deadline is
closed. After the upgrade to a WebSocket, the relay's own join and idle timeouts take over.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import Counter
from dataclasses import dataclass

import orjson
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from .budget import Admission, ConnectionBudget
from .errors import EdgeError, RateLimited, Unavailable, close_code_for, status_for
from .settings import Settings

__all__ = [
    "ACCEPT_BACKLOG",
    "FD_RESERVE",
    "HEALTH_PATHS",
    "ConnectionLimits",
    "guarded_protocols",
    "limits_from",
]

log = logging.getLogger(__name__)

FD_RESERVE = 64  # descriptors kept free for the database, blobs, logs and listening sockets
ACCEPT_BACKLOG = 128  # the listen backlog, and how many connections the event loop accepts at once
HEALTH_PATHS = frozenset({b"/healthz", b"/livez", b"/readyz"})  # what a reserved connection may ask
RETRY_AFTER_S = 5
TALLY_EVERY_S = 10.0  # refusals and sheds are logged as counts, at most this often


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    max_connections_per_address: int
    reserved_connections: int

    @property
    def connection_cap(self) -> int:
        """``max_connections``, lowered so that the cap, the reserve, one accepted batch and
        ``FD_RESERVE`` fit in the soft file-descriptor limit."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        room = soft - FD_RESERVE - ACCEPT_BACKLOG - self.reserved_connections
        return max(1, min(self.max_connections, room))


def _refusal(error: EdgeError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """``error`` as the edge answers it (``server.errors``), with ``Retry-After`` and the connection closed."""
    body = orjson.dumps({"error": type(error).__name__, "detail": str(error)})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(RETRY_AFTER_S).encode()),
        (b"connection", b"close"),
    ]
    return status_for(error), headers, body


def _raw(error: EdgeError) -> bytes:
    """``_refusal`` as HTTP/1.1 bytes, for a connection refused before a request was read."""
    status, headers, body = _refusal(error)
    lines = [f"HTTP/1.1 {status} {'Too Many Requests' if status == 429 else 'Service Unavailable'}".encode()]
    return b"\r\n".join([*lines, *(name + b": " + value for name, value in headers), b"", body])


OVER_ADDRESS = RateLimited("too many connections from this address; try again later")
AT_CAPACITY = Unavailable("the edge is at its connection capacity; try again later")


class _Tally:
    """Counts of refused and shed connections, logged at most every ``TALLY_EVERY_S`` (a flood would
    otherwise cost a log line per connection)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.since = time.monotonic()

    def add(self, what: str, budget: ConnectionBudget) -> None:
        self.counts[what] += 1
        if time.monotonic() - self.since >= TALLY_EVERY_S:
            summary = ", ".join(f"{n} {what}" for what, n in sorted(self.counts.items()))
            log.warning("connections: %s (%d open, %d reserved)", summary, budget.held, budget.reserved)
            self.counts.clear()
            self.since = time.monotonic()


def guarded_protocols(limits: ConnectionLimits) -> tuple[type[HttpToolsProtocol], type[WebSocketsSansIOProtocol]]:
    """uvicorn's HTTP and WebSocket protocol classes with ``limits`` applied, sharing one budget (pass
    them as ``uvicorn.Config(http=..., ws=...)``)."""
    budget = ConnectionBudget(limits.connection_cap, limits.max_connections_per_address, limits.reserved_connections)
    tally = _Tally()

    async def busy(scope: Scope, receive: Receive, send: Send) -> None:
        """Answers ``AT_CAPACITY``: a request other than health on a reserved connection."""
        tally.add("refused on the reserve", budget)
        status, headers, body = _refusal(AT_CAPACITY)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    class GuardedHttp(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _reserved = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            admission = budget.admit(transport, self.client[0] if self.client else None, self)
            if admission in (Admission.OVER_ADDRESS, Admission.OVER_CAP):
                tally.add(admission.value, budget)
                transport.write(_raw(OVER_ADDRESS if admission is Admission.OVER_ADDRESS else AT_CAPACITY))
                transport.close()
                return
            self._reserved = admission is Admission.RESERVE
            self._arm(limits.header_timeout_s, "headers")

        def shed(self) -> None:
            """Make room for another connection: 503 unless an answer is under way, and close."""
            tally.add("shed", budget)
            if self.transport.is_closing():
                return
            if self.cycle is None or not self.cycle.response_started:
                self.transport.write(_raw(AT_CAPACITY))
            self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._deadline is None:
                self._arm(limits.header_timeout_s, "headers")

        def on_headers_complete(self) -> None:
            self._disarm()
            if self._reserved and self.url.split(b"?", 1)[0] not in HEALTH_PATHS:
                self.app = busy
            super().on_headers_complete()
            if self.parser.should_upgrade():
                return
            if self._reserved:
                self.cycle.keep_alive = False  # one answer per reserved connection (connection: close)
            self._arm(limits.body_timeout_s, "body")

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def handle_websocket_upgrade(self) -> None:
            if self._reserved:
                tally.add("refused on the reserve", budget)
                self.transport.write(_raw(AT_CAPACITY))
                self.transport.close()
                return
            super().handle_websocket_upgrade()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            budget.release(self.transport)
            super().connection_lost(exc)

        def _arm(self, timeout_s: float, part: str) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(timeout_s, self._expire, part)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self, part: str) -> None:
            self._deadline = None
            if self.transport.get_protocol() is self and not self.transport.is_closing():
                log.info("closing a connection from %s: request %s too slow", self.client, part)
                self.transport.close()

    class GuardedWebSocket(WebSocketsSansIOProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            budget.rebind(transport, self)  # its HTTP connection's place in the budget

        def shed(self) -> None:
            """Make room for another connection: close with 1013 (``Unavailable``) and a reason."""
            tally.add("shed", budget)
            if self.transport.is_closing():
                return
            if self.handshake_complete and not self.close_sent:
                self.conn.send_close(close_code_for(AT_CAPACITY), "edge at capacity: try again later")
                self.transport.write(b"".join(self.conn.data_to_send()))
                self.close_sent = True
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            budget.release(self.transport)
            super().connection_lost(exc)

    return GuardedHttp, GuardedWebSocket


def limits_from(settings: Settings) -> ConnectionLimits:
    """The limits in the edge's ``Settings``."""
    return ConnectionLimits(
        settings.header_timeout_s,
        settings.body_timeout_s,
        settings.max_connections,
        settings.max_connections_per_address,
        settings.reserved_connections,
    )
