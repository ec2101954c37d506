"""Native Ed25519 verification for the edge (``cryptography``), installed process-wide at start-up.

The edge checks a signature on every join, lease request and upload; pure-Python verification costs
milliseconds each, so a flood of bad signatures would cost CPU before any limit bites. The answers
are the same as ``protocol.ed25519.verify`` (tests compare both on valid, tampered and malformed input).
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocol.signing import use_verifier

__all__ = ["install_native_verifier", "native_verify"]


def native_verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    if len(public_key) != 32 or len(signature) != 64:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def install_native_verifier() -> None:
    use_verifier(native_verify)
