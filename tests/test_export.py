"""``dtn export`` (``native_peer.export``; issue #23 item 5): an experiment's best head that a quorum of
the network's validators vouches for, as safetensors the official library loads plus the model's
config; heads and certificates that do not verify are refused, a tampered archive too. These tests
read real signed heads from a lineage archive; ``tests/test_examples.py`` exports the Flax NNX example
trained through a real edge and a quorum of validators and loads it back into the user's module."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from native_peer.cli import main as dtn_main
from native_peer.learner import spec_learner
from protocol.codec import encode_tensors
from protocol.hashing import content_id
from protocol.ids import ContentId, ExperimentKey, HeadId
from protocol.lineage import Lineage, write_archive
from protocol.manifests import NetworkManifest
from protocol.messages import Attestation, HeadDescriptor
from protocol.model import ModelSpec, init_params, mlp
from protocol.signing import PureSigner

from .support import experiment_spec, head_envelope, now_ms

A, B, OUTSIDER = PureSigner(b"\x21" * 32), PureSigner(b"\x22" * 32), PureSigner(b"\x23" * 32)
KEY = ExperimentKey.parse("study/tiny/rev-1")
TINY = mlp("tiny-mlp", (8, 4))
NETWORK = NetworkManifest("export-net", (A.public_key, B.public_key), (experiment_spec(KEY, model=TINY),), quorum=2)


def _head(window: int, parent: HeadDescriptor | None, val_loss: float) -> tuple[HeadDescriptor, bytes]:
    """A head of ``window`` proposed by A with val_loss ``val_loss`` and B's attestation: what quorum 2
    needs; and its artifact."""
    params = init_params(TINY, window)
    head, _ = head_envelope(
        params,
        parent=None if parent is None else parent.head_id,
        window=window,
        signer=A,
        experiment=KEY,
        metrics={"val_loss": val_loss, "val_accuracy": 1 - val_loss / 3},
    )
    return replace(head, certificate=(Attestation.of(head, [], B, now_ms()),)), encode_tensors(params)


def _lineage(*losses: float) -> tuple[list[HeadDescriptor], dict[ContentId, bytes]]:
    heads, blobs, parent = [], {}, None
    for window, loss in enumerate(losses):
        parent, artifact = _head(window, parent, loss)
        heads.append(parent)
        blobs[ContentId(parent.head_id)] = artifact
    return heads, blobs


def _export(tmp_path: Path, heads: list[HeadDescriptor], blobs: dict[ContentId, bytes]) -> Path:
    """``dtn export`` of ``heads`` (and ``blobs``) as a lineage archive; the folder written."""
    (tmp_path / "network.json").write_text(json.dumps(NETWORK.to_wire()))
    (tmp_path / "lineage.tar").write_bytes(write_archive(Lineage("export-net", KEY, tuple(heads), blobs=blobs)))
    dtn_main(["export", "--experiment", str(KEY), "--lineage", str(tmp_path / "lineage.tar"),
              "--network", str(tmp_path / "network.json"), "--out", str(tmp_path / "out")])  # fmt: skip
    return tmp_path / "out"


def test_export_writes_the_best_certified_head_as_safetensors_and_its_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    heads, blobs = _lineage(2.3, 0.4, 0.9)  # the best by validation loss is not the newest
    out = _export(tmp_path, heads, blobs)
    assert f"head {heads[1].head_id[:19]} of window 1 (val_loss 0.4000)" in capsys.readouterr().out
    loaded = load_file(out / "model.safetensors")  # the official library, nothing of this project's
    expected = init_params(TINY, 1)
    assert set(loaded) == set(TINY.shapes)
    assert all(loaded[name].dtype == np.float32 and np.array_equal(loaded[name], expected[name]) for name in expected)
    config = json.loads((out / "config.json").read_text())
    model = ModelSpec.from_wire(config["model"])
    assert model == TINY and config["experiment"] == str(KEY) and config["quorum"] == 2
    head = HeadDescriptor.from_wire(config["head"])
    head.verify_trusted(NETWORK.validator_key_set, NETWORK.quorum)  # anyone can check it again
    learner = spec_learner(model)
    params = learner.from_tensors(loaded)  # into the model's own parameters, by the wire names
    assert learner.apply(params, np.ones((2, 8), np.float32)).shape == (2, 4)


def _forged(head: HeadDescriptor, how: str) -> HeadDescriptor:
    if how == "no certificate":  # the proposer alone: one of the two the quorum needs
        return replace(head, certificate=())
    if how == "an outsider's attestation":
        return replace(head, certificate=(Attestation.of(head, [], OUTSIDER, now_ms()),))
    if how == "metrics changed after signing":
        return replace(head, metrics={**head.metrics, "val_loss": 0.01})
    assert how == "another head's attestation"
    other = replace(head, head_id=HeadId(content_id(b"other bytes")))
    return replace(head, certificate=(Attestation.of(other, [], B, now_ms()),))


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("no certificate", "certified by 1 validator(s); this network needs 2"),
        ("an outsider's attestation", "certified by 1 validator(s); this network needs 2"),
        ("another head's attestation", "certified by 1 validator(s); this network needs 2"),
        ("metrics changed after signing", "signature"),
    ],
)
def test_a_tampered_head_or_certificate_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str, why: str
) -> None:
    heads, blobs = _lineage(2.3, 0.4, 0.9)
    heads[1] = _forged(heads[1], how)  # the best of them, were it trusted
    out = _export(tmp_path, heads, blobs)
    captured = capsys.readouterr()
    refused = [line for line in captured.err.splitlines() if line.startswith("dtn export: refused")]
    assert len(refused) == 1 and "(window 1): " in refused[0] and why in refused[0].lower(), captured.err
    assert f"head {heads[2].head_id[:19]} of window 2" in captured.out  # the best that verifies
    assert np.array_equal(load_file(out / "model.safetensors")["dense0.kernel"], init_params(TINY, 2)["dense0.kernel"])
    with pytest.raises(SystemExit, match="has no head that 2 of the network's 2 validators vouch for; refused: head"):
        _export(tmp_path, [_forged(head, how) for head in heads], blobs)


def test_an_archive_whose_artifact_is_not_the_heads_is_refused(tmp_path: Path) -> None:
    heads, blobs = _lineage(2.3, 0.4)
    (tmp_path / "network.json").write_text(json.dumps(NETWORK.to_wire()))
    archive = io.BytesIO(write_archive(Lineage("export-net", KEY, tuple(heads), blobs=blobs)))
    tampered = io.BytesIO()
    with tarfile.open(fileobj=archive) as source, tarfile.open(fileobj=tampered, mode="w") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read()  # type: ignore[union-attr]
            if member.name == f"blobs/{heads[1].head_id.removeprefix('sha256:')}":
                data = encode_tensors({name: value + 1 for name, value in init_params(TINY, 1).items()})
                member.size = len(data)
            target.addfile(member, io.BytesIO(data))
    (tmp_path / "lineage.tar").write_bytes(tampered.getvalue())
    with pytest.raises(
        SystemExit, match=rf"dtn export: .*lineage.tar: content id mismatch: expected {heads[1].head_id}"
    ):
        dtn_main(["export", "--experiment", str(KEY), "--lineage", str(tmp_path / "lineage.tar"),
                  "--network", str(tmp_path / "network.json"), "--out", str(tmp_path / "out")])  # fmt: skip
    assert not (tmp_path / "out").exists()
