"""What a browser tab loads to become a peer, each under a content-addressed URL cached for a year.

``PeerBundle``: the peer's Python code as one zip (``protocol/`` + ``browser_peer/``), and the
trainer's WebAssembly kernels where they are built (``var/kernels/kernels.wasm`` and
``kernels-fma.wasm``, ``make setup``; the page trains without them otherwise), built at start-up, deterministic (sorted names, fixed timestamps),
so its content id changes only when the code does. ``PyodideRuntime``: the self-hosted Pyodide directory (``python -m tools pyodide-runtime``),
its id computed over every file's name and sha256 (listed too, so the page's Service Worker checks
each file it keeps). Both are served under a URL that holds their id
(``/bundle/<id>.zip``, ``/pyodide/<id>/...``) as ``immutable``; ``GET /v1/peer-runtime`` (never
cached) names the current URLs, so a new runtime or bundle reaches tabs on their next load while an
unchanged one is never downloaded twice.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from protocol.hashing import content_id

from .errors import NotFound
from .responses import IMMUTABLE, JSON, conditional_get

__all__ = ["ImmutableFiles", "PeerBundle", "PyodideRuntime", "router"]

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "browser_peer")
# each built kernels file (SIMD128, and with relaxed SIMD's fused multiply-add) and its name in the bundle
KERNELS = tuple(
    (f"var/kernels/{name}", f"browser_peer/kernels/{name}") for name in ("kernels.wasm", "kernels-fma.wasm")
)
URL_ID_HEX = 32  # 128 bits of the sha256 in URLs

router = APIRouter(tags=["browser"])


def _url_id(content: str) -> str:
    return content.removeprefix("sha256:")[:URL_ID_HEX]


class PeerBundle:
    def __init__(self, root: Path = ROOT) -> None:
        buffer = io.BytesIO()
        files = [
            (path, str(path.relative_to(root)))
            for package in PACKAGES
            for path in sorted((root / package).rglob("*.py"))
        ]
        files += [(root / built, name) for built, name in KERNELS if (root / built).is_file()]
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for path, name in files:
                info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
                archive.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)
        self.data = buffer.getvalue()
        self.content_id = content_id(self.data)
        self.url = f"/bundle/{_url_id(self.content_id)}.zip"


class PyodideRuntime:
    """The Pyodide directory and its content id (None where the directory holds no runtime)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.content_id: str | None = None
        self.files: dict[str, str] = {}  # name -> sha256 (hex) of each file, for the page's Service Worker
        if (directory / "pyodide-lock.json").is_file():
            for path in sorted(p for p in directory.rglob("*") if p.is_file() and not p.name.startswith(".")):
                self.files[str(path.relative_to(directory))] = hashlib.sha256(path.read_bytes()).hexdigest()
            listing = "".join(f"{name}\0{digest}\n" for name, digest in self.files.items())
            self.content_id = content_id(listing.encode())

    @property
    def url(self) -> str | None:
        return None if self.content_id is None else f"/pyodide/{_url_id(self.content_id)}/"


class ImmutableFiles(StaticFiles):
    """Static files whose URL names their content: cached for a year, never revalidated."""

    async def get_response(self, path: str, scope: Scope) -> Any:
        response = await super().get_response(path, scope)
        if response.status_code in (200, 304):
            response.headers["cache-control"] = IMMUTABLE
        return response


@router.get("/v1/peer-runtime")
async def peer_runtime(request: Request) -> JSON:
    """Where this edge's Pyodide runtime and peer bundle are, by content (``pyodide`` null: none here)."""
    bundle: PeerBundle = request.app.state.bundle
    pyodide: PyodideRuntime = request.app.state.pyodide
    return JSON(
        {
            "bundle": {"id": bundle.content_id, "url": bundle.url},
            "pyodide": None
            if pyodide.url is None
            else {"id": pyodide.content_id, "url": pyodide.url, "files": pyodide.files},
        },
        headers={"cache-control": "no-cache"},
    )


@router.get("/bundle/{url_id}.zip")
@router.head("/bundle/{url_id}.zip")
async def peer_bundle(request: Request, url_id: str) -> Response:
    bundle: PeerBundle = request.app.state.bundle
    if request.url.path != bundle.url:
        raise NotFound(f"no bundle {url_id} on this edge; GET /v1/peer-runtime names the current one")
    return conditional_get(
        request, bundle.data, bundle.content_id, cache_control=IMMUTABLE, media_type="application/zip"
    )
