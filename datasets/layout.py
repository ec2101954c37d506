"""The prepared-dataset layout every dataset shares, and the one reader for it.

    <root>/<dataset>/train/fetch-manifest.json          the shard table (served by the edge)
    <root>/<dataset>/train/<locator>                     shard files named in the manifest
    <root>/<dataset>/<split>/<split>.safetensors         held-out splits: validators only, never served

The held-out splits: ``holdout`` (what validators judge on: carved from the training pool by a
random draw at preparation, so no trainer holds it and nobody outside knows which examples it is),
``reference`` (the validators' own training data for their trust anchor, drawn the same way),
``validation`` and ``test`` (the dataset's public evaluation splits, for reports). Validators of one
network share one prepared copy, so that they judge alike.

Readers check what they read: each shard against the manifest's sha256, splits through the shard codec.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from protocol.manifests import FetchManifest
from protocol.shards import decode_shard, verify_shard

__all__ = ["HELD_OUT_SPLITS", "load_split", "load_train", "manifest_path", "read_train_manifest", "split_path"]

HELD_OUT_SPLITS = ("holdout", "reference", "validation", "test")


def manifest_path(dataset_root: Path) -> Path:
    return dataset_root / "train" / "fetch-manifest.json"


def split_path(dataset_root: Path, split: str) -> Path:
    if split not in HELD_OUT_SPLITS:
        raise ValueError(f"unknown held-out split {split!r}; splits: {HELD_OUT_SPLITS}")
    return dataset_root / split / f"{split}.safetensors"


def read_train_manifest(dataset_root: Path) -> FetchManifest:
    """The train manifest under ``dataset_root``, with every shard file checked against it."""
    manifest = FetchManifest.from_wire(json.loads(manifest_path(dataset_root).read_bytes()))
    for _ in _checked_shards(dataset_root, manifest):
        pass
    return manifest


def load_train(dataset_root: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every train shard, checked against the manifest, concatenated in manifest order."""
    manifest = FetchManifest.from_wire(json.loads(manifest_path(dataset_root).read_bytes()))
    parts = [decode_shard(data) for data in _checked_shards(dataset_root, manifest)]
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


def _checked_shards(dataset_root: Path, manifest: FetchManifest) -> Iterator[bytes]:
    """Each shard file's bytes, read once and checked against ``manifest``."""
    for entry in manifest.shards:
        data = (dataset_root / "train" / entry.locator).read_bytes()
        verify_shard(entry, data)
        yield data


def load_split(dataset_root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """A held-out split as float32 features and int32 labels."""
    return decode_shard(split_path(dataset_root, split).read_bytes())
