"""Security headers on every HTTP response of the edge, as one pure ASGI middleware (no
``BaseHTTPMiddleware``: streamed files and WebSockets pass through untouched).

    X-Content-Type-Options: nosniff    a body is only ever what its Content-Type says
    Referrer-Policy: no-referrer       URLs (lease ids in shard queries, admission tokens) never leak
    Content-Security-Policy            PAGE_POLICY: the web app's own scripts, its Web Worker and the
                                       self-hosted Pyodide (WebAssembly needs 'wasm-unsafe-eval'),
                                       fetch and WebSockets to this origin only, never framed

The policy goes on every response, not only the page: a dedicated worker takes its policy from its
own script's response (``/static/worker.js``), and anything else rendered by mistake stays inert.
FastAPI's interactive docs (``/docs``, ``/redoc``) load Swagger UI / ReDoc from a CDN with an inline
script, so they get only the directives that do not restrict loading (``DOCS_POLICY``).
WebSocket handshakes the edge refuses (``websocket.http.response``) carry the same headers.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["DOCS_POLICY", "PAGE_POLICY", "SecurityHeaders"]

DOCS_POLICY = "frame-ancestors 'none'; object-src 'none'; base-uri 'none'"
PAGE_POLICY = f"default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; connect-src 'self'; {DOCS_POLICY}"
_COMMON = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]
_STARTS = {"http.response.start", "websocket.http.response.start"}


class SecurityHeaders:
    """Adds the headers above to every response of ``app``; ``docs_paths`` get ``DOCS_POLICY``."""

    def __init__(self, app: ASGIApp, *, docs_paths: Iterable[str] = ()) -> None:
        self.app = app
        self.docs_paths = frozenset(docs_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        policy = DOCS_POLICY if scope["path"] in self.docs_paths else PAGE_POLICY
        added = [*_COMMON, (b"content-security-policy", policy.encode())]

        async def send_with_headers(message: Message) -> None:
            if message["type"] in _STARTS:
                message = {**message, "headers": [*message.get("headers", ()), *added]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
