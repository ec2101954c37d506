"""Staged uploads, what both ends agree on: an artifact too large for one request reaches the edge in
chunks and is published afterwards by an envelope that carries no artifact bytes (``protocol.envelope``).

    PUT /v1/experiments/{key}/uploads/{cid}   Content-Range: bytes <first>-<last>/<total>, the chunk as body
    GET (or HEAD) of the same path            how many bytes the edge holds: {"offset", "total", ...}

Chunks go in order: the edge holds the first ``offset`` bytes and answers a chunk that starts
anywhere else with 409 (its ``Upload-Offset`` header says where to go on). A chunk is taken whole or
not at all, so a client whose connection broke asks for the offset and sends again from there. The
same ``Content-Range`` form (RFC 9110 §14.4) answers ranged downloads, which resume with ``Range``.

A stage is one edge's own. Clients name it in ``UPLOAD_HEADER`` on every request of a staged upload,
its offset queries, chunks and publish, so that a balancer in front of several edges sends them all
to one edge (``deploy/nginx/dtn.conf`` hashes on it); the edge itself never reads it. A publish that
reaches an edge without the complete stage (the one that held it went away) is answered
``STAGE_MISSING``: the client stages the artifact again there, from the offset it asks, and
publishes once more.
"""

from __future__ import annotations

import re

from .errors import InvalidMessage
from .ids import ContentId, ExperimentKey

__all__ = [
    "OFFSET_HEADER",
    "STAGE_MISSING",
    "UPLOAD_CHUNK_BYTES",
    "UPLOAD_HEADER",
    "content_range",
    "parse_content_range",
    "upload_path",
]

UPLOAD_CHUNK_BYTES = 4 * 1024 * 1024  # the edge's largest chunk by default, and what clients send
OFFSET_HEADER = "upload-offset"
UPLOAD_HEADER = "dtn-upload"  # the content id of the staged artifact a request belongs to: a routing key
STAGE_MISSING = (404, 409)  # a publish's answer when this edge holds no stage of it, or only part of one
_CONTENT_RANGE = re.compile(r"bytes ([0-9]{1,15})-([0-9]{1,15})/([0-9]{1,15})")


def upload_path(key: ExperimentKey, cid: ContentId) -> str:
    return f"/v1/experiments/{key}/uploads/{cid}"


def content_range(start: int, end: int, total: int) -> str:
    """The ``Content-Range`` of bytes ``[start, end)`` of a ``total``-byte artifact."""
    return f"bytes {start}-{end - 1}/{total}"


def parse_content_range(header: str | None) -> tuple[int, int, int]:
    """``(start, end, total)`` of a ``Content-Range: bytes first-last/total`` (``end`` exclusive);
    ``InvalidMessage`` when it is missing, malformed or names bytes outside ``total``."""
    match = _CONTENT_RANGE.fullmatch((header or "").strip())
    if match is None:
        raise InvalidMessage(f"expected Content-Range: bytes <first>-<last>/<total>, got {header!r}")
    first, last, total = map(int, match.groups())
    if not first <= last < total:
        raise InvalidMessage(f"Content-Range {header!r} names bytes outside 0-{total - 1}")
    return first, last + 1, total
