"""Lineage archives (``protocol.lineage``, ``server.lineage``, ``dtn lineage``): a 2-of-3 network's
signed lineage written as one archive, verified whole before an edge serves any of it; tampered,
broken and under-certified archives refused with a one-line reason."""

from __future__ import annotations

import contextlib
import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from protocol.codec import encode_tensors
from protocol.errors import IntegrityError, InvalidMessage, ProtocolError, SignatureError, TooLarge
from protocol.hashing import content_id
from protocol.ids import ContentId, HeadId
from protocol.lineage import Lineage, read_archive, verify_lineage, write_archive
from protocol.manifests import NetworkManifest
from protocol.messages import Attestation, Candidate, HeadDescriptor, Verdict
from protocol.model import init_params
from protocol.reasons import Reason
from protocol.signing import PureSigner, peer_id_from_public_key
from server.serve import BackgroundEdge
from tools.dtn import main as dtn

from .support import EXPERIMENT, SPEC, candidate_envelope, edge_settings, experiment_spec, now_ms

VALIDATORS = [PureSigner(bytes([i]) * 32) for i in (0x21, 0x22, 0x23)]
OUTSIDER = PureSigner(b"\x29" * 32)
TRAINER = PureSigner(b"\x31" * 32)
KEYS = frozenset(v.public_key for v in VALIDATORS)
NETWORK = NetworkManifest("lineage-net", tuple(v.public_key for v in VALIDATORS), (experiment_spec(),), quorum=2)
MAX_BLOB = 1 << 24


def _certified(head: HeadDescriptor, proposer: PureSigner, attester: PureSigner) -> HeadDescriptor:
    head = head.signed(proposer)
    return replace(head, certificate=(Attestation.of(head, [], attester, now_ms()),))


def _lineage(windows: int = 3, seed: int = 0) -> Lineage:
    """Heads 0..windows-1, each proposed by one validator and attested by the next; a candidate on each
    head but the last, merged by the head after it, with the accepting verdict and the two votes that
    made it count."""
    heads: list[HeadDescriptor] = []
    candidates: list[Candidate] = []
    verdicts: list[Verdict] = []
    blobs: dict[ContentId, bytes] = {}
    for window in range(windows):
        artifact = encode_tensors(init_params(SPEC, seed + window))
        blobs[content_id(artifact)] = artifact
        parent = heads[-1] if heads else None
        head = HeadDescriptor(
            experiment=EXPERIMENT,
            head_id=HeadId(content_id(artifact)),
            parent=None if parent is None else parent.head_id,
            window=window,
            global_step=window * 10,
            merged=tuple(c.candidate_id for c in candidates[-1:]) if parent is not None else (),
            validator_key=VALIDATORS[window % 3].public_key,
            created_at_ms=now_ms(),
        )
        heads.append(_certified(head, VALIDATORS[window % 3], VALIDATORS[(window + 1) % 3]))
        if parent is not None:
            merged = candidates[-1]
            verdicts.append(
                Verdict(
                    EXPERIMENT,
                    merged.candidate_id,
                    merged.base_head,
                    merged.peer_id,
                    True,
                    Reason.ACCEPTED,
                    "",
                    VALIDATORS[0].public_key,
                    now_ms(),
                    head_id=heads[-1].head_id,
                    metrics={"examples": 1000.0},
                ).signed(VALIDATORS[0])
            )
        if window < windows - 1:
            candidates.append(candidate_envelope(TRAINER, heads[-1].head_id, f"lease-{window}", seed=window)[0])
    # each accepting verdict's certificate on this 2-of-3 network: its own vote and a second validator's
    votes = [
        vote for v in verdicts for vote in (v, replace(v, validator_key=VALIDATORS[1].public_key).signed(VALIDATORS[1]))
    ]
    return Lineage(
        NETWORK.network_id, EXPERIMENT, tuple(heads), tuple(candidates), tuple(verdicts), blobs, tuple(votes)
    )


@pytest.fixture(scope="module")
def lineage() -> Lineage:
    return _lineage()


def _refused(lineage: Lineage, error: type[ProtocolError] = InvalidMessage) -> str:
    """Why the archive of ``lineage`` is refused (with ``error``), after a round trip through its bytes."""
    with pytest.raises(error) as refused:
        verify_lineage(read_archive(write_archive(lineage), max_blob_bytes=MAX_BLOB), NETWORK)
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_an_archive_round_trips_byte_for_byte_and_verifies(lineage: Lineage) -> None:
    data = write_archive(lineage)
    read = read_archive(data, max_blob_bytes=MAX_BLOB)
    verify_lineage(read, NETWORK)
    assert read == lineage
    assert write_archive(read) == data  # deterministic: its sha256 names it


def test_a_tampered_head_signature_is_refused(lineage: Lineage) -> None:
    heads = list(lineage.heads)
    heads[1] = replace(heads[1], metrics={"val_accuracy": 0.99})  # changed after it was signed
    assert "window 1" in _refused(replace(lineage, heads=tuple(heads)), SignatureError)


def test_a_broken_parent_chain_is_refused(lineage: Lineage) -> None:
    message = _refused(replace(lineage, heads=(lineage.heads[0], lineage.heads[2])))
    assert "breaks the parent chain" in message and "window 2" in message


def test_a_lineage_that_does_not_begin_at_genesis_is_refused(lineage: Lineage) -> None:
    assert "breaks the parent chain" in _refused(replace(lineage, heads=lineage.heads[1:]))


def test_a_head_short_of_its_quorum_is_refused(lineage: Lineage) -> None:
    heads = list(lineage.heads)
    heads[2] = replace(heads[2], certificate=())
    message = _refused(replace(lineage, heads=tuple(heads)), SignatureError)
    assert "certified by 1 validator(s); this network needs 2" in message and "window 2" in message


def test_an_attestation_by_a_key_outside_the_network_does_not_count(lineage: Lineage) -> None:
    heads = list(lineage.heads)
    heads[0] = _certified(replace(heads[0], certificate=()), VALIDATORS[0], OUTSIDER)
    assert "certified by 1 validator(s)" in _refused(replace(lineage, heads=tuple(heads)), SignatureError)


def test_a_head_proposed_by_an_outsider_is_refused(lineage: Lineage) -> None:
    heads = list(lineage.heads)
    heads[0] = _certified(replace(heads[0], validator_key=OUTSIDER.public_key), OUTSIDER, VALIDATORS[1])
    message = _refused(replace(lineage, heads=tuple(heads)), SignatureError)
    assert "not signed by a validator of this network" in message


def test_a_head_whose_artifact_is_missing_is_refused(lineage: Lineage) -> None:
    blobs = dict(lineage.blobs)
    del blobs[lineage.heads[1].head_id]
    assert "does not hold" in _refused(replace(lineage, blobs=blobs))


def test_a_verdict_the_lineage_does_not_bear_out_is_refused(lineage: Lineage) -> None:
    verdict = lineage.verdicts[0]
    rejected = replace(verdict, accepted=False, reason=Reason.REGRESSION, head_id=None).signed(VALIDATORS[0])
    assert "contradicts the canonical lineage" in _refused(replace(lineage, verdicts=(rejected,)))
    forged = replace(verdict, metrics={"examples": 10**9})  # the signature no longer covers it
    assert "verdict on" in _refused(replace(lineage, verdicts=(forged,)), SignatureError)


def test_a_vote_on_a_candidate_no_verdict_decides_or_by_an_outsider_is_refused(lineage: Lineage) -> None:
    stray = replace(lineage, verdicts=lineage.verdicts[1:])
    assert "which no verdict of the archive decides" in _refused(stray)
    outsider = PureSigner(b"\x44" * 32)
    forged = replace(lineage.votes[1], validator_key=outsider.public_key).signed(outsider)
    votes = (lineage.votes[0], forged, *lineage.votes[2:])
    assert "not signed by a validator of this network" in _refused(replace(lineage, votes=votes), SignatureError)


def test_a_candidate_with_a_forged_signature_is_refused(lineage: Lineage) -> None:
    forged = replace(lineage.candidates[0], examples=10**6)
    assert "candidate" in _refused(replace(lineage, candidates=(forged, *lineage.candidates[1:])), SignatureError)


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_hostile_archives_are_refused_before_they_are_read(lineage: Lineage) -> None:
    artifact = lineage.blobs[lineage.heads[0].head_id]
    digest = lineage.heads[0].head_id.removeprefix("sha256:")
    link = tarfile.TarInfo("index.json")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    cases: list[tuple[bytes, type[ProtocolError], str]] = [
        (b"not a tar at all" * 100, InvalidMessage, "not a lineage archive"),
        (_tar((tarfile.TarInfo("../escape"), b"x")), InvalidMessage, "neither index.json"),
        (_tar((link, b"")), InvalidMessage, "not a regular file"),
        (_tar((tarfile.TarInfo(f"blobs/{digest}"), artifact + b"!")), IntegrityError, "content id mismatch"),
        (_tar((tarfile.TarInfo(f"blobs/{'0' * 64}"), b"x" * 65)), TooLarge, "at most 64"),
        (_tar((tarfile.TarInfo("index.json"), b"{}"), (tarfile.TarInfo("index.json"), b"{}")), InvalidMessage, "twice"),
        (_tar((tarfile.TarInfo("index.json"), b"[1, 2")), InvalidMessage, "not JSON"),
        (_tar((tarfile.TarInfo("index.json"), json.dumps({"format": "pickle"}).encode())), InvalidMessage, "format"),
    ]
    for data, error, reason in cases:
        with pytest.raises(error, match=reason):
            read_archive(data, max_blob_bytes=64 if "at most" in reason else MAX_BLOB)


def _edge_files(root: Path) -> list[str]:
    (root / "network.json").write_text(json.dumps(NETWORK.to_wire()))
    return ["--data-dir", str(root / "edge"), "--network", str(root / "network.json")]


def _dtn(argv: list[str]) -> str:
    """Run ``dtn`` in-process; what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        dtn(argv)
    return out.getvalue()


def test_dtn_lineage_import_then_the_edge_serves_it_and_exports_the_same_archive(
    lineage: Lineage, tmp_path: Path, dataset_root: Path
) -> None:
    archive = tmp_path / "lineage.tar"
    archive.write_bytes(write_archive(lineage))
    assert "imported" in _dtn(["lineage", "import", str(archive), *_edge_files(tmp_path)])
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge, httpx.Client(base_url=edge.url) as http:
        served = [HeadDescriptor.from_wire(h) for h in http.get(f"/v1/experiments/{EXPERIMENT}/heads").json()]
        assert served == list(lineage.heads)  # certificates included
        current = HeadDescriptor.from_wire(http.get(f"/v1/experiments/{EXPERIMENT}/head").json())
        current.verify_trusted(KEYS, NETWORK.quorum)
        assert http.get(f"/v1/artifacts/{current.head_id}").content == lineage.blobs[current.head_id]
        verdicts = http.get(f"/v1/experiments/{EXPERIMENT}/verdicts").json()
        assert {v["candidate_id"] for v in verdicts} == {v.candidate_id for v in lineage.verdicts}
        credit = http.get(f"/v1/experiments/{EXPERIMENT}/credit/{peer_id_from_public_key(TRAINER.public_key)}")
        assert credit.json()["accepted"] == len(lineage.verdicts)
        # credited from the archive's votes: two of the three validators signed each acceptance
        assert credit.json()["examples"] == sum(c.examples for c in lineage.candidates)
        cid = lineage.verdicts[0].candidate_id
        assert http.get(f"/v1/experiments/{EXPERIMENT}/verdicts/{cid}/votes").json() == [
            v.to_wire() for v in lineage.votes if v.candidate_id == cid
        ]
    again = tmp_path / "again.tar"
    _dtn(["lineage", "export", "--experiment", EXPERIMENT, "--out", str(again), *_edge_files(tmp_path)])
    assert again.read_bytes() == archive.read_bytes()


def test_dtn_lineage_import_refuses_a_tampered_archive_and_writes_nothing(
    lineage: Lineage, tmp_path: Path, dataset_root: Path
) -> None:
    heads = list(lineage.heads)
    heads[2] = replace(heads[2], certificate=())
    archive = tmp_path / "short.tar"
    archive.write_bytes(write_archive(replace(lineage, heads=tuple(heads))))
    with pytest.raises(SystemExit) as refused:
        _dtn(["lineage", "import", str(archive), *_edge_files(tmp_path)])
    message = str(refused.value)
    assert message.startswith(f"lineage import refused {archive}") and "\n" not in message
    assert "this network needs 2" in message
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge, httpx.Client(base_url=edge.url) as http:
        assert http.get(f"/v1/experiments/{EXPERIMENT}/heads").json() == []  # nothing of it is served


def test_an_edge_with_another_lineage_refuses_an_import(lineage: Lineage, tmp_path: Path) -> None:
    archive = tmp_path / "lineage.tar"
    archive.write_bytes(write_archive(lineage))
    (tmp_path / "other.tar").write_bytes(write_archive(_lineage(2, seed=100)))  # another genesis
    _dtn(["lineage", "import", str(tmp_path / "other.tar"), *_edge_files(tmp_path)])
    with pytest.raises(SystemExit, match=r"another lineage .* differs at window 0"):
        _dtn(["lineage", "import", str(archive), *_edge_files(tmp_path)])
