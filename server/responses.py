"""Response helpers: orjson bodies and conditional GET of resources that an ETag names exactly.

``conditional_get`` serves every such resource, GET and HEAD alike (HEAD: the same headers, no body):
an ``If-None-Match`` of ``*`` or of a tag that weakly matches the ETag answers 304 with the ETag and
the cache-control (RFC 9110 §13.1.2, §15.4.5). Files honour ``Range`` and ``If-Range`` on GET as
``byte_ranges`` reads RFC 9110 §14; in-memory bodies ignore ``Range`` and answer 200 in full.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.responses import FileResponse
from starlette.responses import RangeNotSatisfiable

__all__ = ["IMMUTABLE", "JSON", "byte_ranges", "conditional_get", "immutable_file"]

IMMUTABLE = "public, max-age=31536000, immutable"  # content-addressed: cacheable forever

MAX_RANGES = 100  # more ranges than this in one request: ignored (RFC 9110 §14.2), the whole body is sent
_OPAQUE_TAG = re.compile(r'(?:W/)?("[^"]*")')  # an entity-tag; weak comparison keeps only its opaque-tag
_RANGE_SPEC = re.compile(r"([0-9]+)-([0-9]*)|-([0-9]+)")  # int-range (first-pos "-" [last-pos]) or suffix-range


class JSON(Response):
    """A JSON response serialized with orjson."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def conditional_get(
    request: Request,
    content: Path | bytes,
    etag_id: str,
    *,
    cache_control: str,
    media_type: str = "application/octet-stream",
) -> Response:
    """Serve ``content`` (a file or in-memory bytes) whose ETag is ``"<etag_id>"`` to a GET or HEAD.

    ``If-None-Match``: ``*`` or any listed tag weakly matching the ETag answers 304 with the ETag and
    ``cache_control``. A file honours ``Range`` on GET (206 single or multipart, 416 with
    ``Content-Range: bytes */<length>`` when no range is satisfiable, 200 in full when ``byte_ranges``
    says to ignore it) and ``If-Range`` (a strong match of the ETag or the exact Last-Modified date,
    else 200 in full). In-memory bytes do not support ranges: ``Range`` is ignored, the answer is 200.
    HEAD gets the headers GET would get without a Range (RFC 9110 §14.2 defines ranges for GET only).
    """
    etag = f'"{etag_id}"'
    headers = {"etag": etag, "cache-control": cache_control}
    if any(
        value.strip() == "*" or etag in _OPAQUE_TAG.findall(value) for value in request.headers.getlist("if-none-match")
    ):
        return Response(status_code=304, headers=headers)
    if isinstance(content, bytes):
        return Response(content, media_type=media_type, headers=headers)
    return _RangedFile(content, ranged=request.method == "GET", media_type=media_type, headers=headers)


def immutable_file(request: Request, path: Path, etag_id: str, *, private: bool = False) -> Response:
    """A content-addressed file (its content id is ``etag_id``), cacheable forever; ``private`` for per-holder data."""
    cache = f"{'private' if private else 'public'}, max-age=31536000, immutable"
    return conditional_get(request, path, etag_id, cache_control=cache)


def byte_ranges(header: str, length: int) -> list[tuple[int, int]] | None:
    """The ``[start, end)`` ranges of a ``length``-byte body that a ``Range`` header asks for (RFC 9110 §14).

    ``None`` means ignore the header and send the whole body, as §14.2 requires for another range unit
    and allows for an invalid ranges-specifier (a malformed range-spec, or a last-pos below its
    first-pos such as ``bytes=5-2``), for more than ``MAX_RANGES`` ranges and here for an empty body
    (a range of it has no ``Content-Range``). ``[]`` means no range-spec is satisfiable (§14.1.1: a
    first-pos at or past the end, or a zero suffix-length): answer 416. Otherwise the satisfiable
    ranges, last-pos clipped to the body, sorted with overlapping or adjacent ones coalesced (§15.3.7.2)
    so that a request cannot multiply the bytes sent.
    """
    unit, equals, range_set = header.partition("=")
    specs = [spec.strip() for spec in range_set.split(",") if spec.strip()]
    if not equals or unit.strip().lower() != "bytes" or not specs or len(specs) > MAX_RANGES or length == 0:
        return None
    ranges: list[tuple[int, int]] = []
    for spec in specs:
        match = _RANGE_SPEC.fullmatch(spec)
        if match is None:
            return None
        first, last, suffix = match.groups()
        if suffix is not None:
            if int(suffix) > 0:
                ranges.append((max(length - int(suffix), 0), length))
        elif last and int(last) < int(first):
            return None
        elif int(first) < length:
            ranges.append((int(first), min(int(last) + 1, length) if last else length))
    coalesced: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if coalesced and start <= coalesced[-1][1]:
            coalesced[-1] = (coalesced[-1][0], max(coalesced[-1][1], end))
        else:
            coalesced.append((start, end))
    return coalesced


class _RangedFile(FileResponse):
    """Starlette's FileResponse with its Range parsing replaced by ``byte_ranges``, on GET only."""

    def __init__(self, path: Path, *, ranged: bool, media_type: str, headers: dict[str, str]) -> None:
        super().__init__(path, media_type=media_type, headers=headers)
        self.ranged = ranged

    # Starlette calls this with the Range header unless If-Range failed; [] makes it send the whole file.
    def _parse_range_header(self, http_range: str, file_size: int) -> list[tuple[int, int]]:  # type: ignore[override]
        ranges = byte_ranges(http_range, file_size) if self.ranged else None
        if ranges == []:
            raise RangeNotSatisfiable(file_size)
        return ranges or []
