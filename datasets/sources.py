"""Readers of a user's own data, each giving a ``datasets.sharding.Source`` (``dtn dataset shard --from``).

npz     an ``.npz`` file with features and labels under one of ``NPZ_KEYS``: ``x``/``y``,
        ``images``/``labels``, ``features``/``labels``, or Keras's ``x_train``/``y_train`` (then
        ``x_test``/``y_test``, when there, are the test split). Pixels: uint8 as they are, floats in
        [0, 1] quantized to k / 256 (1.0 as 255), integers in [0, 255] as they are. Tokens: integer
        ids in [0, 255]. Labels: integers in [0, num_classes) (default: the largest label + 1).
images  a folder with one subfolder per class (classes numbered in sorted name order) holding
        images Pillow reads (``IMAGE_SUFFIXES``); grayscale ones as [H, W], all others as RGB
        [H, W, 3]. All must share one size and kind; the first odd file is named.
text    a text file, or a folder of them (``TEXT_SUFFIXES``, sorted by path), as one byte stream:
        byte-level tokens (vocabulary 256) cut into non-overlapping runs of ``context`` + 1 bytes;
        an example's features are a run's first ``context`` bytes, its labels the next byte at each
        position (next-token prediction).

Every defect raises ``ShardingError`` naming the file.
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

import numpy as np

from .sharding import Examples, ShardingError, Source

__all__ = [
    "IMAGE_SUFFIXES",
    "NPZ_KEYS",
    "TEXT_SUFFIXES",
    "read_images",
    "read_npz",
    "read_text",
    "text_source",
]

log = logging.getLogger(__name__)

NPZ_KEYS = (("x", "y"), ("images", "labels"), ("features", "labels"), ("x_train", "y_train"))
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py")
_GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "F")


def _existing(path: Path) -> Path:
    if not path.exists():
        raise ShardingError(f"{path}: no such file or folder")
    return path


def read_npz(path: Path, *, features: str = "pixels", num_classes: int | None = None) -> Source:
    """The examples of the ``.npz`` file at ``path`` (keys and conversions: the module's docstring)."""
    try:
        with np.load(_existing(path), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ShardingError(f"{path}: not a readable .npz file ({exc})") from None
    keys = next(((x, y) for x, y in NPZ_KEYS if x in arrays and y in arrays), None)
    if keys is None:
        raise ShardingError(f"{path}: holds {sorted(arrays)}; expected one pair of {NPZ_KEYS}")
    pool = _npz_examples(path, arrays[keys[0]], arrays[keys[1]], features)
    given = {}
    if keys[0] == "x_train" and "x_test" in arrays and "y_test" in arrays:
        given["test"] = _npz_examples(path, arrays["x_test"], arrays["y_test"], features)
    largest = max(int(e.labels.max()) for e in (pool, *given.values()) if e.labels.size)
    return _source(str(path), pool, features, largest + 1 if num_classes is None else num_classes, given)


def _npz_examples(path: Path, x: np.ndarray, y: np.ndarray, features: str) -> Examples:
    if len(x) == 0:
        raise ShardingError(f"{path}: no examples")
    if len(x) != len(y):
        raise ShardingError(f"{path}: {len(x)} feature rows but {len(y)} labels")
    if not np.issubdtype(y.dtype, np.integer):
        raise ShardingError(f"{path}: labels must be integers, not {y.dtype}")
    if x.dtype == np.uint8:
        return Examples(x, y)
    if np.issubdtype(x.dtype, np.floating) and features == "pixels":
        if not np.isfinite(x).all() or x.min() < 0.0 or x.max() > 1.0:
            raise ShardingError(f"{path}: float pixels must be in [0, 1]")
        return Examples(np.minimum(np.rint(x * 256.0), 255).astype(np.uint8), y)
    if np.issubdtype(x.dtype, np.integer):
        if x.min() < 0 or x.max() > 255:
            raise ShardingError(f"{path}: integer {features} must be in [0, 255], found {x.min()}..{x.max()}")
        return Examples(x.astype(np.uint8), y)
    raise ShardingError(f"{path}: {features} cannot be {x.dtype}")


def read_images(path: Path) -> Source:
    """The images under the class subfolders of ``path``, labelled by subfolder."""
    try:
        from PIL import Image, UnidentifiedImageError  # the `native` extra
    except ImportError:
        raise ShardingError("reading images needs Pillow (pip install 'dtn[native]' or pip install pillow)") from None
    classes = sorted(p for p in _existing(path).iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise ShardingError(f"{path}: expected one subfolder per class, at least two; found {len(classes)}")
    if len(classes) > 256:
        raise ShardingError(f"{path}: {len(classes)} classes; a dataset has at most 256")
    images: list[np.ndarray] = []
    labels: list[int] = []
    first: Path | None = None
    for label, folder in enumerate(classes):
        files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not files:
            raise ShardingError(f"{folder}: a class folder without images ({', '.join(IMAGE_SUFFIXES)})")
        for file in files:
            try:
                with Image.open(file) as image:
                    mode = "L" if image.mode in _GRAYSCALE_MODES else "RGB"
                    pixels = np.asarray(image.convert(mode), np.uint8)
            except (OSError, UnidentifiedImageError, ValueError) as exc:
                raise ShardingError(f"{file}: cannot read the image ({exc})") from None
            if first is not None and pixels.shape != images[0].shape:
                raise ShardingError(
                    f"{file}: {_describe(pixels.shape)}, but {first} and the images before are {_describe(images[0].shape)}"
                )
            first = first or file
            images.append(pixels)
            labels.append(label)
        log.info("class %d %r: %d images", label, folder.name, len(files))
    return _source(str(path), Examples(np.stack(images), np.asarray(labels, np.int64)), "pixels", len(classes))


def _describe(shape: tuple[int, ...]) -> str:
    height, width = shape[:2]
    return f"{width}x{height} {'RGB' if len(shape) == 3 else 'grayscale'}"


def read_text(path: Path, *, context: int = 128, suffixes: tuple[str, ...] = TEXT_SUFFIXES) -> Source:
    """Next-token examples from the text file at ``path``, or from the ``suffixes`` files under it."""
    if _existing(path).is_file():
        files = [path]
    else:
        files = sorted(p for p in path.rglob("*") if p.suffix in suffixes and p.is_file())
    if not files:
        raise ShardingError(f"{path}: no text files ({', '.join(suffixes)})")
    try:
        corpus = b"".join(file.read_bytes() for file in files)
    except OSError as exc:
        raise ShardingError(f"{exc.filename}: cannot read ({exc.strerror})") from None
    log.info("%d text files, %d bytes", len(files), len(corpus))
    return text_source(corpus, context, str(path))


def text_source(corpus: bytes, context: int, name: str) -> Source:
    """``corpus`` as next-token examples: features [n, context] and labels [n, context], both bytes."""
    if context < 1:
        raise ShardingError(f"context must be at least 1 byte, got {context}")
    runs = len(corpus) // (context + 1)
    if runs == 0:
        raise ShardingError(f"{name}: {len(corpus)} bytes, fewer than one example of {context + 1}")
    tokens = np.frombuffer(corpus, np.uint8, count=runs * (context + 1)).reshape(runs, context + 1)
    return _source(name, Examples(tokens[:, :-1], tokens[:, 1:]), "tokens", 256)


def _source(
    name: str, pool: Examples, features: str, num_classes: int, given: dict[str, Examples] | None = None
) -> Source:
    """A ``Source``, its complaints prefixed with ``name``."""
    try:
        return Source(pool, features, num_classes, given or {})
    except ShardingError as exc:
        raise ShardingError(f"{name}: {exc}") from None
