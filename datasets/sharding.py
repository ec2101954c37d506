"""Writing a prepared dataset (``datasets.layout``) from examples any source read: the one writer.

    source = Source(Examples(features, labels), "pixels", num_classes=10)
    prepared = shard(source, Path("var/datasets"), DatasetId("mine"))     # held-out splits by fraction
    write_dataset(out, dataset_id, source, drawn={"holdout": 5000, ...})  # ... or by count (MNIST)

A random draw (fresh per preparation, written nowhere) moves examples from the pool to each held-out
split the source does not bring (``drawn``); the rest, in source order, is cut into train shards of
``shard_size`` examples. Everything is written to a staging folder next to the dataset and moved
into place at the end, so a dataset folder is either the old dataset or the whole new one. An
existing dataset is replaced only with ``force``.

``ShardingError`` is the one error for input that cannot become a dataset; its message names the
input and the reason (the CLI prints it and exits with status 2).
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from protocol.errors import IntegrityError, InvalidMessage
from protocol.ids import DatasetId, ShardId
from protocol.manifests import FEATURE_KINDS, FetchManifest, ShardEntry
from protocol.shards import encode_shard

from .layout import HELD_OUT_SPLITS, PreparedDataset, manifest_path, read_train_manifest, split_path

__all__ = [
    "DEFAULT_FRACTIONS",
    "Examples",
    "ShardingError",
    "Source",
    "draw_sizes",
    "shard",
    "verified_copy",
    "write_dataset",
]

log = logging.getLogger(__name__)

DEFAULT_FRACTIONS: Mapping[str, float] = {"holdout": 0.1, "reference": 0.05, "validation": 0.05, "test": 0.1}


class ShardingError(ValueError):
    """Input that cannot become a prepared dataset (unreadable, inconsistent or too small)."""


@dataclass(frozen=True)
class Examples:
    """uint8 ``features`` [n, ...] and integer ``labels`` [n] (or [n, T] for next-token data)."""

    features: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        if self.features.dtype != np.uint8 or self.features.ndim < 2:
            raise ShardingError(
                f"features must be uint8 [n, ...], got {self.features.dtype}{list(self.features.shape)}"
            )
        if not np.issubdtype(self.labels.dtype, np.integer):
            raise ShardingError(f"labels must be integers, got {self.labels.dtype}")
        if len(self.labels) != len(self.features):
            raise ShardingError(f"{len(self.features)} examples but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.features)

    def take(self, index: np.ndarray) -> Examples:
        return Examples(self.features[index], self.labels[index])


@dataclass(frozen=True)
class Source:
    """What a reader found: the pool to split and shard, its feature kind and number of classes, and
    the held-out splits the source brings itself (MNIST's validation and test)."""

    pool: Examples
    features: str
    num_classes: int
    given: Mapping[str, Examples] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.features not in FEATURE_KINDS:
            raise ShardingError(f"unknown feature kind {self.features!r}; kinds: {FEATURE_KINDS}")
        if not 2 <= self.num_classes <= 256:
            raise ShardingError(f"{self.num_classes} classes: a dataset has 2 to 256 (labels are one byte)")
        for split, examples in {"pool": self.pool, **self.given}.items():
            if split != "pool" and split not in HELD_OUT_SPLITS:
                raise ShardingError(f"unknown held-out split {split!r}; splits: {HELD_OUT_SPLITS}")
            if examples.features.shape[1:] != self.pool.features.shape[1:]:
                raise ShardingError(f"{split}: features {list(examples.features.shape[1:])} differ from the pool's")
            labels = examples.labels
            if labels.ndim != 1 and not (self.features == "tokens" and labels.shape == examples.features.shape):
                raise ShardingError(f"{split}: labels {list(labels.shape)} are neither [n] nor shaped as the tokens")
            if labels.size and not 0 <= labels.min() <= labels.max() < self.num_classes:
                raise ShardingError(f"{split}: labels outside [0, {self.num_classes}): {labels.min()}..{labels.max()}")


def draw_sizes(total: int, fractions: Mapping[str, float]) -> dict[str, int]:
    """Examples to draw for each split: its fraction of ``total``, at least one."""
    if any(not 0 < f < 1 for f in fractions.values()) or sum(fractions.values()) >= 1:
        raise ShardingError(f"split fractions must be in (0, 1) and leave some for training: {dict(fractions)}")
    return {split: max(1, round(total * fraction)) for split, fraction in fractions.items()}


def shard(
    source: Source,
    out: Path,
    dataset_id: DatasetId,
    *,
    fractions: Mapping[str, float] = DEFAULT_FRACTIONS,
    shard_size: int = 1000,
    force: bool = False,
) -> PreparedDataset:
    """Write ``source`` as ``out/<dataset_id>``, drawing each held-out split it lacks by ``fractions``."""
    missing = {split: fractions[split] for split in HELD_OUT_SPLITS if split not in source.given}
    drawn = draw_sizes(len(source.pool), missing)
    return write_dataset(out, dataset_id, source, drawn, shard_size=shard_size, force=force)


def write_dataset(
    out: Path,
    dataset_id: DatasetId,
    source: Source,
    drawn: Mapping[str, int],
    *,
    shard_size: int = 1000,
    force: bool = False,
    seed: int | None = None,
) -> PreparedDataset:
    """Write ``source`` as ``out/<dataset_id>``: ``drawn[split]`` random pool examples for each split the
    source does not bring, train shards from the rest. ``seed`` fixes the draw (for tests); by default
    it is fresh and known to nobody after."""
    if set(drawn) | set(source.given) != set(HELD_OUT_SPLITS) or set(drawn) & set(source.given):
        raise ShardingError(f"each held-out split {HELD_OUT_SPLITS} must be drawn or given, once")
    if shard_size < 1:
        raise ShardingError(f"shard size must be positive, got {shard_size}")
    held = sum(drawn.values())
    if held >= len(source.pool):
        raise ShardingError(f"{len(source.pool)} examples: the held-out splits {dict(drawn)} leave none for training")
    root = out / dataset_id
    if root.exists() and any(root.iterdir()) and not force:
        raise ShardingError(f"{root} already holds a dataset (--force replaces it)")
    order = np.random.default_rng(secrets.randbits(128) if seed is None else seed).permutation(len(source.pool))
    splits, start = dict(source.given), 0
    for split, size in drawn.items():
        splits[split] = source.pool.take(order[start : start + size])
        start += size
    train = source.pool.take(np.sort(order[held:]))
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dataset_id}.", suffix=".staging", dir=out))
    try:
        manifest = _write_train(staging, dataset_id, source, train, shard_size)
        for split, examples in splits.items():
            _write(split_path(staging, split), encode_shard(examples.features, examples.labels, source.features))
        _write(manifest_path(staging), json.dumps(manifest.to_wire(), indent=1).encode())
        _move_into_place(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    sizes = {"train": len(train)} | {split: len(splits[split]) for split in HELD_OUT_SPLITS}
    log.info("prepared %s: %d shards, %s", root, len(manifest.shards), sizes)
    return PreparedDataset(root, manifest, sizes)


def verified_copy(dataset_root: Path) -> FetchManifest | None:
    """The manifest of a complete prepared copy at ``dataset_root`` whose shards all match it, else None."""
    if not manifest_path(dataset_root).exists() or not all(
        split_path(dataset_root, s).exists() for s in HELD_OUT_SPLITS
    ):
        return None
    try:
        return read_train_manifest(dataset_root)
    except (IntegrityError, InvalidMessage, OSError, ValueError) as exc:
        log.warning("%s is not a verified copy: %s", dataset_root, exc)
        return None


def _write_train(root: Path, dataset_id: DatasetId, source: Source, train: Examples, shard_size: int) -> FetchManifest:
    entries = []
    count = -(-len(train) // shard_size)
    for index, start in enumerate(range(0, len(train), shard_size)):
        shard_id = ShardId(f"train-{index:05d}")
        part = Examples(train.features[start : start + shard_size], train.labels[start : start + shard_size])
        data = encode_shard(part.features, part.labels, source.features)
        locator = f"shards/{shard_id}.safetensors"
        _write(manifest_path(root).parent / locator, data)
        entries.append(ShardEntry(shard_id, locator, hashlib.sha256(data).hexdigest(), len(data), len(part)))
        if count >= 20 and (index + 1) % (count // 10) == 0:
            log.info("wrote %d of %d shards", index + 1, count)
    shape = source.pool.features.shape[1:]
    return FetchManifest(dataset_id, "train", shape, source.num_classes, tuple(entries), source.features)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _move_into_place(staging: Path, root: Path) -> None:
    """Replace ``root`` by ``staging`` (both in one folder): the old copy is set aside, then removed."""
    old = root.with_name(f".{root.name}.{secrets.token_hex(4)}.old")
    if root.exists():
        root.rename(old)
    staging.rename(root)
    shutil.rmtree(old, ignore_errors=True)
