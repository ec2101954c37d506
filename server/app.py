"""``create_app(settings)``: the edge as an ASGI app."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from . import (
    artifact_routes,
    control_routes,
    dataset_routes,
    experiment_routes,
    follower,
    operations,
    peer_runtime,
    portal,
    relay,
    revision_routes,
    upload_routes,
)
from .errors import install_handlers, replace_validation_docs
from .headers import SecurityHeaders
from .leasing import LeaseIssuer
from .settings import Settings
from .state import EdgeState

__all__ = ["create_app"]


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = EdgeState.open(settings)
        await state.start()
        app.state.edge = state
        app.state.issuer = LeaseIssuer(state)
        operations.register_collector(state)
        tasks = [asyncio.create_task(relay.close_revoked(state))] if state.admission.required else []
        if settings.followed:
            tasks.append(asyncio.create_task(follower.follow(state, settings.followed)))
        try:
            yield
        finally:
            await app.state.issuer.close()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await state.close()

    app = FastAPI(
        title="Decentralized training network edge",
        description="Dataset origin, head artifacts, WebSocket relay and signaling, portal.",
        version="0.1.0",
        lifespan=lifespan,
    )
    install_handlers(app)
    generate_openapi = app.openapi
    app.openapi = lambda: replace_validation_docs(generate_openapi())  # type: ignore[method-assign]
    app.add_middleware(
        SecurityHeaders,
        docs_paths=[p for p in (app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url) if p],
        mirrors=settings.mirror_urls,
    )
    for module in (
        dataset_routes,
        experiment_routes,
        control_routes,
        revision_routes,
        upload_routes,
        artifact_routes,
        relay,
        portal,
        operations,
        peer_runtime,
    ):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=settings.static_dir), name="static")
    app.state.bundle = peer_runtime.PeerBundle()
    app.state.pyodide = pyodide = peer_runtime.PyodideRuntime(settings.pyodide_dir)
    if pyodide.url is not None:
        app.mount(pyodide.url.rstrip("/"), peer_runtime.ImmutableFiles(directory=settings.pyodide_dir), name="pyodide")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(settings.static_dir / "index.html", headers={"cache-control": "no-cache"})

    @app.get("/sw.js", include_in_schema=False)
    async def service_worker() -> FileResponse:
        """The page's Service Worker, at the root so that it may serve the page itself (static/sw.js)."""
        return FileResponse(
            settings.static_dir / "sw.js", media_type="text/javascript", headers={"cache-control": "no-cache"}
        )

    @app.get("/viewer", include_in_schema=False)
    async def viewer() -> RedirectResponse:
        return RedirectResponse("/#viewer")

    return app
