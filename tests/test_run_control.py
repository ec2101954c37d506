"""Run control signed by the validators (issue #24 item 3): the message rules. An order takes effect
only with a quorum of the network's validators; an edge cannot originate one, a replay is refused, and
an order for another network does not act on this one."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from protocol.errors import InvalidMessage, SignatureError
from protocol.ids import ExperimentKey
from protocol.manifests import NetworkManifest
from protocol.run_control import RunControl, RunState, SignedRunControl
from protocol.signing import PureSigner, peer_id_from_public_key
from protocol.trust import TrustBook

from .support import experiment_spec

A, B, C, EDGE = (PureSigner(bytes([n]) * 32) for n in (31, 32, 33, 34))
NETWORK = NetworkManifest(
    "control-net", (A.public_key, B.public_key, C.public_key), (experiment_spec(),), edge_key=EDGE.public_key, quorum=2
)
EXPERIMENT = ExperimentKey.parse(NETWORK.experiments[0].key)
PAUSE = RunControl(NETWORK.network_id, EXPERIMENT, "pause", sequence=1, issued_at_ms=1_000)


def _wire_round_trip(signed: SignedRunControl) -> SignedRunControl:
    return SignedRunControl.from_wire(json.loads(json.dumps(signed.to_wire())))


def test_a_quorum_of_validators_makes_an_order_effective_and_fewer_or_an_edge_cannot() -> None:
    signed = _wire_round_trip(SignedRunControl.of(PAUSE, [A, C]))
    assert signed.effective_signers(NETWORK) == {A.public_key, C.public_key}
    with pytest.raises(SignatureError, match="signed by 1 validator"):
        SignedRunControl.of(PAUSE, [A]).effective_signers(NETWORK)
    # the edge's key, and one validator's signature counted twice, do not make a quorum
    with pytest.raises(SignatureError, match="signed by 1 validator"):
        SignedRunControl.of(PAUSE, [A, EDGE]).effective_signers(NETWORK)
    with pytest.raises(SignatureError, match="signed by 1 validator"):
        SignedRunControl.of(PAUSE, [A, A]).effective_signers(NETWORK)


def test_a_forged_or_altered_order_is_refused() -> None:
    signed = SignedRunControl.of(PAUSE, [A, B])
    # the same signatures over another action, sequence or experiment do not verify
    for altered in (replace(PAUSE, action="stop"), replace(PAUSE, sequence=2), replace(PAUSE, issued_at_ms=2_000)):
        with pytest.raises(SignatureError, match="signed by 0 validator"):
            SignedRunControl(altered, signed.signatures).effective_signers(NETWORK)
    # a signature claimed for validator B but made by the edge
    forged = replace(signed.signatures[1], signature=SignedRunControl(PAUSE, ()).signature_of(EDGE).signature)
    with pytest.raises(SignatureError, match="signed by 1 validator"):
        SignedRunControl(PAUSE, (signed.signatures[0], forged)).effective_signers(NETWORK)


def test_an_order_for_another_network_does_not_act_on_this_one() -> None:
    other = replace(NETWORK, network_id="other-net")
    signed = SignedRunControl.of(replace(PAUSE, network_id="other-net"), [A, B, C])
    assert signed.effective_signers(other) == {A.public_key, B.public_key, C.public_key}
    with pytest.raises(SignatureError, match="for network 'other-net'"):
        signed.effective_signers(NETWORK)
    # relabelling it for this network breaks every signature
    with pytest.raises(SignatureError, match="signed by 0 validator"):
        SignedRunControl(replace(signed.order, network_id=NETWORK.network_id), signed.signatures).effective_signers(
            NETWORK
        )


def test_orders_apply_in_sequence_a_replay_is_refused_and_stop_is_final() -> None:
    state = RunState().after(PAUSE)
    assert state.paused and state.sequence == 1
    assert "already used" in (state.refusal(PAUSE) or "")  # the same signed pause, replayed
    with pytest.raises(InvalidMessage, match="already used"):
        state.after(PAUSE)
    state = state.after(replace(PAUSE, action="resume", sequence=2))
    assert not state.paused
    pardon = replace(PAUSE, action="pardon", sequence=3, target=peer_id_from_public_key(EDGE.public_key))
    state = state.after(pardon)
    assert (state.sequence, state.paused, state.stopped) == (3, False, False)
    rollback = replace(PAUSE, action="rollback", sequence=4, target="sha256:" + "1" * 64)
    assert "roll back a paused experiment" in (state.refusal(rollback) or "")  # running: validators differ on the head
    state = state.after(replace(PAUSE, sequence=4)).after(replace(rollback, sequence=5))
    assert state.paused and state.sequence == 5
    state = state.after(replace(PAUSE, action="stop", sequence=6))
    assert state.stopped
    assert "stopped" in (state.refusal(replace(PAUSE, action="resume", sequence=7)) or "")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"action": "delete"}, "action must be one of"),
        ({"action": "pardon"}, "needs a target"),
        ({"action": "rollback", "target": "not-a-head"}, "invalid HeadId"),
        ({"target": "sha256:" + "0" * 64}, "takes no target"),
        ({"sequence": 0}, r"'sequence' must be an integer"),
        ({"experiment": "no-slashes"}, "invalid experiment key"),
        ({"target": 7}, "'target' must be null"),
    ],
)
def test_malformed_orders_are_refused_with_a_reason(change: dict[str, object], message: str) -> None:
    wire = SignedRunControl.of(PAUSE, [A, B]).to_wire()
    wire["order"] = {**wire["order"], **change}
    with pytest.raises(InvalidMessage, match=message):
        SignedRunControl.from_wire(wire)


def test_signatures_gathered_from_copies_of_one_order_make_its_quorum_and_only_of_one_order() -> None:
    unsigned = SignedRunControl(PAUSE, ())
    copies = [unsigned.signed_by(A), unsigned.signed_by(C).signed_by(C)]  # C signing twice counts once
    gathered = SignedRunControl.gathered(copies)
    assert len(gathered.signatures) == 2 and gathered.effective_signers(NETWORK) == {A.public_key, C.public_key}
    with pytest.raises(InvalidMessage, match="different run-control orders"):
        SignedRunControl.gathered([*copies, SignedRunControl.of(replace(PAUSE, sequence=2), [B])])


def test_a_validator_reads_the_state_from_orders_it_checks_itself() -> None:
    resume = replace(PAUSE, action="resume", sequence=2)
    orders = [SignedRunControl.of(PAUSE, [A, B]), SignedRunControl.of(resume, [B, C])]
    assert RunState.of(orders[:1], NETWORK, EXPERIMENT).halted == "paused by run control"
    assert RunState.of(orders, NETWORK, EXPERIMENT) == RunState(sequence=2)
    with pytest.raises(SignatureError, match="signed by 1 validator"):  # an edge cannot make one up
        RunState.of([SignedRunControl.of(PAUSE, [A, EDGE])], NETWORK, EXPERIMENT)
    with pytest.raises(InvalidMessage, match="already used"):  # nor serve them out of sequence
        RunState.of(orders[::-1] + orders[:1], NETWORK, EXPERIMENT)
    other = replace(PAUSE, experiment=ExperimentKey.parse("study/other/rev-1"))
    with pytest.raises(InvalidMessage, match="among"):
        RunState.of([SignedRunControl.of(other, [A, B])], NETWORK, EXPERIMENT)


def test_a_pardon_releases_a_peer_from_quarantine_and_clears_its_strikes() -> None:
    peer = peer_id_from_public_key(EDGE.public_key)
    book = replace(TrustBook(), strikes={peer: 5.0, "other": 5.0}, held=frozenset({peer, "other"}))
    pardoned = TrustBook.from_wire(book.pardoned(peer).to_wire())
    assert not pardoned.quarantined(peer) and pardoned.strikes[peer] == 0.0
    assert pardoned.quarantined("other") and pardoned.strikes["other"] == 5.0
