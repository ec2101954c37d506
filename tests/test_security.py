"""Identity and input hardening against a real edge: forged heads and candidates, replayed
signatures, a non-validator trying to promote, per-peer rate limits."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from protocol.clock import ManualClock
from protocol.envelope import pack_envelope, unpack_envelope
from protocol.messages import HeadDescriptor, PeerProof
from protocol.signing import PureSigner
from server.admission import issue_token
from server.errors import RateLimited
from server.replay import LocalOnce
from server.serve import BackgroundEdge
from server.store import Store

from .support import (
    EXPERIMENT,
    VALIDATOR,
    candidate_envelope,
    edge_settings,
    grant_lease,
    head_envelope,
    proof,
    write_network,
)

BASE = f"/v1/experiments/{EXPERIMENT}"
TRAINER = PureSigner(b"\x51" * 32)
STRANGER = PureSigner(b"\x53" * 32)


@pytest.fixture
def edge(tmp_path: Path, dataset_root: Path) -> Iterator[BackgroundEdge]:
    write_network(tmp_path / "network.json")
    settings = edge_settings(tmp_path, dataset_root, peer_requests_per_min=60)
    with BackgroundEdge(settings) as running:
        yield running


@pytest.fixture
def http(edge: BackgroundEdge) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=edge.url) as client:
        head, body = head_envelope()
        assert client.post(f"{BASE}/heads", content=body).status_code == 201
        client.headers["x-genesis"] = head.head_id
        yield client


def _lease_id(http: httpx.Client, signer: PureSigner = TRAINER) -> str:
    return str(grant_lease(http, signer).lease.lease_id)


def test_non_validator_cannot_promote(http: httpx.Client) -> None:
    genesis = http.headers["x-genesis"]
    assert grant_lease(http, TRAINER).lease.peer_id  # a known, leased trainer
    _, own_key = head_envelope(window=1, parent=genesis, signer=TRAINER)
    assert http.post(f"{BASE}/heads", content=own_key).status_code == 401
    head, _ = head_envelope(window=1, parent=genesis, signer=TRAINER)
    claims_validator = replace(head, validator_key=VALIDATOR.public_key).signed(TRAINER)
    _, artifact = unpack_envelope(head_envelope(window=1, parent=genesis)[1])
    response = http.post(f"{BASE}/heads", content=pack_envelope(claims_validator.to_wire(), artifact))
    assert response.status_code == 401 and response.json()["error"] == "SignatureError"
    assert http.get(f"{BASE}/head").json()["head_id"] == genesis


def test_forged_candidates_are_rejected(http: httpx.Client) -> None:
    genesis = http.headers["x-genesis"]
    candidate, body = candidate_envelope(TRAINER, genesis, _lease_id(http))
    impostor = PureSigner(b"\x52" * 32)
    stolen_identity = replace(candidate, examples=50_000).signed(impostor).to_wire() | {
        "public_key": candidate.to_wire()["public_key"],
        "peer_id": candidate.to_wire()["peer_id"],
    }
    _, artifact = unpack_envelope(body)
    assert http.post(f"{BASE}/candidates", content=pack_envelope(stolen_identity, artifact)).status_code == 401
    tampered = candidate.to_wire() | {"base_head": "sha256:" + "0" * 64}
    assert http.post(f"{BASE}/candidates", content=pack_envelope(tampered, artifact)).status_code == 401
    assert http.get(f"{BASE}/candidates").json() == []


def test_replayed_signatures_do_not_work(http: httpx.Client, edge: BackgroundEdge) -> None:
    genesis = http.headers["x-genesis"]
    # a join proof captured from one session cannot open another (new nonce per connection)
    with connect(edge.url.replace("http", "ws") + "/v1/relay") as first:
        nonce = json.loads(first.recv(timeout=5))["nonce"]
        captured = {"type": "join", "proof": proof(TRAINER, "join", nonce)}
        first.send(json.dumps(captured))
        assert json.loads(first.recv(timeout=5))["type"] == "welcome"
    with connect(edge.url.replace("http", "ws") + "/v1/relay") as second:
        second.recv(timeout=5)
        second.send(json.dumps(captured))
        with pytest.raises(ConnectionClosed) as closed:
            second.recv(timeout=5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400
    # an old lease proof is refused even though its signature is valid
    stale = PeerProof("lease", TRAINER.public_key, "native", "-", int(time.time() * 1000) - 600_000).signed(TRAINER)
    assert http.post(f"{BASE}/leases", json=stale.to_wire()).status_code == 400
    # a join proof is not a lease proof (the purpose is signed)
    assert http.post(f"{BASE}/leases", json=captured["proof"]).status_code == 400
    # only trainers lease, over HTTP as over the relay (one door: ``LeaseIssuer.grant``)
    viewer = PeerProof("lease", STRANGER.public_key, "viewer", "-", int(time.time() * 1000)).signed(STRANGER)
    refused = http.post(f"{BASE}/leases", json=viewer.to_wire())
    assert refused.status_code == 403 and "only trainers" in refused.json()["detail"]
    # a candidate's signature does not carry over to other bytes
    candidate, _ = candidate_envelope(TRAINER, genesis, _lease_id(http))
    _, other_artifact = unpack_envelope(candidate_envelope(TRAINER, genesis, seed=9)[1])
    assert (
        http.post(f"{BASE}/candidates", content=pack_envelope(candidate.to_wire(), other_artifact)).status_code == 422
    )
    # a signed head replayed on another experiment's route is refused
    head = HeadDescriptor.from_wire(http.get(f"{BASE}/head").json())
    assert head.head_id == genesis
    replayed = http.post("/v1/experiments/study/other/rev-1/heads", content=head_envelope()[1])
    assert replayed.status_code == 404 and replayed.json()["error"] == "NotFound"  # before its body is read


@pytest.mark.parametrize(
    ("path", "status", "error"),
    [
        # %2F is decoded before routing: the extra segments match no route (FastAPI's 404, no error name)
        ("/v1/artifacts/..%2F..%2Fedge.sqlite3", 404, None),
        ("/v1/artifacts/sha256:..%2F..%2Fetc%2Fpasswd", 404, None),
        ("/v1/datasets/..%2Fmnist/fetch-manifest.json", 404, None),
        ("/v1/datasets/mnist/shards/..%2Fvalidation%2Fvalidation?lease=x", 404, None),
        ("/v1/leases/..%2F..%2Fx", 404, None),
        ("/v1/experiments/study/..%2F..%2Fx/rev-1/head", 404, None),
        # one segment reaches the route, whose id type refuses ".."
        ("/v1/artifacts/..%5C..%5Cedge.sqlite3", 400, "InvalidMessage"),
        ("/v1/datasets/..mnist/fetch-manifest.json", 400, "InvalidMessage"),
        ("/v1/leases/lease-..", 400, "InvalidMessage"),
    ],
)
def test_path_traversal_is_refused(http: httpx.Client, path: str, status: int, error: str | None) -> None:
    response = http.get(path)
    assert response.status_code == status, (path, response.text)
    if error is None:
        assert response.json() == {"error": "NotFound", "detail": "Not Found"}
    else:
        assert response.json()["error"] == error


def test_candidate_must_name_a_lease_its_trainer_holds(http: httpx.Client) -> None:
    genesis = http.headers["x-genesis"]
    _, no_lease = candidate_envelope(TRAINER, genesis, "lease-made-up")
    assert http.post(f"{BASE}/candidates", content=no_lease).status_code == 403
    someone_elses = _lease_id(http, PureSigner(b"\x54" * 32))
    _, borrowed = candidate_envelope(TRAINER, genesis, someone_elses)
    assert http.post(f"{BASE}/candidates", content=borrowed).status_code == 403
    _, own = candidate_envelope(TRAINER, genesis, _lease_id(http))
    assert http.post(f"{BASE}/candidates", content=own).status_code == 201


def test_per_peer_rate_limit(http: httpx.Client) -> None:
    codes = [http.post(f"{BASE}/leases", json=proof(TRAINER, "lease")).status_code for _ in range(20)]
    assert codes[0] == 200 and 429 in codes
    assert http.post(f"{BASE}/leases", json=proof(PureSigner(b"\x53" * 32), "lease")).status_code == 200


def test_admission_tokens_and_roles(tmp_path: Path, dataset_root: Path) -> None:
    network = write_network(tmp_path / "plain.json")
    (tmp_path / "network.json").write_text(json.dumps(replace(network, admission_required=True).to_wire()))
    store = Store(tmp_path / "edge" / "edge.sqlite3")
    tokens = {role: issue_token(store, role, role, 3600) for role in ("viewer", "trainer", "validator")}
    store.close()
    settings = edge_settings(tmp_path, dataset_root)
    with BackgroundEdge(settings) as edge, httpx.Client(base_url=edge.url) as http:

        def bearer(role: str) -> dict[str, str]:
            return {"authorization": f"Bearer {tokens[role]}"}

        head, body = head_envelope()
        assert http.post(f"{BASE}/heads", content=body).status_code == 401
        assert http.post(f"{BASE}/heads", content=body, headers=bearer("trainer")).status_code == 403
        assert http.post(f"{BASE}/heads", content=body, headers=bearer("validator")).status_code == 201
        lease_body = proof(TRAINER, "lease")
        assert http.post(f"{BASE}/leases", json=lease_body).status_code == 401
        assert (
            http.post(f"{BASE}/leases", json=lease_body, headers={"authorization": "Bearer dtn_forged"}).status_code
            == 401
        )
        assert http.post(f"{BASE}/leases", json=lease_body, headers=bearer("viewer")).status_code == 403
        assert http.post(f"{BASE}/leases", json=lease_body, headers=bearer("trainer")).status_code == 200
        with connect(edge.url.replace("http", "ws") + "/v1/relay") as ws:
            nonce = json.loads(ws.recv(timeout=5))["nonce"]
            ws.send(json.dumps({"type": "join", "proof": proof(TRAINER, "join", nonce)}))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
        with connect(edge.url.replace("http", "ws") + "/v1/relay") as ws:
            nonce = json.loads(ws.recv(timeout=5))["nonce"]
            viewer_join = proof(TRAINER, "join", nonce, kind="viewer")  # a viewer's token joins as a viewer
            ws.send(json.dumps({"type": "join", "proof": viewer_join, "token": tokens["viewer"]}))
            assert json.loads(ws.recv(timeout=5))["type"] == "welcome"
            ws.send(json.dumps({"type": "lease.request", "experiment": EXPERIMENT, "request_id": 1}))
            reply = json.loads(ws.recv(timeout=5))
            assert reply["type"] == "error" and reply["status"] == 403
        assert head.head_id == http.get(f"{BASE}/head").json()["head_id"]


def test_one_time_proofs_are_remembered_until_stale_within_a_bounded_memory() -> None:
    clock = ManualClock()
    seen = LocalOnce(max_keys=2, clock=clock)
    assert seen.first("a", 1000) and not seen.first("a", 1000)
    assert seen.first("b", 1000)
    with pytest.raises(RateLimited):  # full: refused, nothing forgotten early
        seen.first("c", 1000)
    assert not seen.first("a", 1000)
    clock.advance(1.0)  # their time is up: forgotten
    assert seen.first("c", 1000) and seen.first("a", 1000)
