"""The upload envelope: one signed descriptor plus the artifact bytes it describes, in one body.

Layout: ``b"DTN1"``, 4-byte big-endian length N, N bytes of JSON descriptor, then the artifact.
Used as an HTTP request body and as a WebSocket binary frame, so both paths share one decoder.
An envelope with no artifact bytes publishes the artifact staged on the edge in chunks under the
content id its descriptor names (``protocol.uploads``): an artifact is never empty, so nothing is
ambiguous.
"""

from __future__ import annotations

import json
import struct

from .errors import InvalidMessage, TooLarge
from .signing import canonical_json

__all__ = ["MAGIC", "MAX_DESCRIPTOR_BYTES", "pack_envelope", "unpack_envelope"]

MAGIC = b"DTN1"
MAX_DESCRIPTOR_BYTES = 512 * 1024  # a head merging ``messages.MAX_WINDOW_CANDIDATES`` candidates fits


def pack_envelope(descriptor: object, artifact: bytes) -> bytes:
    header = canonical_json(descriptor)
    return MAGIC + struct.pack(">I", len(header)) + header + artifact


def unpack_envelope(data: bytes | memoryview) -> tuple[object, bytes]:
    """Return ``(descriptor, artifact)``; raise ``InvalidMessage`` / ``TooLarge`` on a bad envelope."""
    view = memoryview(data)
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise InvalidMessage("not a DTN1 envelope")
    (length,) = struct.unpack(">I", view[4:8])
    if length > MAX_DESCRIPTOR_BYTES:
        raise TooLarge(f"descriptor of {length} bytes exceeds {MAX_DESCRIPTOR_BYTES}")
    if 8 + length > len(view):
        raise InvalidMessage("descriptor length points past the end of the envelope")
    try:
        descriptor = json.loads(bytes(view[8 : 8 + length]))
    except ValueError:
        raise InvalidMessage("envelope descriptor is not JSON") from None
    return descriptor, bytes(view[8 + length :])
