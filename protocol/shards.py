"""Dataset shards: a shard is a safetensors artifact with ``images`` (uint8) and ``labels`` (uint8).

Pixels are stored as integers k and read as k / 256 (the scaling of the MNIST source, exact in
float32). ``verify_shard`` checks downloaded bytes against their ``ShardEntry`` before use.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

from .codec import decode_tensors, encode_tensors
from .errors import CodecError, IntegrityError
from .manifests import ShardEntry

__all__ = ["PIXEL_SCALE", "decode_shard", "encode_shard", "verify_shard"]

PIXEL_SCALE = 1.0 / 256.0


def encode_shard(images: npt.NDArray[np.uint8], labels: npt.NDArray[np.integer]) -> bytes:
    if images.dtype != np.uint8 or len(images) != len(labels):
        raise CodecError("a shard holds uint8 images and one label per image")
    return encode_tensors({"images": images, "labels": np.asarray(labels, np.uint8)}, {"format": "dtn-shard-v1"})


def decode_shard(data: bytes) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32]]:
    """Features as float32 in [0, 1) and labels as int32."""
    tensors, _ = decode_tensors(data)
    images, labels = tensors.get("images"), tensors.get("labels")
    if images is None or labels is None or images.dtype != np.uint8 or len(images) != len(labels):
        raise CodecError("shard must hold uint8 'images' and 'labels' of equal length")
    return images.astype(np.float32) * np.float32(PIXEL_SCALE), labels.astype(np.int32)


def verify_shard(entry: ShardEntry, data: bytes) -> None:
    """Raise ``IntegrityError`` unless ``data`` has the size and sha256 the manifest lists."""
    if len(data) != entry.size_bytes:
        raise IntegrityError(f"shard {entry.shard_id}: {len(data)} bytes, manifest says {entry.size_bytes}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise IntegrityError(f"shard {entry.shard_id}: sha256 {digest} does not match manifest {entry.sha256}")
