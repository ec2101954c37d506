"""Trust a joining peer can pin (issue #24 item 4): validators sign the network's terms, the edge serves
their signatures, and native and browser peers refuse an edge whose network their pinned validators
did not sign."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from browser_peer.peer import BrowserPeer, PeerConfig
from lab.browser_host import NativeBridge
from native_peer.cli import pinned_network
from native_peer.edge_client import EdgeClient
from protocol.manifests import NetworkManifest
from protocol.network_pins import NetworkSignature, fingerprint, network_terms, pin_problem, signed_by
from protocol.signing import PureSigner
from server.serve import BackgroundEdge

from .support import edge_settings, experiment_spec

A, B, C, EDGE = (PureSigner(bytes([n]) * 32) for n in (21, 22, 23, 24))
NETWORK = NetworkManifest("pinned-net", (A.public_key, B.public_key, C.public_key), (experiment_spec(),), quorum=2)


def _problem(
    network: NetworkManifest, pins: list[str], *signers: PureSigner, of: NetworkManifest = NETWORK
) -> str | None:
    return pin_problem(network, pins, signed_by(network, [NetworkSignature.of(of, s) for s in signers]))


def test_one_pinned_validator_that_signed_the_terms_is_enough_and_an_edge_cannot_forge_it() -> None:
    fp = fingerprint(A.public_key)
    assert _problem(NETWORK, [fp], A) is None  # a 2-of-3 network, one pin: A signed these terms
    assert "have not signed" in (_problem(NETWORK, [fp], B) or "")  # B's signature does not stand for A's
    # an edge that serves other terms (its own experiments, quorum or validators) holds no signature of A's
    for forged in (
        replace(NETWORK, experiments=(experiment_spec(learning_rate=5e-2),)),
        replace(NETWORK, quorum=1),
        replace(NETWORK, validator_keys=(A.public_key, EDGE.public_key, C.public_key)),
    ):
        assert _problem(forged, [fp], A) is not None
    # what each edge fills in is not part of the terms: a replacement edge serves the same network
    assert _problem(replace(NETWORK, edge_key=EDGE.public_key, admission_required=True), [fp], A) is None
    assert "edge_key" not in network_terms(NETWORK)
    # a pin that names no validator, and a signature of a key that is not a validator
    assert "none is the pinned validator" in (_problem(NETWORK, [fingerprint(EDGE.public_key)], A) or "")
    assert signed_by(NETWORK, [NetworkSignature.of(NETWORK, EDGE)]) == frozenset()


def test_without_signatures_pins_must_leave_no_quorum_unpinned() -> None:
    a, b = fingerprint(A.public_key), fingerprint(B.public_key)
    assert _problem(NETWORK, [a]) is not None  # B and C make a quorum without A
    assert _problem(NETWORK, [a, b]) is None  # n - k + 1 = 2 pins: every quorum holds one of them
    assert _problem(NETWORK, []) is None  # no pin: the peer trusts the edge, and says so


def test_an_edge_keeps_validators_signatures_and_peers_check_their_pins(tmp_path: Path, dataset_root: Path) -> None:
    (tmp_path / "network.json").write_text(json.dumps(NETWORK.to_wire()))
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge:
        client = EdgeClient(edge.url)
        try:
            assert client.network_signatures() == []
            client.sign_network(NetworkSignature.of(NETWORK, A))
            for refused in (NetworkSignature.of(NETWORK, EDGE), NetworkSignature.of(replace(NETWORK, quorum=1), B)):
                answer = httpx.post(f"{edge.url}/v1/network/signatures", json=refused.to_wire())
                assert answer.status_code == 409 and "not a signature of a validator" in answer.json()["detail"]
            assert httpx.post(f"{edge.url}/v1/network/signatures", json={"validator_key": 1}).status_code == 400
            served, signatures = client.network(), client.network_signatures()
        finally:
            client.close()
        assert signed_by(served, signatures) == {A.public_key}
        assert pinned_network(served, [fingerprint(A.public_key)], edge.url, signatures) == served
        with pytest.raises(SystemExit, match="have not signed"):
            pinned_network(served, [fingerprint(B.public_key)], edge.url, signatures)
        # a tab: told to trust A it joins; told to trust B (who signed nothing here) it refuses the edge
        for pin, joins in ((fingerprint(A.public_key), True), (fingerprint(B.public_key), False)):
            bridge = NativeBridge()
            peer = BrowserPeer(bridge, PeerConfig(edge.url, str(NETWORK.experiments[0].key), b"\x51" * 32, pins=(pin,)))

            async def visit(peer: BrowserPeer = peer, bridge: NativeBridge = bridge) -> None:
                task = asyncio.ensure_future(peer.run())
                for _ in range(100):
                    if task.done() or any(s["phase"] == "joined" for s in bridge.statuses):
                        break
                    await asyncio.sleep(0.05)
                peer.stop()
                await asyncio.wait_for(task, 30)
                await bridge.aclose()

            asyncio.run(visit())
            phases = [s["phase"] for s in bridge.statuses]
            assert ("joined" in phases) == joins, phases
            assert any(p.startswith("error: refusing this edge") for p in phases) == (not joins)
            assert peer.status["signed"] == [fingerprint(A.public_key)] and peer.status["quorum"] == 2
