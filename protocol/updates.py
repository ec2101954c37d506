"""Update codecs: how a candidate artifact carries what a trainer learned. Pure NumPy.

An experiment picks one (``ExperimentSpec.codec``):

    fp32   the trained parameters themselves, float32 (4 bytes a parameter)
    fp16   the update θ − base as float16 (2 bytes a parameter)
    int8   the update θ − base, blockwise int8: each run of ``INT8_BLOCK`` values of a tensor shares
           one float32 scale (max |value| / 127); ``<name>`` holds the int8 values, ``<name>.scale``
           the block scales (≈ 1 byte a parameter)

Lossy codecs keep error feedback at the trainer (Seide et al. 2014; Karimireddy et al. 2019): what
quantization dropped in one window (the ``residual``) is added to the next window's update before it
is encoded, so nothing is lost for good, only delayed. Validators decode against the window's base
head and screen and merge the decoded parameters; the edge checks an artifact's exact layout
(``layout``: names, shapes, dtypes) before it stores it. Native and browser trainers call the same
functions, so their encodings are identical by construction.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from .codec import decode_tensors
from .errors import InvalidMessage, TooLarge
from .model import MAX_ARTIFACT_METADATA_BYTES, Model, Params

__all__ = ["CODECS", "INT8_BLOCK", "check_layout", "decode_update", "encode_update", "layout", "read_artifact"]

CODECS = ("fp32", "fp16", "int8")
INT8_BLOCK = 1024
_INT8_MAX = 127.0

Tensors = dict[str, npt.NDArray[np.generic]]


def _blocks(size: int) -> int:
    return -(-size // INT8_BLOCK)


def layout(spec: Model, codec: str) -> dict[str, tuple[np.dtype[np.generic], tuple[int, ...]]]:
    """The exact tensors (name → dtype, shape) of an artifact of ``spec`` under ``codec``."""
    if codec == "fp32":
        return {name: (np.dtype(np.float32), shape) for name, shape in spec.shapes.items()}
    if codec == "fp16":
        return {name: (np.dtype(np.float16), shape) for name, shape in spec.shapes.items()}
    if codec == "int8":
        tensors: dict[str, tuple[np.dtype[np.generic], tuple[int, ...]]] = {}
        for name, shape in spec.shapes.items():
            size = int(np.prod(shape))
            tensors[name] = (np.dtype(np.int8), (size,))
            tensors[f"{name}.scale"] = (np.dtype(np.float32), (_blocks(size),))
        return tensors
    raise InvalidMessage(f"unknown update codec {codec!r}; codecs: {CODECS}")


def check_layout(spec: Model, tensors: Mapping[str, np.ndarray], codec: str) -> None:
    """Raise ``InvalidMessage`` unless ``tensors`` is exactly ``layout(spec, codec)``."""
    expected = layout(spec, codec)
    if set(tensors) != set(expected):
        raise InvalidMessage(f"tensor names {sorted(tensors)} do not match a {codec} artifact of {spec.name}")
    for name, (dtype, shape) in expected.items():
        array = tensors[name]
        if array.dtype != dtype or array.shape != shape:
            raise InvalidMessage(f"{name}: expected {dtype}{list(shape)}, got {array.dtype}{list(array.shape)}")


def read_artifact(spec: Model, data: bytes, codec: str) -> dict[str, np.ndarray]:
    """The tensors in ``data`` if it is exactly an artifact of ``spec`` under ``codec`` (size, names,
    shapes, dtypes); raises ``TooLarge``, ``CodecError`` or ``InvalidMessage`` otherwise."""
    limit = 8 + MAX_ARTIFACT_METADATA_BYTES + sum(d.itemsize * int(np.prod(s)) for d, s in layout(spec, codec).values())
    if len(data) > limit:
        raise TooLarge(f"{len(data)} bytes is more than a {codec} {spec.name} artifact can be ({limit})")
    tensors, _ = decode_tensors(data)
    check_layout(spec, tensors, codec)
    return tensors


def encode_update(
    spec: Model,
    base: Mapping[str, np.ndarray],
    params: Mapping[str, np.ndarray],
    codec: str,
    residual: Mapping[str, np.ndarray] | None = None,
) -> tuple[Tensors, Params]:
    """The artifact tensors for ``params`` trained from ``base``, and the next residual (what this
    encoding dropped, with ``residual`` — the previous one — folded in; zeros for fp32)."""
    tensors: Tensors = {}
    dropped: Params = {}
    for name, shape in spec.shapes.items():
        if codec == "fp32":
            tensors[name] = np.asarray(params[name], np.float32)
            dropped[name] = np.zeros(shape, np.float32)
            continue
        delta = np.asarray(params[name], np.float32) - np.asarray(base[name], np.float32)
        if residual is not None:
            delta = delta + np.asarray(residual[name], np.float32)
        if codec == "fp16":
            tensors[name] = delta.astype(np.float16)
            decoded = tensors[name].astype(np.float32)
        elif codec == "int8":
            values, scales = _int8(delta.ravel())
            tensors[name], tensors[f"{name}.scale"] = values, scales
            decoded = _from_int8(values, scales).reshape(shape)
        else:
            raise InvalidMessage(f"unknown update codec {codec!r}; codecs: {CODECS}")
        dropped[name] = (delta - decoded).astype(np.float32)
    return tensors, dropped


def decode_update(spec: Model, base: Mapping[str, np.ndarray], tensors: Mapping[str, np.ndarray], codec: str) -> Params:
    """The trained parameters an artifact of ``codec`` carries, trained from ``base``."""
    check_layout(spec, tensors, codec)
    params: Params = {}
    for name, shape in spec.shapes.items():
        if codec == "fp32":
            params[name] = np.asarray(tensors[name], np.float32)
            continue
        if codec == "fp16":
            delta = np.asarray(tensors[name], np.float32)
        else:
            delta = _from_int8(tensors[name], tensors[f"{name}.scale"]).reshape(shape)
        params[name] = (np.asarray(base[name], np.float32) + delta).astype(np.float32)
    return params


def _int8(flat: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float32]]:
    padded = np.zeros(_blocks(flat.size) * INT8_BLOCK, np.float32)
    padded[: flat.size] = flat
    blocks = padded.reshape(-1, INT8_BLOCK)
    scales = (np.abs(blocks).max(axis=1) / _INT8_MAX).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1.0))
    values = np.clip(np.rint(blocks / safe[:, None]), -_INT8_MAX, _INT8_MAX).astype(np.int8)
    return values.ravel()[: flat.size], scales


def _from_int8(values: np.ndarray, scales: np.ndarray) -> npt.NDArray[np.float32]:
    padded = np.zeros(len(scales) * INT8_BLOCK, np.float32)
    padded[: values.size] = np.asarray(values, np.float32)
    return (padded.reshape(-1, INT8_BLOCK) * np.asarray(scales, np.float32)[:, None]).ravel()[: values.size]
