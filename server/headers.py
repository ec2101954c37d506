"""Security headers on every HTTP response of the edge, as one pure ASGI middleware (no
``BaseHTTPMiddleware``: streamed files and WebSockets pass through untouched).

    X-Content-Type-Options: nosniff    a body is only ever what its Content-Type says
    Referrer-Policy: no-referrer       URLs (lease ids in shard queries, admission tokens) never leak
    Content-Security-Policy            ``page_policy``: the web app's own scripts, its Web Worker and
                                       the self-hosted Pyodide (WebAssembly needs 'wasm-unsafe-eval'),
                                       fetch and WebSockets to this origin only (and the ``/livez`` of
                                       each of the edge's mirrors: the page looks for one that is up
                                       before it moves there), never framed

The policy goes on every response, not only the page: a dedicated worker takes its policy from its
own script's response (``/static/worker.js``), and anything else rendered by mistake stays inert.
FastAPI's interactive docs (``/docs``, ``/redoc``) load Swagger UI / ReDoc from a CDN with an inline
script, so they get only the directives that do not restrict loading (``DOCS_POLICY``).
WebSocket handshakes the edge refuses (``websocket.http.response``) carry the same headers.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["DOCS_POLICY", "SecurityHeaders", "page_policy"]

DOCS_POLICY = "frame-ancestors 'none'; object-src 'none'; base-uri 'none'"


def page_policy(mirrors: Iterable[str] = ()) -> str:
    """The page's policy; ``mirrors`` (checked by ``protocol.edge_urls``: no spaces or semicolons) may
    be probed at their ``/livez`` and nowhere else."""
    connect = " ".join(["'self'", *(f"{mirror}/livez" for mirror in mirrors)])
    return f"default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; connect-src {connect}; {DOCS_POLICY}"


_COMMON = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]
_STARTS = {"http.response.start", "websocket.http.response.start"}


class SecurityHeaders:
    """Adds the headers above to every response of ``app``; ``docs_paths`` get ``DOCS_POLICY``, the
    rest ``page_policy(mirrors)``."""

    def __init__(self, app: ASGIApp, *, docs_paths: Iterable[str] = (), mirrors: Iterable[str] = ()) -> None:
        self.app = app
        self.docs_paths = frozenset(docs_paths)
        self.page_policy = page_policy(mirrors)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        policy = DOCS_POLICY if scope["path"] in self.docs_paths else self.page_policy
        added = [*_COMMON, (b"content-security-policy", policy.encode())]

        async def send_with_headers(message: Message) -> None:
            if message["type"] in _STARTS:
                message = {**message, "headers": [*message.get("headers", ()), *added]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
