"""Heads on a grid of int8 steps from their parent (``ExperimentSpec.head_grid``; decision 0053). Pure.

With ``head_grid = "int8"`` a validator moves the parameters a window promotes onto the grid of the
parent head (``snap``) before it measures and signs them: per tensor, per block of ``BLOCK``
consecutive elements (C order), the step from the parent is written q · 2^e, q an integer in
[−127, 127] and 2^e the smallest power of two for which the block's largest step fits, and the head is
parent + q · 2^e in float32 (``grid_step``). q is rounded stochastically, so it is unbiased: a step
smaller than 2^e moves its weight by 2^e with the odds of its share of 2^e, and small steps add up over
windows instead of being lost. The rounding's uniforms come from a counter hash seeded by the window's
salt and the tensor's name, so every validator of a quorum computes the same head bit for bit.

A head on the grid travels as one byte per weight and one exponent per block (``protocol.head_delta``,
format v2), a quarter of the float32 head, instead of the two thirds of each word an exact step changes
(decision 0019). The grid adds noise of at most 2^e to a weight's step, a 254th of its block's largest
step at most, and no error accumulates: each head is the exact parent plus its exact grid step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["BLOCK", "GRIDS", "block_exponents", "block_of", "block_starts", "grid_step", "snap"]

GRIDS = ("exact", "int8")
BLOCK = 64  # elements per exponent: 2 bytes per 64 weights
MAX_Q = 127
_MIN_EXPONENT, _MAX_EXPONENT = -149, 120  # 2^e a float32 (subnormal at the low end), 127 · 2^e finite


def block_starts(sizes: Sequence[int]) -> npt.NDArray[np.intp]:
    """Where each block starts in the concatenation of tensors of ``sizes`` elements: blocks of
    ``BLOCK`` elements within a tensor, its last one shorter; an empty tensor has none."""
    lengths = np.asarray(sizes, np.intp)
    counts = -(-lengths // BLOCK)  # blocks per tensor
    first = np.repeat(np.cumsum(counts) - counts, counts)  # each block's tensor's first block
    within = np.arange(int(counts.sum()), dtype=np.intp) - first
    starts: npt.NDArray[np.intp] = np.repeat(np.cumsum(lengths) - lengths, counts) + BLOCK * within
    return starts


def block_of(starts: npt.NDArray[np.intp], total: int) -> npt.NDArray[np.intp]:
    """Each element's block."""
    lengths = np.diff(np.append(starts, total))
    return np.repeat(np.arange(len(starts)), lengths)


def block_exponents(step: npt.NDArray[np.float64], starts: npt.NDArray[np.intp]) -> npt.NDArray[np.int16]:
    """Per block, the smallest e with max |step| ≤ 127 · 2^e (the lowest for a block that stays)."""
    if not len(starts):
        return np.zeros(0, np.int16)
    top = np.maximum.reduceat(np.abs(step), starts) / MAX_Q
    mantissa, exponent = np.frexp(top)  # top = mantissa · 2^exponent, mantissa in [0.5, 1)
    smallest = np.where(mantissa == 0.5, exponent - 1, exponent)
    smallest = np.where(top == 0, _MIN_EXPONENT, smallest)
    return np.clip(smallest, _MIN_EXPONENT, _MAX_EXPONENT).astype(np.int16)


def _uniforms(count: int, seed: int) -> npt.NDArray[np.float64]:
    """``count`` uniforms in [0, 1) on a 2⁻²⁴ grid from a counter hash (murmur3's finalizer) of
    ``seed``: the same on every machine, no generator's stream involved."""
    h = np.arange(count, dtype=np.uint32) * np.uint32(0x9E3779B1) ^ np.uint32(seed)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return (h >> np.uint32(8)).astype(np.float64) * 2.0**-24


def _quantize(
    step: npt.NDArray[np.float64], starts: npt.NDArray[np.intp], seed: int
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int16]]:
    """``step`` (finite) as q per element and e per block, q = ⌊step / 2^e + u⌋ with ``_uniforms``
    of ``seed``: E[q · 2^e] = step."""
    exponents = block_exponents(step, starts)
    scaled = step / np.ldexp(1.0, exponents.astype(np.int32))[block_of(starts, len(step))]  # exact: 2^e
    q = np.floor(scaled + _uniforms(len(step), seed))
    return np.clip(q, -MAX_Q, MAX_Q).astype(np.int8), exponents


def grid_step(
    base: npt.NDArray[np.float32],
    q: npt.NDArray[np.int8],
    exponents: npt.NDArray[np.int16],
    starts: npt.NDArray[np.intp],
) -> npt.NDArray[np.float32]:
    """base + q · 2^e in float32 arithmetic: q · 2^e is exact, the sum rounded once, the same everywhere
    (exponents past a float32's range are clipped to it)."""
    within = np.clip(exponents.astype(np.int32), _MIN_EXPONENT, _MAX_EXPONENT)
    scales = np.ldexp(np.float32(1.0), within).astype(np.float32)
    moved: npt.NDArray[np.float32] = base + q.astype(np.float32) * scales[block_of(starts, len(base))]
    return moved


def _tensor_seed(salt: bytes, name: str) -> int:
    return int.from_bytes(hashlib.sha256(salt + b"\0" + name.encode()).digest()[:4], "little")


def snap(base: Mapping[str, np.ndarray], new: Mapping[str, np.ndarray], salt: bytes) -> dict[str, np.ndarray]:
    """``new`` moved onto the grid of ``base`` (module docstring): each float32 tensor of ``new`` that
    ``base`` holds in the same shape, and whose step from it is finite; any other tensor as it is."""
    snapped: dict[str, np.ndarray] = {}
    for name, value in new.items():
        parent = base.get(name)
        if value.dtype != np.float32 or parent is None or parent.dtype != np.float32 or parent.shape != value.shape:
            snapped[name] = value
            continue
        step = value.astype(np.float64).ravel() - parent.astype(np.float64).ravel()
        if not np.isfinite(step).all():
            snapped[name] = value
            continue
        starts = block_starts([step.size])
        q, exponents = _quantize(step, starts, _tensor_seed(salt, name))
        snapped[name] = grid_step(parent.ravel(), q, exponents, starts).reshape(value.shape)
    return snapped
