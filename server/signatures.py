"""Native Ed25519 verification for the edge (``cryptography``), installed process-wide at start-up.

The edge checks a signature on every join, lease request and upload; pure-Python verification costs
milliseconds each, so a flood of bad signatures would cost CPU before any limit bites. The answers
are the same as ``protocol.ed25519.verify`` (tests compare both on valid, tampered and malformed input).
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocol.signing import strict_verifier, use_verifier

__all__ = ["install_native_verifier", "native_verify"]


native_verify = strict_verifier(
    lambda key, message, signature: Ed25519PublicKey.from_public_bytes(key).verify(signature, message),
    (InvalidSignature, ValueError),
)


def install_native_verifier() -> None:
    use_verifier(native_verify)
