"""The shared core: ids, codec (both directions with the public safetensors), signing, leases."""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from native_peer.identity import NodeIdentity
from protocol import ed25519
from protocol.codec import decode_tensors, encode_tensors
from protocol.envelope import pack_envelope, unpack_envelope
from protocol.errors import CodecError, IntegrityError, InvalidMessage, SignatureError, TooLarge
from protocol.hashing import content_id, verify_content
from protocol.ids import (
    ContentId,
    ExperimentId,
    ExperimentKey,
    HeadId,
    LeaseId,
    PeerId,
    RevisionId,
    ShardId,
    StudyId,
)
from protocol.leases import Homes, assign_leases, assign_shards
from protocol.messages import MAX_WINDOW_CANDIDATES, Candidate, HeadDescriptor
from protocol.signing import PureSigner, peer_id_from_public_key
from server.signatures import native_verify

PROTOCOL_DIR = Path(__file__).resolve().parent.parent / "protocol"


def test_protocol_imports_only_stdlib_and_numpy() -> None:
    allowed = set(sys.stdlib_module_names) | {"numpy", "protocol"}
    for path in PROTOCOL_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            assert set(roots) <= allowed, f"{path.name} imports {roots}"


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", "x" * 65, "sp ace", ".hidden", 7, None])
def test_ids_reject_unsafe_values(bad: object) -> None:
    with pytest.raises(InvalidMessage):
        StudyId(bad)


def test_experiment_key_round_trip() -> None:
    key = ExperimentKey(StudyId("study"), ExperimentId("mnist"), RevisionId("rev-1"))
    assert key == "study/mnist/rev-1"
    assert ExperimentKey.parse(str(key)).parts == ("study", "mnist", "rev-1")
    with pytest.raises(InvalidMessage):
        ExperimentKey.parse("study/mnist")


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "dense0.kernel": rng.standard_normal((5, 3)).astype(np.float32),
        "dense0.bias": np.arange(3, dtype=np.float32),
        "labels": np.array([1, 2, 255], np.uint8),
        "steps": np.array([7], np.int64),
        "wide": rng.standard_normal(4),
    }


def test_codec_output_loads_with_public_safetensors() -> None:
    tensors = _tensors()
    data = encode_tensors(tensors, {"model": "mnist-mlp"})
    loaded = safetensors.numpy.load(data)
    assert set(loaded) == set(tensors)
    for name, array in tensors.items():
        assert loaded[name].dtype == array.dtype
        np.testing.assert_array_equal(loaded[name], array)


def test_codec_reads_public_safetensors_output() -> None:
    tensors = _tensors()
    decoded, metadata = decode_tensors(safetensors.numpy.save(tensors, metadata={"k": "v"}))
    assert metadata == {"k": "v"}
    for name, array in tensors.items():
        np.testing.assert_array_equal(decoded[name], array)
        assert decoded[name].dtype == array.dtype


def test_codec_is_deterministic() -> None:
    tensors = _tensors()
    assert encode_tensors(tensors) == encode_tensors(dict(reversed(list(tensors.items()))))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b[:7],
        lambda b: (10**9).to_bytes(8, "little") + b[8:],
        lambda b: b[:8] + b"[" + b[9:],
        lambda b: b + b"\x00",
        lambda b: b[:-1],
    ],
)
def test_codec_rejects_malformed_bytes(mutate) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises((CodecError, TooLarge)):
        decode_tensors(mutate(encode_tensors(_tensors())))


def test_content_id_and_verification() -> None:
    cid = content_id(b"abc")
    assert cid == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert verify_content(b"abc", cid) == cid
    with pytest.raises(IntegrityError):
        verify_content(b"abd", cid)


def test_pure_ed25519_matches_cryptography() -> None:
    for size in (0, 1, 64, 1000):
        seed, message = os.urandom(32), os.urandom(size)
        key = Ed25519PrivateKey.from_private_bytes(seed)
        public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        assert ed25519.public_key_from_seed(seed) == public
        assert ed25519.sign(seed, message) == key.sign(message)
        assert ed25519.verify(public, message, key.sign(message))
        assert not ed25519.verify(public, message + b"!", key.sign(message))
        forged = bytearray(key.sign(message))
        forged[10] ^= 1
        assert not ed25519.verify(public, message, bytes(forged))


def test_the_edges_native_verifier_gives_the_pure_answers() -> None:
    """The edge and native peers verify with ``cryptography``, the browser with ``protocol.ed25519``: same verdicts on
    valid, tampered, non-canonical, small-order and malformed input."""
    seed, message = os.urandom(32), b"lease body"
    key = Ed25519PrivateKey.from_private_bytes(seed)
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    good = key.sign(message)
    order = 2**252 + 27742317777372353535851937790883648493
    s_plus_order = (int.from_bytes(good[32:], "little") + order).to_bytes(32, "little")
    identity = b"\x01" + b"\x00" * 31  # the neutral point: a small-order key
    cases = [
        (public, message, good),
        (public, message + b"!", good),
        *[(public, message, good[:i] + bytes([good[i] ^ 1]) + good[i + 1 :]) for i in range(0, 64, 7)],
        (public, message, good[:32] + s_plus_order),  # s >= L: not canonical
        (identity, message, identity + b"\x00" * 32),
        (os.urandom(32), message, good),
        (public[:31], message, good),
        (public, message, good[:63]),
    ]
    assert [native_verify(*case) for case in cases] == [ed25519.verify(*case) for case in cases]
    assert native_verify(*cases[0]) and not native_verify(*cases[1])
    # native peers install their own (NodeIdentity.verify): the same verdicts
    assert [NodeIdentity.verify(*case) for case in cases] == [ed25519.verify(*case) for case in cases]


def _candidate(signer: PureSigner) -> Candidate:
    return Candidate(
        experiment=ExperimentKey(StudyId("s"), ExperimentId("e"), RevisionId("r")),
        candidate_id=ContentId(content_id(b"update")),
        base_head=HeadId(content_id(b"base")),
        lease_id=LeaseId("lease-1"),
        public_key=signer.public_key,
        peer_kind="native",
        examples=2000,
        steps=32,
        created_at_ms=1,
        metrics={"train_loss": 0.5},
    ).signed(signer)


def test_signed_candidate_round_trip_and_forgery() -> None:
    signer = PureSigner(b"\x01" * 32)
    candidate = _candidate(signer)
    parsed = Candidate.from_wire(candidate.to_wire())
    assert parsed == candidate
    parsed.verify_own()
    forged = Candidate.from_wire({**candidate.to_wire(), "examples": 10**6})
    with pytest.raises(SignatureError):
        forged.verify_own()
    with pytest.raises(InvalidMessage):
        Candidate.from_wire({**candidate.to_wire(), "peer_id": peer_id_from_public_key(b"\x02" * 32)})


def test_head_signed_by_non_validator_is_rejected() -> None:
    validator, outsider = PureSigner(b"\x03" * 32), PureSigner(b"\x04" * 32)
    head = HeadDescriptor(
        experiment=ExperimentKey.parse("s/e/r"),
        head_id=HeadId(content_id(b"h")),
        parent=None,
        window=0,
        global_step=0,
        merged=(),
        validator_key=outsider.public_key,
        created_at_ms=1,
    ).signed(outsider)
    with pytest.raises(SignatureError):
        head.verify_trusted(frozenset({validator.public_key}))
    HeadDescriptor.from_wire(head.to_wire()).verify_trusted(frozenset({outsider.public_key}))


def test_envelope_round_trip_and_limits() -> None:
    body = pack_envelope({"a": 1}, b"\x00\x01payload")
    assert unpack_envelope(body) == ({"a": 1}, b"\x00\x01payload")
    with pytest.raises(InvalidMessage):
        unpack_envelope(b"XXXX" + body[4:])
    with pytest.raises(TooLarge):
        unpack_envelope(b"DTN1" + (10**6).to_bytes(4, "big"))


def test_a_head_that_merges_a_full_window_fits_its_envelope() -> None:
    """A head names every candidate it merged: MAX_WINDOW_CANDIDATES of them fit a descriptor (a
    validator judged 1,000 simulated candidates and could not publish the head at 64 KiB), one more
    is refused."""
    signer = PureSigner(b"\x03" * 32)
    merged = tuple(ContentId(content_id(i.to_bytes(4, "big"))) for i in range(MAX_WINDOW_CANDIDATES))
    head = HeadDescriptor(
        ExperimentKey.parse("s/e/r"), HeadId(content_id(b"h")), None, 0, 0, merged, signer.public_key, 1
    ).signed(signer)
    descriptor, _ = unpack_envelope(pack_envelope(head.to_wire(), b"artifact"))
    assert HeadDescriptor.from_wire(descriptor).merged == merged
    wire = head.to_wire() | {"merged": [*head.to_wire()["merged"], content_id(b"one more")]}
    with pytest.raises(InvalidMessage):
        HeadDescriptor.from_wire(wire)


SHARDS = tuple(ShardId(f"train-{i:05d}") for i in range(50))
PEERS = tuple(peer_id_from_public_key(bytes([i]) * 32) for i in range(8))


def test_lease_assignment_is_distinct_per_peer_and_stable() -> None:
    first = assign_leases("sha256:" + "a" * 64, PEERS, SHARDS, 3)
    second = assign_leases("sha256:" + "a" * 64, reversed(PEERS), SHARDS, 3)
    assert first == second
    all_shards = [s for shards in first.values() for s in shards]
    assert len(all_shards) == len(set(all_shards)) == 24
    other_window = assign_leases("sha256:" + "b" * 64, PEERS, SHARDS, 3)
    assert other_window != first


def test_incremental_assignment_matches_taken_set() -> None:
    seed = "sha256:" + "c" * 64
    taken: set[str] = set()
    for peer in PEERS:
        shards = assign_shards(seed, PeerId(peer), SHARDS, taken, 4)
        assert not taken & set(shards)
        taken |= set(shards)
    assert assign_shards(seed, PEERS[0], SHARDS[:2], {SHARDS[0]}, 2) == SHARDS[1:2]  # only what is free
    assert assign_shards(seed, PEERS[0], SHARDS[:2], set(SHARDS[:2]), 2) == ()  # a full window: nothing


@pytest.mark.parametrize("peers", [1, 2, 3, 8])
def test_homes_partition_the_shards_among_the_peers(peers: int) -> None:
    homes = Homes.among("seed", PEERS[:peers], SHARDS)
    each = [homes.of(peer) for peer in PEERS[:peers]]
    assert sum(len(home) for home in each) == len(set().union(*each)) == len(SHARDS)  # disjoint, covering
    assert min(len(home) for home in each) >= len(SHARDS) // (3 * peers)  # about an equal share each


def test_a_peer_joining_takes_only_its_own_share_and_one_alone_has_every_shard() -> None:
    before = Homes.among("seed", PEERS[:4], SHARDS)
    after = Homes.among("seed", PEERS[:5], SHARDS)
    for peer in PEERS[:4]:
        assert after.of(peer) <= before.of(peer)  # nobody else's shards move between the others
    assert before.of(PEERS[4]) == after.of(PEERS[4])  # a newcomer asks as one of them
    assert Homes.among("seed", (), SHARDS).of(PEERS[0]) == set(SHARDS)
    assert Homes.among("seed", PEERS[:1], SHARDS).of(PEERS[0]) == set(SHARDS)
    assert Homes.among("another seed", PEERS[:4], SHARDS).of(PEERS[0]) != before.of(PEERS[0])


HOME = frozenset(SHARDS[:6])


@pytest.mark.parametrize(
    ("taken", "count", "from_home", "others"),
    [
        (set(), 4, 4, 0),  # a home with room: only home shards
        (set(SHARDS[:3]), 4, 3, 1),  # half of it taken: what is left of it, then the others
        (set(HOME), 4, 0, 4),  # all of it taken: other shards, as without a home
        (set(SHARDS[:6]) | set(SHARDS[10:]), 8, 0, 4),  # fewer free than asked: what is free
        (set(SHARDS), 4, 0, 0),  # a full window: nothing
    ],
)
def test_a_lease_takes_its_home_shards_first(taken: set[str], count: int, from_home: int, others: int) -> None:
    chosen = assign_shards("sha256:" + "d" * 64, PEERS[0], SHARDS, taken, count, HOME)
    assert not taken & set(chosen)
    assert (len(HOME & set(chosen)), len(set(chosen) - HOME)) == (from_home, others)


def test_over_windows_a_peer_trains_on_all_of_its_home() -> None:
    drawn = [assign_shards(f"sha256:{w:064x}", PEERS[0], SHARDS, (), 2, HOME) for w in range(20)]
    assert set().union(*drawn) == HOME and len(set(drawn)) > 1
