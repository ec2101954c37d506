"""Connection limits for a public edge: what uvicorn does not bound by itself.

uvicorn (0.55) keeps a connection open for as long as its client trickles request bytes, and
accepts connections until file descriptors run out. ``guarded_http`` returns uvicorn's httptools
protocol with, per server:

* a header deadline: a request's headers (and a new connection's first request) must be complete
  within ``header_timeout_s``, however slowly bytes arrive;
* a body deadline: a request body must be complete within ``body_timeout_s`` of its headers;
* a cap on open connections (HTTP and WebSocket together), at most ``max_connections`` and never
  more than the process's file-descriptor limit allows, and a cap per client address.

A connection over a cap is answered ``503`` and closed at once; one past a deadline is closed. After
the upgrade to a WebSocket, the relay's own join and idle timeouts take over.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .settings import Settings

__all__ = ["ConnectionLimits", "guarded_http", "limits_from"]

log = logging.getLogger(__name__)

FD_RESERVE = 64  # descriptors kept free for the database, blobs, logs and listening sockets
OVER_CAPACITY = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    max_connections_per_address: int

    @property
    def connection_cap(self) -> int:
        """``max_connections``, lowered to what the soft file-descriptor limit leaves room for."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return self.max_connections if soft == resource.RLIM_INFINITY else min(self.max_connections, soft - FD_RESERVE)


def guarded_http(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """uvicorn's HTTP protocol class with ``limits`` applied (pass it as ``uvicorn.Config(http=...)``)."""
    cap = limits.connection_cap

    class GuardedHttp(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            host = self.client[0] if self.client else None
            same_address = sum(1 for c in self.connections if (getattr(c, "client", None) or (None,))[0] == host)
            if len(self.connections) > cap or same_address > limits.max_connections_per_address:
                log.warning(
                    "refusing a connection from %s: %d open, %d from it", host, len(self.connections), same_address
                )
                transport.write(OVER_CAPACITY)
                transport.close()
                return
            self._arm(limits.header_timeout_s, "headers")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._deadline is None:
                self._arm(limits.header_timeout_s, "headers")

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()
            if not self.parser.should_upgrade():
                self._arm(limits.body_timeout_s, "body")

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
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

    return GuardedHttp


def limits_from(settings: Settings) -> ConnectionLimits:
    """The limits in the edge's ``Settings``."""
    return ConnectionLimits(
        settings.header_timeout_s,
        settings.body_timeout_s,
        settings.max_connections,
        settings.max_connections_per_address,
    )
