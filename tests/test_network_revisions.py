"""Network revisions (issue #24 item 3): the rules. A revision of the terms takes effect only with a
quorum of the previous revision's validators, follows the terms it names, adds experiments without
changing one, and hands a validator change over at each experiment's current head."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from protocol.envelope import unpack_envelope
from protocol.errors import InvalidMessage, SignatureError
from protocol.ids import ExperimentKey, HeadId
from protocol.lineage import Lineage, verify_lineage
from protocol.manifests import Handover, NetworkManifest
from protocol.messages import Attestation, HeadDescriptor
from protocol.network_pins import NetworkSignature, served_by
from protocol.network_revisions import (
    NetworkRevision,
    SignedNetworkRevision,
    follow,
    handover_refusal,
    terms_digest,
)
from protocol.run_control import RunControl, RunState, SignedRunControl
from protocol.signing import PureSigner

from .support import experiment_spec, head_envelope

A, B, C, D, EDGE = (PureSigner(bytes([n]) * 32) for n in (41, 42, 43, 44, 45))
FIRST = ExperimentKey.parse("study/first/r1")
ADDED = experiment_spec(ExperimentKey.parse("study/added/r1"))
NETWORK = NetworkManifest(
    "revised-net", (A.public_key, B.public_key, C.public_key), (experiment_spec(FIRST),), EDGE.public_key, quorum=2
)


def _attested(head: HeadDescriptor, signer: PureSigner) -> HeadDescriptor:
    return replace(head, certificate=(Attestation.of(head, [], signer, 1_000),))


def _round_trip(signed: SignedNetworkRevision) -> SignedNetworkRevision:
    return SignedNetworkRevision.from_wire(json.loads(json.dumps(signed.to_wire())))


def test_a_network_never_revised_keeps_its_wire_form_and_its_signatures() -> None:
    wire = NETWORK.to_wire()
    assert "revision" not in wire and "handover" not in wire
    assert NetworkManifest.from_wire(wire) == NETWORK
    assert NetworkSignature.of(NETWORK, A).verifies(NetworkManifest.from_wire(json.loads(json.dumps(wire))))


def test_a_quorum_of_the_validators_adds_an_experiment_and_fewer_or_the_edge_cannot() -> None:
    revision = NetworkRevision.of(NETWORK, 1_000, experiments=[ADDED])
    revised = _round_trip(SignedNetworkRevision.of(revision, [A, C])).apply(NETWORK)
    assert revised.revision == 1 and revised.experiment(ADDED.key) == ADDED
    assert revised.experiments[0] == NETWORK.experiments[0] and revised.validator_keys == NETWORK.validator_keys
    assert NetworkManifest.from_wire(json.loads(json.dumps(revised.to_wire()))) == revised
    for signers in ([A], [A, EDGE], [A, A]):
        with pytest.raises(SignatureError, match="network revision 1 is signed by 1 validator"):
            SignedNetworkRevision.of(revision, signers).apply(NETWORK)
    # the same signatures over other terms verify nothing
    altered = replace(revision, quorum=1)
    with pytest.raises(SignatureError, match="signed by 0 validator"):
        SignedNetworkRevision(altered, SignedNetworkRevision.of(revision, [A, B]).signatures).apply(NETWORK)


def test_a_revision_follows_the_terms_it_names_and_changes_no_experiment() -> None:
    revision = NetworkRevision.of(NETWORK, 1_000, experiments=[ADDED])
    revised = SignedNetworkRevision.of(revision, [A, B]).apply(NETWORK)
    refusals = {
        "does not follow revision 1": revised,  # applied twice
        "revises other terms": replace(NETWORK, quorum=3),  # signed for other terms
        "is of network 'revised-net', not 'other-net'": replace(NETWORK, network_id="other-net"),
    }
    for reason, network in refusals.items():
        with pytest.raises((InvalidMessage, SignatureError), match=reason):
            revision.apply(network)
    changed = replace(experiment_spec(FIRST), learning_rate=0.5)
    with pytest.raises(InvalidMessage, match="on the network already; an experiment is never changed"):
        NetworkRevision.of(NETWORK, 1_000, experiments=[changed]).apply(NETWORK)
    with pytest.raises(InvalidMessage, match="changes nothing"):
        NetworkRevision.of(NETWORK, 1_000).apply(NETWORK)
    with pytest.raises(InvalidMessage, match="a handover belongs to a revision that changes the validators"):
        replace(revision, handover=(Handover(FIRST, HeadId("sha256:" + "a" * 64), 0),)).apply(NETWORK)


def test_a_validator_change_hands_over_at_the_current_heads_which_the_old_quorum_vouched_for() -> None:
    head, _ = head_envelope(experiment=FIRST, signer=A)  # certified by one of the old validators only
    keys = (A.public_key, B.public_key, D.public_key)  # C replaced by D
    revision = NetworkRevision.of(NETWORK, 2_000, validator_keys=keys, heads={FIRST: head})
    assert revision.handover == (Handover(FIRST, head.head_id, 0, 0),)
    # the edge applies it where the handover head is canonical and no head of the old validators follows it
    later, _ = head_envelope(experiment=FIRST, signer=A, parent=head.head_id, window=1)
    assert handover_refusal(NETWORK, revision, {FIRST: [head]}, {}) is None
    missing = handover_refusal(NETWORK, revision, {FIRST: [later]}, {})
    assert missing is not None and "has no head" in missing
    moved = handover_refusal(NETWORK, revision, {FIRST: [head, later]}, {})
    assert moved is not None and "moved past the revision's handover" in moved
    by_b, _ = head_envelope(experiment=FIRST, signer=B, parent=head.head_id, window=1)  # and D attests: the new quorum
    assert handover_refusal(NETWORK, revision, {FIRST: [head, _attested(by_b, D)]}, {}) is None
    unnamed = handover_refusal(NETWORK, replace(revision, handover=()), {FIRST: [head]}, {})
    assert unnamed is not None and "over at no head" in unnamed
    assert handover_refusal(NETWORK, NetworkRevision.of(NETWORK, 1, experiments=[ADDED]), {FIRST: [head]}, {}) is None
    # the replaced validator cannot sign it into effect with one other; the old quorum can
    with pytest.raises(SignatureError, match="signed by 1 validator"):
        SignedNetworkRevision.of(revision, [C, D]).apply(NETWORK)
    revised = SignedNetworkRevision.of(revision, [B, C]).apply(NETWORK)
    assert revised.validator_key_set == frozenset(keys) and revised.handover == revision.handover
    revised.verify_head(head)  # handed over: trusted without the new quorum
    with pytest.raises(SignatureError):
        NETWORK.verify_head(head)  # one signature is not the old network's quorum
    with pytest.raises(SignatureError):
        revised.verify_head(head_envelope(experiment=FIRST, signer=D, window=1)[0])  # any other head needs the quorum
    # the next revision is signed by the new validators, not the replaced one
    again = NetworkRevision.of(revised, 3_000, experiments=[ADDED])
    with pytest.raises(SignatureError, match="signed by 1 validator"):
        SignedNetworkRevision.of(again, [C, D]).apply(revised)
    assert SignedNetworkRevision.of(again, [A, D]).apply(revised).handover == revised.handover


def test_a_peer_follows_a_chain_from_the_terms_it_trusts() -> None:
    first = SignedNetworkRevision.of(NetworkRevision.of(NETWORK, 1_000, experiments=[ADDED]), [A, B])
    one = first.apply(NETWORK)
    keys = (A.public_key, B.public_key, D.public_key)
    second = SignedNetworkRevision.of(NetworkRevision.of(one, 2_000, validator_keys=keys, quorum=3), [B, C])
    two = second.apply(one)
    assert follow(NETWORK, [second, first]) == two  # in order, whatever order they were served in
    assert follow(one, [first, second]) == two  # revisions held already are passed over
    with pytest.raises(InvalidMessage, match="network revision 2: revision 2 does not follow revision 0"):
        follow(NETWORK, [second])  # a gap
    # a peer takes a served manifest of a later revision only through the chain its validators signed
    served = replace(two, edge_key=PureSigner(bytes([9]) * 32).public_key)
    assert served_by(NETWORK, served, [first, second]) == replace(two, edge_key=served.edge_key)
    with pytest.raises(SignatureError, match="other terms"):
        served_by(NETWORK, served, [first])
    forged = SignedNetworkRevision(second.revision, (second.signatures[0],))
    with pytest.raises(SignatureError, match="network revision 2: network revision 2 is signed by 1 validator"):
        served_by(NETWORK, served, [first, forged])
    assert terms_digest(two) != terms_digest(one) != terms_digest(NETWORK)


def _lineage(signers: list[tuple[PureSigner, PureSigner]]) -> Lineage:
    """Heads of ``FIRST`` from genesis, each proposed by the first of its pair and attested by the second."""
    heads: list[HeadDescriptor] = []
    blobs = {}
    for window, (proposer, attester) in enumerate(signers):
        head, envelope = head_envelope(
            experiment=FIRST, signer=proposer, parent=heads[-1].head_id if heads else None, window=window
        )
        heads.append(_attested(head, attester))
        blobs[head.head_id] = unpack_envelope(envelope)[1]
    return Lineage(NETWORK.network_id, FIRST, tuple(heads), blobs=blobs)


def test_a_lineage_across_a_change_of_validators_is_checked_against_each_eras_validators() -> None:
    lineage = _lineage([(C, B), (C, B), (A, D)])  # C replaced by D after window 1
    keys = (A.public_key, B.public_key, D.public_key)
    change = NetworkRevision.of(NETWORK, 1, validator_keys=keys, heads={FIRST: lineage.heads[1]})
    revised = SignedNetworkRevision.of(change, [A, C]).apply(NETWORK)
    verify_lineage(lineage, [NETWORK, revised])
    with pytest.raises(SignatureError, match=r"\(window 2\): head is certified by 1 validator"):
        verify_lineage(lineage, NETWORK)  # D is no validator of the first terms
    with pytest.raises(SignatureError, match=r"\(window 0\): head is not signed by a validator"):
        verify_lineage(lineage, revised)  # C is no validator of the revised terms
    # the replaced validator and one other cannot go on past the handover
    with pytest.raises(SignatureError, match=r"\(window 2\)"):
        verify_lineage(_lineage([(C, B), (C, B), (C, B)]), [NETWORK, revised])
    # an experiment added after the change, or without a head at it, starts under the new validators
    early = NetworkRevision.of(NETWORK, 1, validator_keys=keys)
    assert early.handover == ()
    verify_lineage(_lineage([(A, D), (A, D)]), [NETWORK, SignedNetworkRevision.of(early, [A, B]).apply(NETWORK)])


def test_run_control_orders_are_checked_against_the_validators_that_applied_them() -> None:
    keys = (A.public_key, B.public_key, D.public_key)
    pause = RunControl(NETWORK.network_id, FIRST, "pause", sequence=1, issued_at_ms=1)
    change = NetworkRevision.of(NETWORK, 2, validator_keys=keys, orders={FIRST: 1})
    assert change.handover == (Handover(FIRST, None, -1, 1),)
    revised = SignedNetworkRevision.of(change, [B, C]).apply(NETWORK)
    resume = RunControl(NETWORK.network_id, FIRST, "resume", sequence=2, issued_at_ms=3)
    orders = [SignedRunControl.of(pause, [B, C]), SignedRunControl.of(resume, [A, D])]
    assert RunState.of(orders, [NETWORK, revised], FIRST) == RunState(sequence=2)
    with pytest.raises(SignatureError, match="signed by 1 validator"):
        RunState.of(orders, revised, FIRST)  # C signed the pause under the first terms, not these
    with pytest.raises(SignatureError, match="signed by 1 validator"):  # the old quorum after the handover
        RunState.of([orders[0], SignedRunControl.of(resume, [B, C])], [NETWORK, revised], FIRST)
    # an edge that applied an order past the handover's does not take the revision
    late = handover_refusal(NETWORK, change, {}, {FIRST: 2})
    assert late is not None and "took run-control order 2 after the revision's handover" in late
    assert handover_refusal(NETWORK, change, {}, {FIRST: 1}) is None
