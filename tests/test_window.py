"""``protocol.window``, the one window routine every trainer runs: each rule refuses what it must."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from protocol.batches import window_seed
from protocol.codec import decode_tensors
from protocol.envelope import unpack_envelope
from protocol.errors import InvalidMessage, SignatureError
from protocol.hashing import content_id
from protocol.ids import ContentId, ExperimentKey, HeadId
from protocol.manifests import NetworkManifest
from protocol.messages import Candidate, HeadDescriptor, Lease
from protocol.model import init_params
from protocol.signing import PureSigner, peer_id_from_public_key
from protocol.window import (
    NoWindow,
    carried_onto,
    check_lease,
    epoch_seed,
    head_to_train,
    lease_covers,
    package_candidate,
)

from .support import SPEC, VALIDATOR, head_envelope, signed_lease

EDGE = PureSigner(b"\x21" * 32)
TRAINER = PureSigner(b"\x22" * 32)
STRANGER = PureSigner(b"\x23" * 32)
TRAINER_ID = peer_id_from_public_key(TRAINER.public_key)
NETWORK = NetworkManifest("window-net", (VALIDATOR.public_key,), ())
OTHER_EXPERIMENT = ExperimentKey.parse("study/other/rev-1")
OTHER_HEAD = HeadId("sha256:" + "b" * 64)


@pytest.fixture(scope="module")
def head() -> HeadDescriptor:
    return head_envelope()[0]


@pytest.fixture(scope="module")
def lease(head: HeadDescriptor) -> Lease:
    return signed_lease(TRAINER, head.head_id, EDGE)


def _package(lease: Lease, head: HeadDescriptor) -> tuple[Candidate, bytes]:
    return package_candidate(
        lease,
        head,
        init_params(SPEC, 3),
        TRAINER,
        peer_kind="native",
        model=SPEC.name,
        codec="fp32",
        examples=640,
        steps=10,
        created_at_ms=1_700_000_000_000,
        metrics={"train_loss": 0.5},
    )


# -- head_to_train ------------------------------------------------------------------------------
def test_a_new_trusted_head_is_trained(head: HeadDescriptor) -> None:
    assert head_to_train(head, NETWORK, None) is head
    assert head_to_train(head, NETWORK, OTHER_HEAD) is head


def test_no_head_yet_is_no_window() -> None:
    with pytest.raises(NoWindow, match="no head yet"):
        head_to_train(None, NETWORK, None)


def test_a_head_signed_by_an_unknown_key_is_refused() -> None:
    untrusted, _ = head_envelope(signer=STRANGER)
    with pytest.raises(SignatureError):
        head_to_train(untrusted, NETWORK, None)


def test_a_head_naming_a_validator_but_signed_by_another_key_is_refused(head: HeadDescriptor) -> None:
    forged = dataclasses.replace(head, window=head.window + 1).signed(STRANGER)
    forged = dataclasses.replace(forged, validator_key=VALIDATOR.public_key)
    with pytest.raises(SignatureError):
        head_to_train(forged, NETWORK, None)


def test_the_head_already_trained_on_is_no_window(head: HeadDescriptor) -> None:
    with pytest.raises(NoWindow, match="already trained"):
        head_to_train(head, NETWORK, head.head_id)


# -- check_lease --------------------------------------------------------------------------------
def test_a_lease_for_this_window_passes(head: HeadDescriptor, lease: Lease) -> None:
    check_lease(lease, head, peer_id=TRAINER_ID, edge_key=EDGE.public_key)
    check_lease(dataclasses.replace(lease, signature=b""), head, peer_id=TRAINER_ID, edge_key=None)


def test_a_lease_not_signed_by_the_edge_is_refused(head: HeadDescriptor) -> None:
    forged = signed_lease(TRAINER, head.head_id, STRANGER)
    with pytest.raises(SignatureError):
        check_lease(forged, head, peer_id=TRAINER_ID, edge_key=EDGE.public_key)


def test_a_lease_for_another_head_is_no_window(head: HeadDescriptor) -> None:
    moved_on = signed_lease(TRAINER, OTHER_HEAD, EDGE)
    with pytest.raises(NoWindow, match="moved on"):
        check_lease(moved_on, head, peer_id=TRAINER_ID, edge_key=EDGE.public_key)


def test_a_lease_for_another_peer_is_refused(head: HeadDescriptor) -> None:
    theirs = signed_lease(STRANGER, head.head_id, EDGE)
    with pytest.raises(InvalidMessage, match="for peer"):
        check_lease(theirs, head, peer_id=TRAINER_ID, edge_key=EDGE.public_key)


def test_a_lease_for_another_experiment_is_refused(head: HeadDescriptor) -> None:
    elsewhere = signed_lease(TRAINER, head.head_id, EDGE, experiment=OTHER_EXPERIMENT)
    with pytest.raises(InvalidMessage, match="not study/mnist/rev-1"):
        check_lease(elsewhere, head, peer_id=TRAINER_ID, edge_key=EDGE.public_key)


def _child(head: HeadDescriptor) -> HeadDescriptor:
    """The head that follows ``head`` (its window is the next)."""
    return dataclasses.replace(head, head_id=OTHER_HEAD, parent=head.head_id, window=head.window + 1)


def test_a_lease_for_the_next_window_is_checked_as_such(head: HeadDescriptor) -> None:
    ahead = signed_lease(TRAINER, head.head_id, EDGE, window=head.window + 1)
    check_lease(ahead, head, peer_id=TRAINER_ID, edge_key=EDGE.public_key, ahead=True)
    check_lease(ahead, _child(head), peer_id=TRAINER_ID, edge_key=EDGE.public_key)  # once the next head exists
    with pytest.raises(NoWindow):
        check_lease(ahead, head, peer_id=TRAINER_ID, edge_key=EDGE.public_key)  # not a lease of this window
    same = signed_lease(TRAINER, head.head_id, EDGE, window=head.window)
    with pytest.raises(NoWindow):
        check_lease(same, head, peer_id=TRAINER_ID, edge_key=EDGE.public_key, ahead=True)


# -- lease_covers -------------------------------------------------------------------------------
def test_lease_covers_a_candidate_made_for_it(lease: Lease, head: HeadDescriptor) -> None:
    candidate, _ = _package(lease, head)
    assert lease_covers(lease, candidate, head)


def test_a_lease_granted_ahead_covers_its_window_on_the_head_that_followed(head: HeadDescriptor) -> None:
    ahead = signed_lease(TRAINER, head.head_id, EDGE, window=head.window + 1)
    child = _child(head)
    candidate, _ = _package(ahead, child)
    assert candidate.base_head == child.head_id
    assert lease_covers(ahead, candidate, child)
    assert not lease_covers(ahead, candidate, head)  # the candidate names the child, not this head
    with pytest.raises(InvalidMessage):
        _package(ahead, head)  # the lease of the next window trains no candidate on this head


@pytest.mark.parametrize(
    "change",
    [
        {"peer_id": peer_id_from_public_key(STRANGER.public_key)},
        {"experiment": OTHER_EXPERIMENT},
        {"base_head": OTHER_HEAD},
        {"window": 7},
    ],
    ids=["another-peer", "another-experiment", "another-head", "another-window"],
)
def test_lease_covers_nothing_it_was_not_issued_for(
    lease: Lease, head: HeadDescriptor, change: dict[str, object]
) -> None:
    candidate, _ = _package(lease, head)
    assert not lease_covers(dataclasses.replace(lease, **change), candidate, head)


def test_no_lease_covers_nothing(lease: Lease, head: HeadDescriptor) -> None:
    candidate, _ = _package(lease, head)
    assert not lease_covers(None, candidate, head)
    assert not lease_covers(lease, candidate, None)  # a candidate on a head nobody knows


# -- package_candidate and epoch_seed -----------------------------------------------------------
def test_package_candidate_signs_the_artifact_it_ships(lease: Lease, head: HeadDescriptor) -> None:
    candidate, envelope = _package(lease, head)
    descriptor, artifact = unpack_envelope(envelope)
    assert candidate.candidate_id == content_id(artifact)
    candidate.verify_own()
    assert Candidate.from_wire(descriptor) == candidate
    assert (candidate.peer_id, candidate.base_head, candidate.lease_id) == (TRAINER_ID, lease.base_head, lease.lease_id)
    assert (candidate.examples, candidate.steps, candidate.metrics) == (640, 10, {"train_loss": 0.5})
    tensors, metadata = decode_tensors(artifact)
    assert metadata == {"model": SPEC.name, "codec": "fp32", "base_head": lease.base_head}
    expected = init_params(SPEC, 3)
    assert tensors.keys() == expected.keys()
    assert all(np.array_equal(tensors[name], expected[name]) for name in expected)


def test_epoch_seed_is_the_shared_batch_seed(lease: Lease) -> None:
    assert [epoch_seed(lease, e) for e in range(2)] == [window_seed(lease.lease_id, e) for e in range(2)]
    assert epoch_seed(lease, 0) != epoch_seed(lease, 1)


MINE, THEIRS = ContentId("sha256:" + "1" * 64), ContentId("sha256:" + "2" * 64)


@pytest.mark.parametrize(
    ("merged", "published", "start"),
    [
        ((MINE,), MINE, [3.5]),  # merged alone: the trainer's own point
        ((MINE, THEIRS), MINE, [2.5]),  # with others: their work kept, the progress on top
        ((THEIRS,), None, [2.5]),  # never published (trained on from the head it was leased on)
        ((MINE,), None, [2.5]),
    ],
)
def test_work_trained_ahead_goes_on_from_its_own_point_only_where_the_head_merged_its_candidate_alone(
    merged: tuple[ContentId, ...], published: ContentId | None, start: list[float]
) -> None:
    """Decision 0045: the head (2.0) took a share of the candidate's step (origin 3.0), and the work
    trained from the candidate went on to 3.5."""
    head = dataclasses.replace(head_envelope()[0], merged=merged)
    base, origin, trained = {"w": np.array([2.0])}, {"w": np.array([3.0])}, {"w": np.array([3.5])}
    went_on = carried_onto(head, base, trained, origin, published)
    assert went_on["w"].dtype == np.float32 and went_on["w"].tolist() == start
