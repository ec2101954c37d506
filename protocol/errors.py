"""Exceptions raised by the shared protocol core.

Bad input is an exception; a rejected candidate is a value (see ``verdicts.Verdict``).

    ProtocolError
     ├── InvalidMessage      malformed wire data: wrong type, missing field, bad id
     ├── CodecError          bytes that are not a valid tensor artifact
     ├── IntegrityError      bytes whose sha256 does not match the content id they claim
     ├── SignatureError      a signature that does not verify
     └── TooLarge            a payload over its size limit

Edges map each class to one HTTP status and one WebSocket close code (``server/errors.py``).
"""

from __future__ import annotations

__all__ = [
    "CodecError",
    "IntegrityError",
    "InvalidMessage",
    "ProtocolError",
    "SignatureError",
    "TooLarge",
]


class ProtocolError(Exception):
    """Base class of every error the protocol core raises."""


class InvalidMessage(ProtocolError):
    """A message or field does not have the shape the protocol requires."""


class CodecError(ProtocolError):
    """Bytes that do not decode as a safetensors-compatible artifact."""


class IntegrityError(ProtocolError):
    """Bytes whose content id does not match the one claimed."""


class SignatureError(ProtocolError):
    """A signature that does not verify against the claimed key."""


class TooLarge(ProtocolError):
    """A payload larger than the limit that applies to it."""
