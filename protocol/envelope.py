"""The upload envelope: one signed descriptor plus the artifact bytes it describes, in one body.

Layout: ``b"DTN1"``, 4-byte big-endian length N, N bytes of JSON descriptor, then the artifact.
Used as an HTTP request body and as a WebSocket binary frame, so both paths share one decoder.
An envelope with no artifact bytes publishes the artifact staged on the edge in chunks under the
content id its descriptor names (``protocol.uploads``): an artifact is never empty, so nothing is
ambiguous.
"""

from __future__ import annotations

import struct

from .errors import InvalidMessage
from .framing import read_json_header
from .signing import canonical_json

__all__ = ["MAGIC", "MAX_DESCRIPTOR_BYTES", "pack_envelope", "unpack_envelope"]

MAGIC = b"DTN1"
MAX_DESCRIPTOR_BYTES = 512 * 1024  # a head merging ``messages.MAX_WINDOW_CANDIDATES`` candidates fits
_LENGTH = struct.Struct(">I")


def pack_envelope(descriptor: object, artifact: bytes) -> bytes:
    header = canonical_json(descriptor)
    return MAGIC + _LENGTH.pack(len(header)) + header + artifact


def unpack_envelope(data: bytes | memoryview) -> tuple[object, bytes]:
    """Return ``(descriptor, artifact)``; raise ``InvalidMessage`` / ``TooLarge`` on a bad envelope."""
    view = memoryview(data)
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise InvalidMessage("not a DTN1 envelope")
    descriptor, end = read_json_header(view, _LENGTH, len(MAGIC), MAX_DESCRIPTOR_BYTES, InvalidMessage, "envelope")
    return descriptor, bytes(view[end:])
