"""The prepared-dataset layout every dataset shares, and the one reader for it.

    <root>/<dataset>/train/fetch-manifest.json          the shard table (served by the edge)
    <root>/<dataset>/train/<locator>                     shard files named in the manifest
    <root>/<dataset>/<split>/<split>.safetensors         held-out splits: validators only, never served

The held-out splits: ``holdout`` (what validators judge on: carved from the training pool by a
random draw at preparation, so no trainer holds it and nobody outside knows which examples it is),
``reference`` (the validators' own training data for their trust anchor, drawn the same way),
``validation`` and ``test`` (the dataset's public evaluation splits, for reports). Validators of one
network share one prepared copy, so that they judge alike.

Readers check what they read: each shard against the manifest's sha256, splits through the shard codec
(and, in ``check_dataset``, against the manifest's feature kind and shape).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from protocol.errors import CodecError
from protocol.manifests import FetchManifest, ShardEntry
from protocol.shards import decode_shard, verify_shard

__all__ = [
    "HELD_OUT_SPLITS",
    "PreparedDataset",
    "check_dataset",
    "dataset_manifest",
    "load_split",
    "load_train",
    "manifest_path",
    "read_train_manifest",
    "shard_path",
    "split_path",
]

HELD_OUT_SPLITS = ("holdout", "reference", "validation", "test")


@dataclass(frozen=True)
class PreparedDataset:
    """A dataset in this layout: its train manifest and the examples of ``train`` and each held-out split."""

    root: Path
    manifest: FetchManifest
    split_examples: Mapping[str, int]


def manifest_path(dataset_root: Path) -> Path:
    return dataset_root / "train" / "fetch-manifest.json"


def shard_path(dataset_root: Path, entry: ShardEntry) -> Path:
    return dataset_root / "train" / entry.locator


def split_path(dataset_root: Path, split: str) -> Path:
    if split not in HELD_OUT_SPLITS:
        raise ValueError(f"unknown held-out split {split!r}; splits: {HELD_OUT_SPLITS}")
    return dataset_root / split / f"{split}.safetensors"


def read_train_manifest(dataset_root: Path) -> FetchManifest:
    """The train manifest under ``dataset_root``, with every shard file checked against it."""
    manifest = dataset_manifest(dataset_root)
    for _ in _checked_shards(dataset_root, manifest):
        pass
    return manifest


def load_train(dataset_root: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every train shard, checked against the manifest, concatenated in manifest order."""
    manifest = dataset_manifest(dataset_root)
    parts = [decode_shard(data, manifest.features) for data in _checked_shards(dataset_root, manifest)]
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


def load_split(dataset_root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """A held-out split as float32 features and int32 labels."""
    return decode_shard(split_path(dataset_root, split).read_bytes())


def check_dataset(dataset_root: Path) -> PreparedDataset:
    """The dataset at ``dataset_root``, every shard and split read and checked: shards against the
    manifest's sha256 and example counts, all against its feature kind, feature shape and classes."""
    manifest = dataset_manifest(dataset_root)
    examples = {"train": 0}
    for entry, data in zip(manifest.shards, _checked_shards(dataset_root, manifest), strict=True):
        x, y = decode_shard(data, manifest.features)
        if len(x) != entry.examples:
            raise CodecError(f"shard {entry.shard_id}: {len(x)} examples, manifest says {entry.examples}")
        _check_fits(manifest, f"shard {entry.shard_id}", x, y)
        examples["train"] += len(x)
    for split in HELD_OUT_SPLITS:
        x, y = decode_shard(split_path(dataset_root, split).read_bytes(), manifest.features)
        _check_fits(manifest, split, x, y)
        examples[split] = len(x)
    return PreparedDataset(dataset_root, manifest, examples)


def dataset_manifest(dataset_root: Path) -> FetchManifest:
    """The train manifest under ``dataset_root``, its shards not read: what the dataset holds (feature
    kind and shape, classes) and its table of shards."""
    return FetchManifest.from_wire(json.loads(manifest_path(dataset_root).read_bytes()))


def _checked_shards(dataset_root: Path, manifest: FetchManifest) -> Iterator[bytes]:
    """Each shard file's bytes, read once and checked against ``manifest``."""
    for entry in manifest.shards:
        data = shard_path(dataset_root, entry).read_bytes()
        verify_shard(entry, data)
        yield data


def _check_fits(manifest: FetchManifest, part: str, x: np.ndarray, y: np.ndarray) -> None:
    if x.shape[1:] != manifest.feature_shape:
        raise CodecError(f"{part}: features {list(x.shape[1:])}, manifest says {list(manifest.feature_shape)}")
    if y.size and not 0 <= y.min() <= y.max() < manifest.num_classes:
        raise CodecError(f"{part}: labels outside the manifest's {manifest.num_classes} classes")
