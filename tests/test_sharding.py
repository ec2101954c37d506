"""The sharding tool: shard kinds, each input kind end to end, its errors, the CLI and pystdlib."""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from datasets import pystdlib
from datasets.layout import HELD_OUT_SPLITS, check_dataset, load_split, load_train, manifest_path
from datasets.sharding import Examples, ShardingError, Source, shard, write_dataset
from datasets.sources import read_images, read_npz, read_text
from native_peer.cli import main as dtn
from protocol.errors import CodecError, InvalidMessage
from protocol.ids import DatasetId
from protocol.manifests import FetchManifest
from protocol.shards import decode_shard, encode_shard

ID = DatasetId("mine")


def _all_splits(root: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every part of the prepared dataset at ``root``, read back through ``datasets.layout``."""
    return {"train": load_train(root)} | {split: load_split(root, split) for split in HELD_OUT_SPLITS}


def _ids(pixels: np.ndarray) -> np.ndarray:
    """The example number written into the first two pixels of each image (see ``_numbered``)."""
    k = np.rint(pixels.reshape(len(pixels), -1)[:, :2] * 256).astype(np.int64)
    return k[:, 0] + 256 * k[:, 1]


def _numbered(n: int, shape: tuple[int, ...]) -> np.ndarray:
    """``n`` uint8 images whose first two pixels spell their number, the rest noise."""
    images = np.random.default_rng(n).integers(0, 256, (n, int(np.prod(shape))), dtype=np.uint8)
    images[:, 0], images[:, 1] = np.arange(n) % 256, np.arange(n) // 256
    return images.reshape(n, *shape)


def _assert_chunks(root: Path, corpus: bytes, context: int) -> None:
    """The dataset at ``root`` holds each run of ``context`` + 1 bytes of ``corpus`` once, as features
    (its first ``context`` bytes) and labels (the same run shifted by one)."""
    rows: Counter[bytes] = Counter()
    for x, y in _all_splits(root).values():
        np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
        rows.update(bytes(x[i].astype(np.uint8)) + bytes([y[i, -1]]) for i in range(len(x)))
    run = context + 1
    assert rows == Counter(corpus[i : i + run] for i in range(0, len(corpus) - context, run))


def _assert_partition(root: Path, labels: np.ndarray) -> None:
    """Train and held-out splits are disjoint and together hold each input example once, labelled."""
    parts = _all_splits(root)
    ids = np.concatenate([_ids(x) for x, _ in parts.values()])
    assert sorted(ids) == list(range(len(labels)))
    for x, y in parts.values():
        np.testing.assert_array_equal(y, labels[_ids(x)])


# -- the shard format ---------------------------------------------------------------------------------


def test_pixel_shards_keep_the_bytes_mnist_shards_always_had(dataset_root: Path) -> None:
    images = (np.arange(6 * 784) % 256).astype(np.uint8).reshape(6, 784)
    data = encode_shard(images, np.array([0, 1, 2, 7, 8, 9]))
    assert hashlib.sha256(data).hexdigest() == "ca09e681879416ab297a37efa0f058a487ed2b0716bdc7189eb72c563438afc2"
    root = dataset_root / "mnist"
    manifest = FetchManifest.from_wire(json.loads(manifest_path(root).read_bytes()))
    assert "features" not in manifest_path(root).read_text() and manifest.features == "pixels"
    entry = manifest.shards[0]
    x, y = decode_shard((root / "train" / entry.locator).read_bytes(), "pixels")
    again = encode_shard(np.rint(x * 256).astype(np.uint8), y)  # written by today's code ...
    assert hashlib.sha256(again).hexdigest() == entry.sha256  # ... the same bytes the manifest lists


def test_token_shards_hold_ids_and_next_token_labels() -> None:
    tokens = np.array([[104, 105, 33], [0, 255, 10]], np.uint8)
    data = encode_shard(tokens, np.array([[105, 33, 10], [255, 10, 0]]), "tokens")
    x, y = decode_shard(data, "tokens")
    assert x.dtype == np.float32 and y.dtype == np.int32
    np.testing.assert_array_equal(x, tokens.astype(np.float32))  # ids as they are, not scaled
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
    with pytest.raises(CodecError):
        decode_shard(data, "pixels")  # a manifest saying pixels is not read as tokens
    with pytest.raises(CodecError):
        encode_shard(tokens, np.array([[1, 2, 3], [4, 5, 6]]), "pixels")  # pixel labels are one per example
    with pytest.raises(CodecError):
        encode_shard(tokens, np.array([1, 256]), "tokens")


def test_the_manifest_carries_the_feature_kind_and_defaults_to_pixels() -> None:
    wire = {"dataset_id": "d", "split": "train", "feature_shape": [4], "num_classes": 256, "shards": []}
    assert FetchManifest.from_wire(wire).features == "pixels"
    tokens = FetchManifest.from_wire(wire | {"features": "tokens"})
    assert tokens.features == "tokens" and tokens.to_wire()["features"] == "tokens"
    for bad in ({"features": "audio"}, {"num_classes": 257}):
        with pytest.raises(InvalidMessage):
            FetchManifest.from_wire(wire | bad)


# -- each input kind, end to end ----------------------------------------------------------------------


def test_an_npz_of_float_images_becomes_train_shards_and_held_out_splits(tmp_path: Path) -> None:
    images, labels = _numbered(500, (8, 8)), np.arange(500) % 3
    np.savez(tmp_path / "data.npz", x=images.astype(np.float32) / 256, y=labels)
    prepared = shard(read_npz(tmp_path / "data.npz"), tmp_path / "out", ID, shard_size=64)
    root = tmp_path / "out/mine"
    assert check_dataset(root) == prepared
    assert prepared.split_examples == {"train": 350, "holdout": 50, "reference": 25, "validation": 25, "test": 50}
    assert prepared.manifest.feature_shape == (8, 8) and prepared.manifest.num_classes == 3
    assert [s.examples for s in prepared.manifest.shards] == [64] * 5 + [30]
    _assert_partition(root, labels)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine"]  # no staging folder left behind


def test_float_pixels_are_quantized_to_the_shard_scale(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", images=np.array([[0.0, 0.5], [1.0, 0.25]] * 20), labels=np.arange(40) % 2)
    pool = read_npz(tmp_path / "d.npz").pool
    assert pool.features.dtype == np.uint8 and pool.features[:2].tolist() == [[0, 128], [255, 64]]


def test_a_keras_style_npz_keeps_its_own_test_split(tmp_path: Path) -> None:
    test_x, test_y = _numbered(30, (4,)), np.arange(30) % 2
    np.savez(tmp_path / "k.npz", x_train=_numbered(200, (4,)), y_train=np.arange(200) % 2, x_test=test_x, y_test=test_y)
    shard(read_npz(tmp_path / "k.npz"), tmp_path, ID, shard_size=50)
    x, y = load_split(tmp_path / "mine", "test")
    np.testing.assert_array_equal(np.rint(x * 256), test_x)
    np.testing.assert_array_equal(y, test_y)


def test_a_folder_of_class_subfolders_becomes_a_labelled_dataset(tmp_path: Path) -> None:
    images = _numbered(90, (4, 5))
    for number, image in enumerate(images):
        folder = tmp_path / "photos" / ("cat", "dog", "eel")[number % 3]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{number:03d}.png")
    (tmp_path / "photos/cat/notes.txt").write_text("not an image: skipped")
    prepared = shard(read_images(tmp_path / "photos"), tmp_path / "out", ID, shard_size=16)
    assert prepared.manifest.feature_shape == (4, 5) and prepared.manifest.num_classes == 3
    _assert_partition(tmp_path / "out/mine", np.arange(90) % 3)  # labels: sorted subfolder names


def test_colour_images_keep_their_three_channels(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        Image.new("RGB", (3, 2), (10, 20, 30)).save(tmp_path / name / "x.png")
    assert read_images(tmp_path).pool.features.shape == (2, 2, 3, 3)


def test_text_becomes_next_token_examples_of_context_plus_one_bytes(tmp_path: Path) -> None:
    (tmp_path / "corpus/sub").mkdir(parents=True)
    files = {"b.txt": b"the quick brown fox " * 30, "a.py": b"print('hello')\n" * 40, "sub/c.md": b"# t\n" * 50}
    for name, data in files.items():
        (tmp_path / "corpus" / name).write_bytes(data)
    (tmp_path / "corpus/skip.bin").write_bytes(b"\xff" * 100)
    prepared = shard(read_text(tmp_path / "corpus", context=8), tmp_path / "out", ID, shard_size=32)
    corpus = b"".join(files[name] for name in ("a.py", "b.txt", "sub/c.md"))  # sorted path order
    assert prepared.manifest.features == "tokens" and prepared.manifest.feature_shape == (8,)
    assert prepared.manifest.num_classes == 256
    _assert_chunks(tmp_path / "out/mine", corpus, 8)


def test_pystdlib_is_the_interpreters_sorted_sources(tmp_path: Path) -> None:
    files = pystdlib.stdlib_sources()
    assert files == pystdlib.stdlib_sources() and len(files) > 100
    assert not any({"test", "tests", "site-packages"} & set(p.parts) for p in files)
    manifest = pystdlib.prepare(tmp_path, context=32, max_bytes=40_000, shard_size=100)
    prepared = check_dataset(tmp_path / "pystdlib")
    assert prepared.manifest == manifest and manifest.features == "tokens" and manifest.feature_shape == (32,)
    assert sum(prepared.split_examples.values()) == 40_000 // 33
    _assert_chunks(tmp_path / "pystdlib", b"".join(p.read_bytes() for p in files)[:40_000], 32)
    assert pystdlib.prepare(tmp_path, context=32) == manifest  # a verified copy is kept


# -- errors -------------------------------------------------------------------------------------------


def _png(size: tuple[int, int] = (4, 4)) -> bytes:
    out = io.BytesIO()
    Image.new("L", size, 7).save(out, "PNG")
    return out.getvalue()


def _with(folder: Path, name: str, data: bytes) -> Path:
    """``folder``, with ``data`` written to ``folder/name`` first."""
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return folder


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def _zeros(n: int) -> np.ndarray:
    return np.zeros((n, 2), np.uint8)


ERRORS = {
    "missing npz": (lambda t: read_npz(t / "nope.npz"), "nope.npz: no such file or folder"),
    "missing folder": (lambda t: read_images(t / "nope"), "nope: no such file or folder"),
    "missing text": (lambda t: read_text(t / "nope.txt"), "nope.txt: no such file or folder"),
    "not an npz": (lambda t: read_npz(_with(t, "x.npz", b"garbage") / "x.npz"), "x.npz: not a readable .npz file"),
    "npz keys": (
        lambda t: read_npz(_npz(t / "k.npz", a=_zeros(4), b=np.zeros(4))),
        "holds ['a', 'b']; expected one pair of",
    ),
    "npz lengths": (
        lambda t: read_npz(_npz(t / "l.npz", x=_zeros(4), y=np.zeros(3, int))),
        "4 feature rows but 3 labels",
    ),
    "npz empty": (lambda t: read_npz(_npz(t / "e.npz", x=_zeros(0), y=np.zeros(0, int))), "no examples"),
    "float labels": (lambda t: read_npz(_npz(t / "f.npz", x=_zeros(4), y=np.zeros(4))), "labels must be integers"),
    "pixels out of range": (
        lambda t: read_npz(_npz(t / "p.npz", x=np.full((4, 2), 1.5), y=np.zeros(4, int))),
        "float pixels must be in [0, 1]",
    ),
    "labels out of range": (
        lambda t: read_npz(_npz(t / "r.npz", x=_zeros(4), y=np.array([0, 1, 5, 1])), num_classes=2),
        "labels outside [0, 2)",
    ),
    "too many classes": (
        lambda t: read_npz(_npz(t / "c.npz", x=_zeros(4), y=np.array([0, 1, 300, 1]))),
        "301 classes: a dataset has 2 to 256",
    ),
    "corrupt image": (
        lambda t: read_images(_with(t / "img", "b/bad.png", b"\x89PNG not really")),
        "bad.png: cannot read the image",
    ),
    "mixed sizes": (
        lambda t: read_images(_with(t / "img", "b/wide.png", _png((5, 4)))),
        "b/wide.png: 5x4 grayscale, but",
    ),
    "one class": (lambda t: read_images(t / "img/a"), "expected one subfolder per class"),
    "empty class": (lambda t: read_images(_with(t / "img", "c/notes.txt", b"")), "a class folder without images"),
    "no text files": (lambda t: read_text(_with(t / "empty", "x.bin", b"")), "no text files"),
    "too little text": (
        lambda t: read_text(_with(t, "short.txt", b"abc") / "short.txt", context=8),
        "3 bytes, fewer than one example of 9",
    ),
    "too few examples": (
        lambda t: shard(read_npz(_npz(t / "s.npz", x=_zeros(3), y=np.array([0, 1, 0]))), t, ID),
        "leave none for training",
    ),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_unusable_input_is_a_sharding_error_that_says_why(case: str, tmp_path: Path) -> None:
    for name in ("a/0.png", "a/1.png", "b/0.png"):
        _with(tmp_path / "img", name, _png())
    action, message = ERRORS[case]
    with pytest.raises(ShardingError) as caught:
        action(tmp_path)
    assert message in str(caught.value)


def test_an_existing_dataset_is_replaced_only_when_forced(tmp_path: Path) -> None:
    source = Source(Examples(_numbered(100, (3,)), np.arange(100) % 2), "pixels", 2)
    first = write_dataset(tmp_path, ID, source, {s: 5 for s in HELD_OUT_SPLITS}, seed=1)
    with pytest.raises(ShardingError, match="already holds a dataset"):
        write_dataset(tmp_path, ID, source, {s: 5 for s in HELD_OUT_SPLITS}, seed=2)
    assert check_dataset(tmp_path / "mine") == first
    second = write_dataset(tmp_path, ID, source, {s: 5 for s in HELD_OUT_SPLITS}, seed=2, force=True)
    assert second.manifest != first.manifest and check_dataset(tmp_path / "mine") == second
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]


# -- the CLI ------------------------------------------------------------------------------------------


def test_dtn_dataset_shard_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "book.txt").write_bytes(bytes(range(256)) * 20)
    out = tmp_path / "datasets"
    dtn(["dataset", "shard", "--from", "text", str(tmp_path / "book.txt"), "--out", str(out), "--dataset-id", "book",
         "--context", "15", "--shard-size", "50", "--holdout", "0.2"])  # fmt: skip
    printed = capsys.readouterr().out
    assert "book: 4 train shards (192 examples); holdout 64, reference 16, validation 16, test 32" in printed
    assert "tokens features [15], 256 classes" in printed
    dtn(["dataset", "check", str(out / "book")])
    assert "every shard matches the manifest" in capsys.readouterr().out
    (out / "book/train/shards/train-00002.safetensors").write_bytes(b"flipped")
    with pytest.raises(SystemExit) as failed:
        dtn(["dataset", "check", str(out / "book")])
    assert failed.value.code == 1 and "train-00002" in capsys.readouterr().err


def test_dtn_dataset_shard_reports_bad_input_in_one_line_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as failed:
        dtn(["dataset", "shard", "--from", "images", str(tmp_path / "nothing"), "--out", str(tmp_path),
             "--dataset-id", "x"])  # fmt: skip
    assert failed.value.code == 2
    assert capsys.readouterr().err == f"dtn dataset shard: {tmp_path / 'nothing'}: no such file or folder\n"
