"""Strict readers for fields of decoded JSON messages; each raises ``InvalidMessage``."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TypeVar

from .errors import InvalidMessage

__all__ = ["opt", "read_bool", "read_dict", "read_float", "read_int", "read_list", "read_object", "read_str"]

T = TypeVar("T")


def read_object(value: object, what: str = "message") -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise InvalidMessage(f"{what} must be a JSON object")
    return value


def _get(data: Mapping[str, object], key: str) -> object:
    if key not in data:
        raise InvalidMessage(f"missing field {key!r}")
    return data[key]


def read_str(data: Mapping[str, object], key: str, *, max_len: int = 256) -> str:
    value = _get(data, key)
    if not isinstance(value, str) or len(value) > max_len:
        raise InvalidMessage(f"field {key!r} must be a string of at most {max_len} characters")
    return value


def read_sha256_hex(data: Mapping[str, object], key: str) -> str:
    """A sha256 digest as 64 lowercase hex digits."""
    digest = read_str(data, key, max_len=64)
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise InvalidMessage(f"field {key!r} must be 64 lowercase hex digits (a sha256)")
    return digest


def read_int(data: Mapping[str, object], key: str, *, low: int = 0, high: int = 2**53) -> int:
    value = _get(data, key)
    if type(value) is not int or not low <= value <= high:
        raise InvalidMessage(f"field {key!r} must be an integer in [{low}, {high}]")
    return value


def read_float(data: Mapping[str, object], key: str) -> float:
    value = _get(data, key)
    if type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
        raise InvalidMessage(f"field {key!r} must be a finite number")
    return float(value)  # type: ignore[arg-type]


def read_bool(data: Mapping[str, object], key: str) -> bool:
    value = _get(data, key)
    if type(value) is not bool:
        raise InvalidMessage(f"field {key!r} must be a boolean")
    return value


def read_list(data: Mapping[str, object], key: str, item: Callable[[object], T], *, max_len: int = 1024) -> list[T]:
    value = _get(data, key)
    if not isinstance(value, list) or len(value) > max_len:
        raise InvalidMessage(f"field {key!r} must be a list of at most {max_len} items")
    return [item(v) for v in value]


def read_dict(data: Mapping[str, object], key: str, *, max_len: int = 64) -> dict[str, float]:
    """A flat map of metric name to finite number."""
    value = _get(data, key)
    if not isinstance(value, dict) or len(value) > max_len:
        raise InvalidMessage(f"field {key!r} must be an object of at most {max_len} entries")
    return {k: read_float(value, k) for k in value if isinstance(k, str) and len(k) <= 64}


def opt(data: Mapping[str, object], key: str, reader: Callable[[Mapping[str, object], str], T]) -> T | None:
    """Read an optional field: absent or null gives ``None``."""
    return None if data.get(key) is None else reader(data, key)
