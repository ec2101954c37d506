"""A JSON header behind a length prefix, read by one rule for every format that frames one: the
safetensors codec (``protocol.codec``) and the upload envelope (``protocol.envelope``)."""

from __future__ import annotations

import json
import struct

from .errors import ProtocolError, TooLarge

__all__ = ["read_json_header"]


def read_json_header(
    view: memoryview, prefix: struct.Struct, start: int, limit: int, error: type[ProtocolError], what: str
) -> tuple[object, int]:
    """The JSON value of the header whose length (``prefix``, a one-field struct) is at ``start`` of
    ``view``, and the offset just past the header. ``error`` when ``view`` ends before the prefix or
    the header, or the header is not JSON; ``TooLarge`` for a header over ``limit`` bytes."""
    body = start + prefix.size
    if len(view) < body:
        raise error(f"{what} shorter than its {prefix.size}-byte header length")
    (length,) = prefix.unpack(view[start:body])
    if length > limit:
        raise TooLarge(f"{what} header of {length} bytes exceeds {limit}")
    if body + length > len(view):
        raise error(f"{what} header length points past the end of the {what}")
    try:
        return json.loads(bytes(view[body : body + length])), body + length
    except (UnicodeDecodeError, ValueError) as exc:
        raise error(f"{what} header is not JSON: {exc}") from None
