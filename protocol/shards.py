"""Dataset shards: a shard is a safetensors artifact with uint8 features and uint8 ``labels``.

Two kinds of features (``FEATURE_KINDS``), named in the shard's metadata and in its fetch-manifest:

- ``pixels``: tensor ``images``, integers k read as k / 256 (the scaling of the MNIST source, exact
  in float32); labels ``[n]``. Metadata ``{"format": "dtn-shard-v1"}`` alone, as before tokens existed.
- ``tokens``: tensor ``tokens``, ids read as the same integers in float32; labels ``[n]`` or, for
  next-token data, one per position (``[n, T]`` as the tokens). Metadata adds ``"features": "tokens"``.

``verify_shard`` checks downloaded bytes against their ``ShardEntry`` before use. ``decode_shard``
gives float32 features; ``decode_shard_stored`` the uint8 arrays as stored, for a trainer that keeps
them so until its compiled step multiplies them by ``feature_scale`` (a quarter of the bytes to
concatenate, shuffle and copy to the device, and the same float32 values: k / 256 is exact).
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

from .codec import decode_tensors, encode_tensors
from .errors import CodecError, IntegrityError
from .manifests import FEATURE_KINDS, ShardEntry

__all__ = ["PIXEL_SCALE", "decode_shard", "decode_shard_stored", "encode_shard", "feature_scale", "verify_shard"]

PIXEL_SCALE = 1.0 / 256.0
_FORMAT = "dtn-shard-v1"
_TENSOR = {"pixels": "images", "tokens": "tokens"}


def encode_shard(
    features: npt.NDArray[np.uint8], labels: npt.NDArray[np.integer], features_kind: str = "pixels"
) -> bytes:
    """Shard bytes for uint8 ``features`` ([n, ...]) and integer ``labels`` in [0, 255]."""
    if features_kind not in FEATURE_KINDS:
        raise CodecError(f"unknown feature kind {features_kind!r}; kinds: {FEATURE_KINDS}")
    labels = np.asarray(labels)
    _check_shapes(features_kind, features, labels)
    if labels.size and (labels.min() < 0 or labels.max() > 255):
        raise CodecError("shard labels must be in [0, 255]")
    metadata = {"format": _FORMAT} | ({} if features_kind == "pixels" else {"features": features_kind})
    return encode_tensors({_TENSOR[features_kind]: features, "labels": labels.astype(np.uint8)}, metadata)


def feature_scale(features_kind: str) -> float:
    """What a stored uint8 feature is multiplied by to read it: ``PIXEL_SCALE`` for pixels, 1 for tokens."""
    if features_kind not in FEATURE_KINDS:
        raise CodecError(f"unknown feature kind {features_kind!r}; kinds: {FEATURE_KINDS}")
    return PIXEL_SCALE if features_kind == "pixels" else 1.0


def decode_shard_stored(
    data: bytes, features_kind: str | None = None
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8], str]:
    """Features and labels as stored (uint8) and the shard's feature kind; with ``features_kind`` (a
    manifest's), raise ``CodecError`` unless the shard holds that kind."""
    tensors, metadata = decode_tensors(data)
    kind = metadata.get("features", "pixels")
    if kind not in FEATURE_KINDS or (features_kind is not None and kind != features_kind):
        raise CodecError(f"shard holds {kind!r} features, expected {features_kind or FEATURE_KINDS}")
    features, labels = tensors.get(_TENSOR[kind]), tensors.get("labels")
    if features is None or labels is None or features.dtype != np.uint8 or labels.dtype != np.uint8:
        raise CodecError(f"shard must hold uint8 {_TENSOR[kind]!r} and 'labels'")
    _check_shapes(kind, features, labels)
    return np.asarray(features, np.uint8), np.asarray(labels, np.uint8), kind


def decode_shard(
    data: bytes, features_kind: str | None = None
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32]]:
    """Features as float32 (pixels in [0, 1), tokens as their ids) and labels as int32; with
    ``features_kind`` (a manifest's), raise ``CodecError`` unless the shard holds that kind."""
    features, labels, kind = decode_shard_stored(data, features_kind)
    return features.astype(np.float32) * np.float32(feature_scale(kind)), labels.astype(np.int32)


def _check_shapes(kind: str, features: npt.NDArray[np.generic], labels: npt.NDArray[np.generic]) -> None:
    if features.dtype != np.uint8 or features.ndim < 2 or len(features) != len(labels):
        raise CodecError("a shard holds uint8 features [n, ...] and labels for the same n examples")
    if labels.ndim != 1 and not (kind == "tokens" and labels.shape == features.shape):
        raise CodecError(f"{kind} shard labels must be [n]" + (" or shaped as the tokens" if kind == "tokens" else ""))


def verify_shard(entry: ShardEntry, data: bytes) -> None:
    """Raise ``IntegrityError`` unless ``data`` has the size and sha256 the manifest lists."""
    if len(data) != entry.size_bytes:
        raise IntegrityError(f"shard {entry.shard_id}: {len(data)} bytes, manifest says {entry.size_bytes}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise IntegrityError(f"shard {entry.shard_id}: sha256 {digest} does not match manifest {entry.sha256}")
