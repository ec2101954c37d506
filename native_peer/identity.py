"""A native peer's Ed25519 identity, kept as a 32-byte seed in its storage directory.

Signing uses the ``cryptography`` package (fast, constant-time); the signatures are the same
RFC 8032 bytes the pure-Python signer in ``protocol.ed25519`` produces. ``NodeIdentity.verify`` is
the same library's verification, which a native peer's process installs (``protocol.signing.
use_verifier``, as the edge does with its own): a validator verifies every candidate, lease and head it
reads, a trainer every head and lease, window after window, each milliseconds in pure Python.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from protocol.ids import PeerId
from protocol.signing import peer_id_from_public_key, strict_verifier

__all__ = ["NodeIdentity"]


class NodeIdentity:
    """A ``protocol.signing.Signer`` backed by ``cryptography``."""

    def __init__(self, seed: bytes) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        self._public_key = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    verify = staticmethod(  # ``protocol.signing``'s verifier interface
        strict_verifier(
            lambda key, message, signature: Ed25519PublicKey.from_public_bytes(key).verify(signature, message),
            (InvalidSignature, ValueError),
        )
    )

    @classmethod
    def load_or_create(cls, path: Path) -> NodeIdentity:
        """Read the seed at ``path``, or create one there (mode 0600) on first use."""
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(os.urandom(32))
        seed = path.read_bytes()
        if len(seed) != 32:
            raise ValueError(f"{path} does not hold a 32-byte Ed25519 seed")
        return cls(seed)

    @property
    def public_key(self) -> bytes:
        return self._public_key

    @property
    def peer_id(self) -> PeerId:
        return peer_id_from_public_key(self._public_key)

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)
