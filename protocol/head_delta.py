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

A head on the int8 grid of its parent (``protocol.head_grid``: ``ExperimentSpec.head_grid``) has a
smaller delta (``dtn-head-delta-v2``, ``encode_delta(..., grid="int8")``): its data section as
float32s, each tensor (``segments``: their sizes in elements, in data order) in blocks of
``head_grid.BLOCK``, each block's exponent e (``exponents``, int16) and each element's q (``steps``,
int8, deflated), H′ = H + q · 2^e in float32 (``head_grid.grid_step``); the words that this does not
give exactly (``except_index``, ``except_words``: uint32) are carried as they are. The edge finds q and
e from the two heads alone and keeps the v2 delta only when few words are exceptions, else v1.
"""

from __future__ import annotations

import zlib

import numpy as np
import numpy.typing as npt

from .codec import MAX_HEADER_BYTES, decode_tensors, encode_tensors
from .errors import CodecError, IntegrityError
from .hashing import content_id, verify_content
from .head_grid import block_exponents, block_of, block_starts, grid_step

__all__ = ["FORMAT", "GRID_FORMAT", "apply_delta", "encode_delta"]

FORMAT = "dtn-head-delta-v1"
GRID_FORMAT = "dtn-head-delta-v2"
_LEVEL, _STRATEGY = 1, zlib.Z_RLE  # deflate with run-length matches only: any inflate reads it
_GRID_STRATEGY = zlib.Z_HUFFMAN_ONLY  # q bytes: no runs, no repeats, a skewed histogram
_MAX_EXCEPTIONS = 1 / 16  # of the words: past it a head is not on its parent's grid (v1 then)


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


def _deflate(data: bytes, strategy: int = _STRATEGY) -> bytes:
    deflate = zlib.compressobj(_LEVEL, zlib.DEFLATED, zlib.MAX_WBITS, 8, strategy)
    return deflate.compress(data) + deflate.flush()


def _inflate(packed: npt.NDArray[np.generic], size: int, what: str) -> bytes:
    """``packed`` inflated to exactly ``size`` bytes (never more are produced), else ``CodecError``."""
    inflate = zlib.decompressobj()
    try:
        data = inflate.decompress(packed.tobytes(), size)
    except zlib.error as exc:
        raise CodecError(f"a head delta's {what} do not inflate: {exc}") from None
    if len(data) != size or not inflate.eof or inflate.unconsumed_tail or inflate.unused_data:
        raise CodecError(f"a head delta's {what} do not inflate to {size} bytes")
    return data


def encode_delta(base: bytes, target: bytes, grid: str = "exact") -> bytes:
    """The delta that rebuilds ``target`` from ``base``: on the int8 grid (v2) where ``grid`` says
    the heads are and ``target`` is, else exact (v1); ``CodecError`` when the two have no delta."""
    old, new = _words(base), _words(target)
    if len(old) != len(new):
        raise CodecError(f"data sections of {4 * len(old)} and {4 * len(new)} bytes: no delta")
    metadata = {"base": content_id(base), "target": content_id(target), "words": str(len(new))}
    header = np.frombuffer(target, np.uint8, count=_data_start(target))
    if grid == "int8":
        try:
            return encode_tensors(
                {"header": header, **_grid_delta(target, old, new)}, {"format": GRID_FORMAT, **metadata}
            )
        except CodecError:
            pass  # not a head on its parent's grid (a rollback, another model's layout): exact
    moved = (new - old).view("<i4")
    zigzag = ((moved << 1) ^ (moved >> 31)).view("<u4")
    planes = zigzag.view(np.uint8).reshape(-1, 4).T.tobytes()
    tensors = {"header": header, "planes": np.frombuffer(_deflate(planes), np.uint8)}
    return encode_tensors(tensors, {"format": FORMAT, **metadata})


def _grid_delta(
    target: bytes, old: npt.NDArray[np.uint32], new: npt.NDArray[np.uint32]
) -> dict[str, npt.NDArray[np.generic]]:
    """The v2 tensors of ``target`` (words ``new``) from words ``old``; ``CodecError`` unless it holds
    float32 tensors only and at most ``_MAX_EXCEPTIONS`` of its words are off the grid."""
    tensors, _ = decode_tensors(target)
    if any(value.dtype != np.float32 for value in tensors.values()):
        raise CodecError("a grid delta carries float32 tensors only")
    segments = np.array([tensors[name].size for name in sorted(tensors)], np.uint32)  # encode_tensors' order
    starts = block_starts([int(n) for n in segments])
    before, after = old.view("<f4"), new.view("<f4")
    step = after.astype(np.float64) - before.astype(np.float64)
    finite = np.isfinite(step)
    exponents = block_exponents(np.where(finite, step, 0.0), starts)
    scaled = np.where(finite, step, 0.0) / np.ldexp(1.0, exponents.astype(np.int32))[block_of(starts, len(step))]
    q = np.clip(np.rint(scaled), -127, 127).astype(np.int8)
    off = np.flatnonzero(grid_step(before, q, exponents, starts).view("<u4") != new).astype(np.uint32)
    if len(off) > _MAX_EXCEPTIONS * len(new):
        raise CodecError(f"{len(off)} of {len(new)} words off the grid")
    return {
        "segments": segments,
        "exponents": exponents,
        "steps": np.frombuffer(_deflate(q.tobytes(), _GRID_STRATEGY), np.uint8),
        "except_index": off,
        "except_words": new[off],
    }


def apply_delta(base: bytes, base_id: str, delta: bytes, target_id: str) -> bytes:
    """The artifact ``target_id`` rebuilt from ``base`` (whose content id is ``base_id``) and ``delta``,
    verified by content id. ``CodecError`` for a delta that is not one from ``base_id`` to ``target_id``
    or does not decode within the sizes ``base`` implies, ``IntegrityError`` when it rebuilds other
    bytes: the caller downloads the head instead."""
    tensors, metadata = decode_tensors(delta)
    kind = metadata.get("format")
    if kind not in (FORMAT, GRID_FORMAT) or (metadata.get("base"), metadata.get("target")) != (base_id, target_id):
        raise CodecError(f"not a {FORMAT} or {GRID_FORMAT} delta from {base_id} to {target_id}")
    header = _typed(tensors, "header", np.uint8)
    if len(header) > 8 + MAX_HEADER_BYTES:
        raise CodecError("a head delta's header is out of bounds")
    old = _words(base)
    if metadata.get("words") != str(len(old)):
        raise CodecError(f"a delta of {metadata.get('words')} words for a base of {len(old)}")
    words = _exact_words(tensors, old) if kind == FORMAT else _grid_words(tensors, old)
    target = header.tobytes() + words.astype("<u4").tobytes()
    try:
        verify_content(target, target_id)
    except IntegrityError as exc:
        raise IntegrityError(f"a head delta rebuilt other bytes than {target_id}: {exc}") from None
    return target


def _typed(tensors: dict[str, npt.NDArray[np.generic]], name: str, dtype: type[np.generic]) -> npt.NDArray[np.generic]:
    value = tensors.get(name)
    if value is None or value.dtype != dtype or value.ndim != 1:
        raise CodecError(f"a head delta holds {np.dtype(dtype).name} vector {name!r}")
    return value


def _exact_words(tensors: dict[str, npt.NDArray[np.generic]], old: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    planes = _inflate(_typed(tensors, "planes", np.uint8), 4 * len(old), "planes")
    zigzag = np.frombuffer(planes, np.uint8).reshape(4, -1).T.copy().view("<u4").ravel()
    moved = (zigzag >> np.uint32(1)) ^ (np.uint32(0) - (zigzag & np.uint32(1)))
    words: npt.NDArray[np.uint32] = old + moved
    return words


def _grid_words(tensors: dict[str, npt.NDArray[np.generic]], old: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    segments = _typed(tensors, "segments", np.uint32)
    if len(segments) > len(old) or int(segments.astype(np.int64).sum()) != len(old):
        raise CodecError(f"a grid delta's segments do not add up to its {len(old)} words")
    starts = block_starts([int(n) for n in segments])
    exponents = _typed(tensors, "exponents", np.int16).astype(np.int16)
    if len(exponents) != len(starts):
        raise CodecError(f"a grid delta holds {len(exponents)} exponents for {len(starts)} blocks")
    q = np.frombuffer(_inflate(_typed(tensors, "steps", np.uint8), len(old), "steps"), np.int8)
    index, kept = _typed(tensors, "except_index", np.uint32), _typed(tensors, "except_words", np.uint32)
    if len(index) != len(kept) or len(index) > len(old) or (len(index) and int(index.max()) >= len(old)):
        raise CodecError("a grid delta's exceptions are out of bounds")
    words = grid_step(old.view("<f4"), q, exponents, starts).view("<u4").copy()
    words[index.astype(np.intp)] = kept
    return words
