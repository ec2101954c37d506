"""Safetensors-compatible tensor codec.

Layout: 8-byte little-endian header length N, N bytes of JSON header (padded with spaces to a
multiple of 8), then the raw little-endian C-order tensor bytes. The header maps each tensor name to
``{"dtype", "shape", "data_offsets"}`` and may hold ``"__metadata__"`` (str -> str). Tensors are
written in name order, so the same tensors and metadata always give the same bytes (and content id).
Files written here load with the public ``safetensors`` library and its files load here.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from math import prod

import numpy as np
import numpy.typing as npt

from .errors import CodecError
from .framing import read_json_header

__all__ = ["MAX_HEADER_BYTES", "decode_tensors", "encode_tensors"]

MAX_HEADER_BYTES = 1 << 20
_HEADER_LENGTH = struct.Struct("<Q")

_DTYPES: dict[str, np.dtype[np.generic]] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}

Tensors = dict[str, npt.NDArray[np.generic]]


def encode_tensors(tensors: Mapping[str, npt.ArrayLike], metadata: Mapping[str, str] | None = None) -> bytes:
    """Encode named tensors (and optional string metadata) as safetensors bytes."""
    header: dict[str, object] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise CodecError("metadata must map str to str")
        header["__metadata__"] = dict(sorted(metadata.items()))
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        if name == "__metadata__":
            raise CodecError("'__metadata__' is not a tensor name")
        array = np.asarray(tensors[name])
        key = _NAMES.get(array.dtype.newbyteorder("<"))
        if key is None:
            raise CodecError(f"tensor {name!r}: unsupported dtype {array.dtype}")
        data = np.ascontiguousarray(array, dtype=_DTYPES[key]).tobytes()
        header[name] = {
            "dtype": key,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return _HEADER_LENGTH.pack(len(raw)) + raw + b"".join(chunks)


def decode_tensors(data: bytes | bytearray | memoryview) -> tuple[Tensors, dict[str, str]]:
    """Decode safetensors bytes into ``(tensors, metadata)``; raise ``CodecError`` on any defect."""
    view = memoryview(data)
    header, body_start = read_json_header(view, _HEADER_LENGTH, 0, MAX_HEADER_BYTES, CodecError, "artifact")
    if not isinstance(header, dict):
        raise CodecError("header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise CodecError("__metadata__ must map str to str")
    body = view[body_start:]
    spans: list[tuple[int, int]] = []
    tensors: Tensors = {}
    for name, info in header.items():
        dtype, shape, begin, end = _check_entry(name, info)
        if end > len(body):
            raise CodecError(f"tensor {name!r} ends past the data section")
        if (end - begin) != prod(shape) * dtype.itemsize:
            raise CodecError(f"tensor {name!r}: {end - begin} bytes do not fit shape {shape}")
        spans.append((begin, end))
        tensors[name] = np.frombuffer(body[begin:end], dtype=dtype).reshape(shape).copy()
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            raise CodecError("tensor data has gaps or overlaps")
        position = end
    if position != len(body):
        raise CodecError("trailing bytes after the last tensor")
    return tensors, dict(metadata)


def _check_entry(name: str, info: object) -> tuple[np.dtype[np.generic], list[int], int, int]:
    if not isinstance(info, dict):
        raise CodecError(f"tensor {name!r}: entry is not an object")
    dtype = _DTYPES.get(info.get("dtype"))  # type: ignore[arg-type]
    shape = info.get("shape")
    offsets = info.get("data_offsets")
    if dtype is None:
        raise CodecError(f"tensor {name!r}: unsupported dtype {info.get('dtype')!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise CodecError(f"tensor {name!r}: bad shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise CodecError(f"tensor {name!r}: bad data_offsets {offsets!r}")
    return dtype, shape, offsets[0], offsets[1]
