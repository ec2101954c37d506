"""Identities and signed payloads.

A peer's id derives from its Ed25519 public key (``PeerId``). What is signed is always
``domain || canonical_json(body)``, where the domain names the message kind (so a signature over a
lease can never pass as one over a head) and ``canonical_json`` is sorted-key, compact UTF-8 JSON.

``Signer`` is the small interface every runtime implements: ``PureSigner`` here (browser, tests),
a ``cryptography``-backed one in ``native_peer.identity``. Verification uses the pure implementation
unless a process installs a native one with ``use_verifier`` (the edge does: a flood of bad
signatures must not cost it pure-Python time); tests hold both to the same answers.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol, Self

from . import ed25519
from .errors import InvalidMessage, SignatureError
from .fields import read_object
from .ids import PeerId

__all__ = [
    "PureSigner",
    "Signer",
    "ValidatorSignature",
    "b64decode",
    "b64encode",
    "canonical_json",
    "peer_id_from_public_key",
    "require_signature",
    "strict_verifier",
    "use_verifier",
    "verify_signature",
]

Verify = Callable[[bytes, bytes, bytes], bool]  # (public key, message, signature) -> valid
_verify: Verify = ed25519.verify


def use_verifier(verify: Verify) -> None:
    """Verify every signature in this process with ``verify`` (RFC 8032 Ed25519, same answers as
    ``protocol.ed25519.verify``)."""
    global _verify
    _verify = verify


def strict_verifier(check: Callable[[bytes, bytes, bytes], object], errors: tuple[type[Exception], ...]) -> Verify:
    """A ``Verify`` over a library's ``check(public_key, message, signature)``, which raises one of
    ``errors`` for a bad signature: a key that is not 32 bytes or a signature that is not 64 is
    False before ``check`` sees it, and so is every signature ``check`` refuses."""

    def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
        if len(public_key) != 32 or len(signature) != 64:
            return False
        try:
            check(public_key, message, signature)
        except errors:
            return False
        return True

    return verify


class Signer(Protocol):
    """Something that holds an Ed25519 key and signs bytes with it."""

    @property
    def public_key(self) -> bytes: ...

    def sign(self, message: bytes) -> bytes: ...


class PureSigner:
    """A ``Signer`` over the pure-Python implementation (runs in Pyodide)."""

    def __init__(self, seed: bytes) -> None:
        self._seed = bytes(seed)
        self._public_key = ed25519.public_key_from_seed(self._seed)

    @property
    def public_key(self) -> bytes:
        return self._public_key

    def sign(self, message: bytes) -> bytes:
        return ed25519.sign(self._seed, message)


def peer_id_from_public_key(public_key: bytes) -> PeerId:
    """``ed25519-`` plus the first 40 hex digits of sha256(public key)."""
    if len(public_key) != 32:
        raise InvalidMessage("an Ed25519 public key is 32 bytes")
    return PeerId("ed25519-" + hashlib.sha256(public_key).hexdigest()[:40])


def canonical_json(body: object) -> bytes:
    """Sorted-key, compact UTF-8 JSON: the bytes that signatures and ids are computed over."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def b64decode(text: object, *, size: int | None = None) -> bytes:
    """Decode unpadded url-safe base64; raise ``InvalidMessage`` on junk or a wrong length."""
    if not isinstance(text, str) or len(text) > 4096:
        raise InvalidMessage("expected a base64 string")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError):
        raise InvalidMessage("invalid base64") from None
    if size is not None and len(data) != size:
        raise InvalidMessage(f"expected {size} bytes, got {len(data)}")
    return data


def verify_signature(public_key: bytes, domain: bytes, body: object, signature: bytes) -> bool:
    """True when ``signature`` signs ``domain || canonical_json(body)`` under ``public_key``."""
    return _verify(public_key, domain + canonical_json(body), signature)


def require_signature(public_key: bytes, domain: bytes, body: object, signature: bytes) -> None:
    """Like ``verify_signature`` but raise ``SignatureError`` when it does not verify."""
    if not verify_signature(public_key, domain, body, signature):
        raise SignatureError(f"bad {domain.decode().strip()} signature")


@dataclass(frozen=True)
class ValidatorSignature:
    """A validator's key and its signature over something; subclasses say over what (``verifies``)."""

    WHAT: ClassVar[str] = "validator signature"

    validator_key: bytes
    signature: bytes

    def to_wire(self) -> dict[str, str]:
        return {"validator_key": b64encode(self.validator_key), "signature": b64encode(self.signature)}

    @classmethod
    def from_wire(cls, value: object) -> Self:
        d = read_object(value, cls.WHAT)
        return cls(b64decode(d.get("validator_key"), size=32), b64decode(d.get("signature"), size=64))
