"""Running the edge under uvicorn: in the foreground (``python -m server``) or in a background
thread on a pre-bound socket (``BackgroundEdge``: embedding, tests and benchmarks).

Behind a proxy (``deploy/``) the ASGI app is wrapped, outermost first: ``UnixSocketClients`` (a
connection on the edge's ``unix_socket`` comes from the proxy: its client is named ``unix``),
uvicorn's ``ProxyHeadersMiddleware`` (the client address and scheme from ``X-Forwarded-For``/``-Proto``
when the connection comes from ``forwarded_allow_ips`` or the unix socket), then
``dataset_routes.AccelShards`` with ``accel_prefix``.

uvicorn's access log never holds an admission token: ``HideTokens`` writes ``[hidden]`` for the value
of a ``token`` query parameter and for anything shaped like a token (an old link's ``/?token=…``; the
page takes its token from the URL's fragment, which no browser sends).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import stat
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import TracebackType

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from .app import create_app
from .connections import ACCEPT_BACKLOG, guarded_protocols, limits_from
from .dataset_routes import AccelShards
from .settings import Settings

__all__ = [
    "BackgroundEdge",
    "EdgeServer",
    "HideTokens",
    "UnixSocketClients",
    "bind_unix_socket",
    "edge_app",
    "uvicorn_config",
]

UNIX_CLIENT = "unix"  # the client address of connections on the edge's unix socket
_TOKENS = re.compile(r"(?<=[?&]token=)[^&#\s]*|dtn_[A-Za-z0-9_-]{16,}", re.IGNORECASE)  # server.admission's tokens


class HideTokens(logging.Filter):
    """Writes ``[hidden]`` for admission tokens in a log record's text arguments (uvicorn's access log
    passes the request's path and query as one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_TOKENS.sub("[hidden]", a) if isinstance(a, str) else a for a in record.args)
        return True


class UnixSocketClients:
    """Names the client of a connection on a unix socket (uvicorn gives it no client address, and a
    server address of ``(path, None)``) ``UNIX_CLIENT``, so that it can be trusted as the proxy: only
    processes that may open the socket file reach it, as only local ones reach 127.0.0.1."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        if scope["type"] in ("http", "websocket") and scope.get("client") is None and (not server or server[1] is None):
            scope = {**scope, "client": (UNIX_CLIENT, 0)}
        await self.app(scope, receive, send)


def edge_app(settings: Settings, app: ASGIApp) -> ASGIApp:
    """The edge's app (``create_app``) with what running behind a proxy needs (see the module's docstring)."""
    # behind a proxy, plain shard requests skip the framework (dataset_routes.AccelShards)
    asgi: ASGIApp = AccelShards(app) if settings.accel_prefix else app
    trusted = [host for host in (settings.forwarded_allow_ips, UNIX_CLIENT if settings.unix_socket else "") if host]
    if trusted:
        asgi = ProxyHeadersMiddleware(asgi, trusted_hosts=",".join(trusted))  # type: ignore[arg-type,assignment]
    return UnixSocketClients(asgi) if settings.unix_socket else asgi


def bind_unix_socket(path: Path) -> socket.socket:
    """A listening unix socket at ``path`` (a stale one from an earlier run replaced), which other local
    users (the proxy's) may connect to; who reaches it is up to its directory's permissions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o666)
    return sock


def uvicorn_config(settings: Settings, app: ASGIApp, **overrides: object) -> uvicorn.Config:
    http, ws = guarded_protocols(limits_from(settings))
    options: dict[str, object] = {
        "host": settings.host,
        "port": settings.port,
        "ws": ws,
        "ws_max_size": settings.max_frame_bytes,
        "ws_ping_interval": 20.0,
        "ws_ping_timeout": 20.0,
        "http": http,
        "backlog": ACCEPT_BACKLOG,  # accepted in one batch: server.connections leaves descriptors for it
        "timeout_keep_alive": 5,
        "proxy_headers": False,  # edge_app applies them, trusting forwarded_allow_ips (and the unix socket)
        "log_level": "info",
        "access_log": settings.access_log,
        **overrides,
    }
    config = uvicorn.Config(edge_app(settings, app), **options)  # type: ignore[arg-type]
    access = logging.getLogger("uvicorn.access")  # configured by now (uvicorn.Config does it)
    if not any(isinstance(f, HideTokens) for f in access.filters):
        access.addFilter(HideTokens())
    return config


class EdgeServer(uvicorn.Server):
    """The edge under uvicorn. As it begins to shut down it ends the long polls it holds
    (``Hub.end_waits``), which would otherwise hold its graceful shutdown up to ``max_long_poll_s``."""

    def __init__(self, settings: Settings, **overrides: object) -> None:
        self.app = create_app(settings)
        super().__init__(uvicorn_config(settings, self.app, **overrides))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state = getattr(self.app.state, "edge", None)  # set once the app has started
        if state is not None:
            state.hub.end_waits()
        await super().shutdown(sockets)


class BackgroundEdge:
    """An edge serving in a daemon thread; ``url`` is ready when ``start()`` returns."""

    def __init__(self, settings: Settings, *, startup_timeout_s: float = 20.0, **overrides: object) -> None:
        """``overrides``: uvicorn options over ``uvicorn_config``'s (default ``log_level="warning"``)."""
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((settings.host, settings.port))
        self.settings = replace(settings, port=self._socket.getsockname()[1])
        self.url = f"http://{self.settings.host}:{self.settings.port}"
        self._server = EdgeServer(self.settings, **{"log_level": "warning", **overrides})
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)
        self._startup_timeout_s = startup_timeout_s

    def start(self) -> BackgroundEdge:
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("edge failed to start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()

    def __enter__(self) -> BackgroundEdge:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
