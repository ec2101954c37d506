"""Content ids: ``sha256:<hex>`` over exactly the bytes that are shipped."""

from __future__ import annotations

import hashlib

from .errors import IntegrityError
from .ids import ContentId

__all__ = ["content_id", "verify_content"]


def content_id(data: bytes | bytearray | memoryview) -> ContentId:
    """Return the content id of ``data``."""
    return ContentId("sha256:" + hashlib.sha256(data).hexdigest())


def verify_content(data: bytes | bytearray | memoryview, expected: str) -> ContentId:
    """Return the content id of ``data``; raise ``IntegrityError`` unless it equals ``expected``."""
    actual = content_id(data)
    if actual != expected:
        raise IntegrityError(f"content id mismatch: expected {expected}, got {actual}")
    return actual
