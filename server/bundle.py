"""The browser peer's Python code as one zip (``protocol/`` + ``browser_peer/``), built at start-up.

The zip is deterministic (sorted names, fixed timestamps), so its content id, served as the ETag,
changes only when the code does. Pyodide unpacks it into its file system and imports it unchanged.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from fastapi import APIRouter, Request, Response

from protocol.hashing import content_id

from .responses import conditional_get

__all__ = ["PeerBundle", "router"]

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "browser_peer")

router = APIRouter(tags=["browser"])


class PeerBundle:
    def __init__(self, root: Path = ROOT) -> None:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for package in PACKAGES:
                for path in sorted((root / package).rglob("*.py")):
                    info = zipfile.ZipInfo(str(path.relative_to(root)), date_time=(2020, 1, 1, 0, 0, 0))
                    archive.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)
        self.data = buffer.getvalue()
        self.content_id = content_id(self.data)


@router.get("/bundle/peer.zip")
@router.head("/bundle/peer.zip")
async def peer_bundle(request: Request) -> Response:
    bundle: PeerBundle = request.app.state.bundle
    return conditional_get(
        request, bundle.data, bundle.content_id, cache_control="no-cache", media_type="application/zip"
    )
