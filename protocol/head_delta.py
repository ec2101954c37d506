"""Heads as deltas: the next head's artifact rebuilt exactly from the head a peer holds.

A peer that trained on head H needs H's child H′; most of H′'s bits are H's. A delta
(``dtn-head-delta-v1``) carries H′'s safetensors header as it is and its data section (the tensors'
bytes) as the difference from H's, word by word: both data sections read as little-endian 32-bit
words, per word H′ − H modulo 2³² (for a float32 that kept its sign, the distance in units in the last
place), zigzag-mapped so that small moves either way are small numbers, the four bytes of the words
split into four planes (the high planes of small numbers are mostly zeros) and deflated (zlib, which
the browser's Python has too) with run-length matches only (``Z_RLE``): the low planes are noise that
no match shortens, the high one runs of zeros, so longer matches cost the edge time on every head's
critical path and buy no bytes (decision 0039). Applying it is exact arithmetic modulo 2³²: the bytes
it gives are checked against H′'s content id, the id the validators signed, and are used only if they match.

Exact means every bit of H′ travels: a window moves float32 weights by a few per cent of their size,
which leaves most of a word's 32 bits to send (decision 0019). A delta exists only between artifacts
whose data sections have the same length, a multiple of 4 (heads of one model).

The delta is itself a safetensors artifact (``protocol.codec``): tensors ``header`` (uint8, H′'s
bytes before its data) and ``planes`` (uint8, deflated), metadata ``format``, ``base`` and ``target``
(the two content ids) and ``words``.
"""

from __future__ import annotations

import zlib

import numpy as np
import numpy.typing as npt

from .codec import MAX_HEADER_BYTES, decode_tensors, encode_tensors
from .errors import CodecError, IntegrityError
from .hashing import content_id, verify_content

__all__ = ["FORMAT", "apply_delta", "encode_delta"]

FORMAT = "dtn-head-delta-v1"
_LEVEL, _STRATEGY = 1, zlib.Z_RLE  # deflate with run-length matches only: any inflate reads it


def _data_start(artifact: bytes) -> int:
    """Where a safetensors artifact's data section starts (after its 8-byte length and header)."""
    if len(artifact) < 8:
        raise CodecError("artifact shorter than its 8-byte header length")
    header_len = int.from_bytes(artifact[:8], "little")
    if header_len > MAX_HEADER_BYTES or 8 + header_len > len(artifact):
        raise CodecError("artifact header length out of bounds")
    return 8 + header_len


def _words(artifact: bytes) -> npt.NDArray[np.uint32]:
    start = _data_start(artifact)
    if (len(artifact) - start) % 4:
        raise CodecError("an artifact's data section is not whole 32-bit words: no delta")
    return np.frombuffer(artifact, "<u4", offset=start)


def _deflate(data: bytes) -> bytes:
    deflate = zlib.compressobj(_LEVEL, zlib.DEFLATED, zlib.MAX_WBITS, 8, _STRATEGY)
    return deflate.compress(data) + deflate.flush()


def encode_delta(base: bytes, target: bytes) -> bytes:
    """The delta that rebuilds ``target`` from ``base``; ``CodecError`` when the two have no delta."""
    old, new = _words(base), _words(target)
    if len(old) != len(new):
        raise CodecError(f"data sections of {4 * len(old)} and {4 * len(new)} bytes: no delta")
    moved = (new - old).view("<i4")
    zigzag = ((moved << 1) ^ (moved >> 31)).view("<u4")
    planes = zigzag.view(np.uint8).reshape(-1, 4).T.tobytes()
    tensors = {
        "header": np.frombuffer(target, np.uint8, count=_data_start(target)),
        "planes": np.frombuffer(_deflate(planes), np.uint8),
    }
    metadata = {"format": FORMAT, "base": content_id(base), "target": content_id(target), "words": str(len(new))}
    return encode_tensors(tensors, metadata)


def apply_delta(base: bytes, base_id: str, delta: bytes, target_id: str) -> bytes:
    """The artifact ``target_id`` rebuilt from ``base`` (whose content id is ``base_id``) and ``delta``,
    verified by content id. ``CodecError`` for a delta that is not one from ``base_id`` to ``target_id``
    or does not decode within the sizes ``base`` implies, ``IntegrityError`` when it rebuilds other
    bytes: the caller downloads the head instead."""
    tensors, metadata = decode_tensors(delta)
    expected = {"format": FORMAT, "base": base_id, "target": target_id}
    if {key: metadata.get(key) for key in expected} != expected:
        raise CodecError(f"not a {FORMAT} delta from {base_id} to {target_id}")
    header, packed = tensors.get("header"), tensors.get("planes")
    if header is None or packed is None or header.dtype != np.uint8 or packed.dtype != np.uint8:
        raise CodecError("a head delta holds uint8 'header' and 'planes'")
    if header.ndim != 1 or len(header) > 8 + MAX_HEADER_BYTES:
        raise CodecError("a head delta's header is out of bounds")
    old = _words(base)
    if metadata.get("words") != str(len(old)):
        raise CodecError(f"a delta of {metadata.get('words')} words for a base of {len(old)}")
    inflate = zlib.decompressobj()
    try:
        planes = inflate.decompress(packed.tobytes(), 4 * len(old))
    except zlib.error as exc:
        raise CodecError(f"a head delta's planes do not inflate: {exc}") from None
    if len(planes) != 4 * len(old) or not inflate.eof or inflate.unconsumed_tail or inflate.unused_data:
        raise CodecError(f"a head delta's planes do not inflate to {4 * len(old)} bytes")
    zigzag = np.frombuffer(planes, np.uint8).reshape(4, -1).T.copy().view("<u4").ravel()
    moved = (zigzag >> np.uint32(1)) ^ (np.uint32(0) - (zigzag & np.uint32(1)))
    target = header.tobytes() + (old + moved).astype("<u4").tobytes()
    try:
        verify_content(target, target_id)
    except IntegrityError as exc:
        raise IntegrityError(f"a head delta rebuilt other bytes than {target_id}: {exc}") from None
    return target
