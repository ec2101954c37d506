"""Response helpers: orjson bodies and immutable, content-addressed file responses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.responses import FileResponse

__all__ = ["JSON", "immutable_file"]


class JSON(Response):
    """A JSON response serialized with orjson."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def immutable_file(
    request: Request, path: Path, etag_id: str, *, private: bool = False, media_type: str = "application/octet-stream"
) -> Response:
    """Serve bytes that never change under this URL: ETag is their content id, Range works, 304 on match."""
    etag = f'"{etag_id}"'
    cache = f"{'private' if private else 'public'}, max-age=31536000, immutable"
    if etag in {tag.strip() for tag in request.headers.get("if-none-match", "").split(",")}:
        return Response(status_code=304, headers={"etag": etag, "cache-control": cache})
    return FileResponse(path, media_type=media_type, headers={"etag": etag, "cache-control": cache})
