"""Ed25519 (RFC 8032) in pure Python.

This is how the browser peer signs: Pyodide runs this module unchanged, with the 32-byte seed kept
in the page's IndexedDB. Native peers sign with the ``cryptography`` package (same deterministic
signatures, 33 × faster: docs/results/2026-12-signatures.md); everyone verifies with ``verify`` here
or with ``cryptography``.
Tests check that both produce identical signatures and accept each other's.

Not constant-time: fine for verification and for a browser's throwaway training identity, not for
long-lived high-value keys (use ``cryptography`` there).
"""

from __future__ import annotations

import hashlib
from functools import cache

__all__ = ["public_key_from_seed", "sign", "verify"]

_P = 2**255 - 19
_L = 2**252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, -1, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)

_Point = tuple[int, int, int, int]  # extended coordinates (X, Y, Z, T), x = X/Z, y = Y/Z, xy = T/Z
_IDENTITY: _Point = (0, 1, 1, 0)


def _add(p: _Point, q: _Point) -> _Point:
    a = (p[1] - p[0]) * (q[1] - q[0]) % _P
    b = (p[1] + p[0]) * (q[1] + q[0]) % _P
    c = 2 * p[3] * q[3] * _D % _P
    d = 2 * p[2] * q[2] % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _double(p: _Point) -> _Point:
    a = p[0] * p[0] % _P
    b = p[1] * p[1] % _P
    c = 2 * p[2] * p[2] % _P
    h = a + b
    e = h - (p[0] + p[1]) * (p[0] + p[1])
    g = a - b
    f = c + g
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _multiply(scalar: int, point: _Point) -> _Point:
    result = _IDENTITY
    while scalar:
        if scalar & 1:
            result = _add(result, point)
        point = _double(point)
        scalar >>= 1
    return result


def _recover_x(y: int, sign: int) -> int | None:
    if y >= _P:
        return None
    x2 = (y * y - 1) * pow(_D * y * y + 1, -1, _P) % _P
    if x2 == 0:
        return None if sign else 0
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P:
        return None
    return _P - x if (x & 1) != sign else x


def _decompress(data: bytes) -> _Point | None:
    if len(data) != 32:
        return None
    y = int.from_bytes(data, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    x = _recover_x(y, sign)
    return None if x is None else (x, y, 1, x * y % _P)


def _compress(p: _Point) -> bytes:
    z_inv = pow(p[2], -1, _P)
    x, y = p[0] * z_inv % _P, p[1] * z_inv % _P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


def _equal(p: _Point, q: _Point) -> bool:
    return (p[0] * q[2] - q[0] * p[2]) % _P == 0 and (p[1] * q[2] - q[1] * p[2]) % _P == 0


@cache
def _base_powers() -> tuple[_Point, ...]:
    """2^i * B for i in 0..255, so fixed-base multiplication needs additions only."""
    y = 4 * pow(5, -1, _P) % _P
    x = _recover_x(y, 0)
    assert x is not None  # the base point is a curve constant
    point: _Point = (x, y, 1, x * y % _P)
    powers = []
    for _ in range(256):
        powers.append(point)
        point = _double(point)
    return tuple(powers)


def _multiply_base(scalar: int) -> _Point:
    result = _IDENTITY
    for i, power in enumerate(_base_powers()):
        if scalar >> i & 1:
            result = _add(result, power)
    return result


def _hash_int(*parts: bytes) -> int:
    return int.from_bytes(hashlib.sha512(b"".join(parts)).digest(), "little")


def _expand(seed: bytes) -> tuple[int, bytes]:
    if len(seed) != 32:
        raise ValueError("an Ed25519 seed is 32 bytes")
    digest = hashlib.sha512(seed).digest()
    scalar = int.from_bytes(digest[:32], "little")
    scalar &= (1 << 254) - 8
    scalar |= 1 << 254
    return scalar, digest[32:]


def public_key_from_seed(seed: bytes) -> bytes:
    """The 32-byte public key of a 32-byte secret seed."""
    scalar, _ = _expand(seed)
    return _compress(_multiply_base(scalar))


def sign(seed: bytes, message: bytes) -> bytes:
    """The 64-byte RFC 8032 signature of ``message`` under ``seed``."""
    scalar, prefix = _expand(seed)
    public = _compress(_multiply_base(scalar))
    r = _hash_int(prefix, message) % _L
    r_bytes = _compress(_multiply_base(r))
    h = _hash_int(r_bytes, public, message) % _L
    s = (r + h * scalar) % _L
    return r_bytes + s.to_bytes(32, "little")


def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True when ``signature`` is a valid signature of ``message`` under ``public_key``."""
    if len(public_key) != 32 or len(signature) != 64:
        return False
    a = _decompress(public_key)
    r = _decompress(signature[:32])
    if a is None or r is None:
        return False
    s = int.from_bytes(signature[32:], "little")
    if s >= _L:
        return False
    h = _hash_int(signature[:32], public_key, message) % _L
    return _equal(_multiply_base(s), _add(r, _multiply(h, a)))
