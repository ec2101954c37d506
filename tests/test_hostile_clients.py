"""Hostile clients against a real edge (loopback only, bounded): what it refuses, what it keeps,
that storage stays bounded however long the network runs, and that nobody speaks for another peer."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import resource
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from native_peer.models import builtin_model
from protocol.codec import encode_tensors
from protocol.envelope import pack_envelope
from protocol.hashing import content_id
from protocol.ids import HeadId
from protocol.messages import LEASE_SECRET_HEADER, READ_PROOF_HEADER, Candidate, Lease, PeerProof
from protocol.model import init_params
from protocol.signing import PureSigner, b64encode, canonical_json
from server import relay
from server.admission import REVOCATION_CHECK_S, issue_token, token_id
from server.connections import ACCEPT_BACKLOG, FD_RESERVE, ConnectionLimits
from server.errors import CLOSE_REVOKED
from server.hub import TOPICS
from server.serve import BackgroundEdge
from server.store import Store

from .support import (
    EXPERIMENT,
    VALIDATOR,
    edge_settings,
    grant_lease,
    head_envelope,
    now_ms,
    proof,
    tools_output,
    validator_reads,
    write_network,
)

BASE = f"/v1/experiments/{EXPERIMENT}"
SPEC = builtin_model("mnist-mlp")


def _start(tmp_path: Path, dataset_root: Path, **settings: object) -> BackgroundEdge:
    write_network(tmp_path / "network.json")
    return BackgroundEdge(edge_settings(tmp_path, dataset_root, **settings)).start()


@contextmanager
def _client(edge: BackgroundEdge) -> Iterator[httpx.Client]:
    """A client of ``edge``, whose experiment has its genesis head."""
    with httpx.Client(base_url=edge.url) as client:
        _, genesis = head_envelope()
        assert client.post(f"{BASE}/heads", content=genesis).status_code == 201
        yield client


@pytest.fixture
def http(tmp_path: Path, dataset_root: Path) -> Iterator[httpx.Client]:
    edge = _start(tmp_path, dataset_root)
    try:
        with _client(edge) as client:
            yield client
    finally:
        edge.stop()


def _lease(http: httpx.Client, signer: PureSigner, kind: str = "native") -> Lease:
    return grant_lease(http, signer, kind).lease


def _upload(
    http: httpx.Client,
    signer: PureSigner,
    lease: Lease,
    artifact: bytes,
    *,
    kind: str = "native",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    candidate = Candidate.for_lease(
        lease, lease.base_head, artifact, signer, peer_kind=kind, examples=64, steps=1, created_at_ms=1
    )
    return http.post(f"{BASE}/candidates", content=pack_envelope(candidate.to_wire(), artifact), headers=headers)


def _refused(response: httpx.Response, status: int, error: str) -> None:
    assert (response.status_code, response.json()["error"]) == (status, error), response.text


def _stored_blobs(root: Path) -> set[str]:
    return {p.name for p in (root / "edge" / "blobs").rglob("*") if p.is_file()}


def test_the_edge_stores_only_artifacts_of_the_experiments_model(http: httpx.Client, tmp_path: Path) -> None:
    before = _stored_blobs(tmp_path)
    trainer = PureSigner(b"\x71" * 32)
    lease = _lease(http, trainer)
    html = encode_tensors({"page": np.frombuffer(b"<html><script>alert(1)</script></html>", np.uint8)})
    _refused(_upload(http, trainer, lease, html), 400, "InvalidMessage")
    noise = np.random.default_rng(0).integers(0, 255, 2 << 20, dtype=np.uint8).tobytes()
    _refused(_upload(http, trainer, lease, noise), 413, "TooLarge")  # 2 MiB: more than any model artifact
    _refused(_upload(http, trainer, lease, noise[: SPEC.max_artifact_bytes]), 413, "TooLarge")  # its "header"
    garbage = struct.pack("<Q", 64) + noise[:100_000]
    _refused(_upload(http, trainer, lease, garbage), 400, "CodecError")
    wrong = init_params(SPEC, 1)
    wrong["dense1.kernel"] = wrong["dense1.kernel"][:, :9].copy()
    _refused(_upload(http, trainer, lease, encode_tensors(wrong)), 400, "InvalidMessage")
    padded = encode_tensors(init_params(SPEC, 1), {"junk": "x" * 100_000})
    _refused(_upload(http, trainer, lease, padded), 413, "TooLarge")
    assert _stored_blobs(tmp_path) == before  # nothing of it was kept
    assert _upload(http, trainer, lease, encode_tensors(init_params(SPEC, 1))).status_code == 201


def test_one_candidate_per_lease_and_only_trainers_upload(http: httpx.Client) -> None:
    trainer = PureSigner(b"\x72" * 32)
    lease = _lease(http, trainer)
    first = encode_tensors(init_params(SPEC, 1))
    assert _upload(http, trainer, lease, first).status_code == 201
    assert _upload(http, trainer, lease, first).status_code == 200  # the same upload again is idempotent
    _refused(_upload(http, trainer, lease, encode_tensors(init_params(SPEC, 2))), 409, "Conflict")
    listed = http.get(f"{BASE}/candidates", headers=validator_reads(f"{BASE}/candidates")).json()
    assert [c["candidate_id"] for c in listed] == [content_id(first)]
    claims_validator = PureSigner(b"\x73" * 32)
    lease = _lease(http, claims_validator)
    _refused(_upload(http, claims_validator, lease, first, kind="validator"), 403, "Forbidden")


def test_a_windows_storage_quota_is_enforced(tmp_path: Path, dataset_root: Path) -> None:
    artifact_bytes = len(encode_tensors(init_params(SPEC, 1)))
    edge = _start(tmp_path, dataset_root, window_quota_bytes=2 * artifact_bytes + 100)
    try:
        with _client(edge) as http:
            trainers = [PureSigner(bytes([0x80 + i]) * 32) for i in range(3)]
            leases = [_lease(http, t) for t in trainers]
            for i in range(2):
                assert _upload(http, trainers[i], leases[i], encode_tensors(init_params(SPEC, i))).status_code == 201
            third = _upload(http, trainers[2], leases[2], encode_tensors(init_params(SPEC, 9)))
            _refused(third, 507, "QuotaExceeded")
    finally:
        edge.stop()


def test_candidate_storage_stays_bounded_over_many_windows(http: httpx.Client, tmp_path: Path) -> None:
    """A soak of 12 windows with 3 candidates each: candidate artifacts of judged windows are deleted
    (retention 2 windows), heads are kept for the lineage."""
    trainers = [PureSigner(bytes([0x90 + i]) * 32) for i in range(3)]
    head = http.get(f"{BASE}/head").json()
    first_window: list[str] = []
    candidate_bytes_per_window = []
    for window in range(1, 13):
        for i, trainer in enumerate(trainers):
            artifact = encode_tensors(init_params(SPEC, 100 * window + i))
            assert _upload(http, trainer, _lease(http, trainer), artifact).status_code == 201
            if window == 1:
                first_window.append(content_id(artifact))
        _, body = head_envelope(init_params(SPEC, 10_000 + window), parent=HeadId(head["head_id"]), window=window)
        assert http.post(f"{BASE}/heads", content=body).status_code == 201
        head = http.get(f"{BASE}/head").json()
        heads = {h["head_id"].removeprefix("sha256:")[2:] for h in http.get(f"{BASE}/heads").json()}
        candidate_bytes_per_window.append(
            sum(
                f.stat().st_size
                for f in (tmp_path / "edge" / "blobs").rglob("*")
                if f.is_file() and f.name not in heads
            )
        )
    one_window = 3 * len(encode_tensors(init_params(SPEC, 0)))
    assert max(candidate_bytes_per_window) <= 2 * one_window  # never more than the retained windows
    assert candidate_bytes_per_window[-1] == candidate_bytes_per_window[3]  # flat, not growing
    assert len(http.get(f"{BASE}/heads").json()) == 13  # the lineage is whole
    for cid in first_window:
        assert http.get(f"/v1/artifacts/{cid}").status_code == 404


@contextmanager
def _join(url: str, signer: PureSigner, kind: str, token: str | None = None) -> Iterator[ClientConnection]:
    """A relay connection that has answered the challenge as a ``kind`` peer (the reply is next)."""
    with connect(url.replace("http", "ws") + "/v1/relay") as ws:
        nonce = json.loads(ws.recv(timeout=5))["nonce"]
        ws.send(json.dumps({"type": "join", "proof": proof(signer, "join", nonce, kind=kind), "token": token}))
        yield ws


def test_the_relay_names_the_authenticated_sender_and_leases_only_to_trainers(
    tmp_path: Path, dataset_root: Path
) -> None:
    edge = _start(tmp_path, dataset_root)
    try:
        with _client(edge), _join(edge.url, PureSigner(b"\xa1" * 32), "viewer") as watcher:
            assert json.loads(watcher.recv(timeout=5))["type"] == "welcome"
            watcher.send(json.dumps({"type": "subscribe", "experiment": EXPERIMENT, "topics": ["metrics"]}))
            assert json.loads(watcher.recv(timeout=5))["type"] == "subscribed"
            liar = PureSigner(b"\xa2" * 32)
            with _join(edge.url, liar, "native") as ws:
                welcome = json.loads(ws.recv(timeout=5))
                forged = {"peer_id": "someone-else", "kind": "validator", "loss": 0.1}
                ws.send(json.dumps({"type": "metrics", "experiment": EXPERIMENT, "data": forged}))
                event = json.loads(watcher.recv(timeout=5))
            assert event["data"] == {"loss": 0.1, "peer_id": welcome["peer_id"], "kind": "native"}
            with _join(edge.url, PureSigner(b"\xa3" * 32), "validator") as ws:
                assert json.loads(ws.recv(timeout=5))["type"] == "welcome"
                ws.send(json.dumps({"type": "lease.request", "experiment": EXPERIMENT, "request_id": 1}))
                reply = json.loads(ws.recv(timeout=5))
            assert (reply["type"], reply["status"], reply["error"]) == ("error", 403, "Forbidden")
    finally:
        edge.stop()


def test_with_admission_the_claimed_kind_comes_from_the_tokens_role(tmp_path: Path, dataset_root: Path) -> None:
    network = write_network(tmp_path / "plain.json")
    (tmp_path / "network.json").write_text(json.dumps(replace(network, admission_required=True).to_wire()))
    store = Store(tmp_path / "edge" / "edge.sqlite3")
    viewer_token = issue_token(store, "viewer", "v", 3600)
    store.close()
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge:
        with (
            _join(edge.url, PureSigner(b"\xa4" * 32), "native", viewer_token) as ws,
            pytest.raises(ConnectionClosed) as closed,
        ):
            ws.recv(timeout=5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
        with _join(edge.url, PureSigner(b"\xa5" * 32), "viewer", viewer_token) as ws:
            assert json.loads(ws.recv(timeout=5))["type"] == "welcome"


def test_slow_clients_are_cut_off_and_the_edge_keeps_answering(tmp_path: Path, dataset_root: Path) -> None:
    """100 slowloris connections from one address: past the per-address cap they are refused at once,
    the rest are closed at the header deadline; /healthz from another address answers throughout."""
    edge = _start(tmp_path, dataset_root, header_timeout_s=1.0, max_connections_per_address=20)
    slow: list[socket.socket] = []
    try:
        for _ in range(100):
            conn = socket.create_connection(("127.0.0.1", edge.settings.port), timeout=5)
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers never finish
            slow.append(conn)
        other_address = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=edge.url, transport=other_address, timeout=2) as client:
            started = time.monotonic()
            answers = []
            while time.monotonic() - started < 2.0:
                for conn in slow:
                    with contextlib.suppress(OSError):
                        conn.send(b"x")  # a byte now and then keeps a naive server waiting
                answers.append(client.get("/healthz").status_code)
                time.sleep(0.2)
        assert answers and set(answers) == {200}
        closed = 0
        for conn in slow:
            conn.settimeout(0.5)
            try:
                data = conn.recv(1024)
            except TimeoutError:  # still open: the edge is waiting on it
                data = b"open"
            except OSError:  # reset: closed by the edge
                data = b""
            closed += data == b"" or data.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
        assert closed == len(slow)
    finally:
        for conn in slow:
            conn.close()
        edge.stop()


def test_a_send_that_failed_because_the_peer_left_is_collected_not_left_to_the_event_loop() -> None:
    """A relay connection whose sending task already died (the peer left mid-frame) is stopped without
    the event loop reporting "Task exception was never retrieved" for it."""

    async def leave_and_stop() -> list[str]:
        reported: list[str] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: reported.append(context["message"]))

        async def send_to_a_peer_that_left() -> None:
            raise ConnectionResetError("the peer left mid-frame")

        sender = asyncio.create_task(send_to_a_peer_that_left())
        await asyncio.sleep(0)  # the send fails before the connection is stopped
        assert sender.done()
        await relay._stop(sender)
        del sender
        gc.collect()
        return reported

    assert asyncio.run(leave_and_stop()) == []


def test_the_connection_cap_stays_inside_the_descriptor_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = ConnectionLimits(
        header_timeout_s=1,
        body_timeout_s=1,
        max_connections=4096,
        max_connections_per_address=8,
        reserved_connections=16,
    )
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))  # `ulimit -n 1024`
    assert limits.connection_cap + limits.reserved_connections == 1024 - FD_RESERVE - ACCEPT_BACKLOG
    monkeypatch.setattr(resource, "getrlimit", lambda _: (65536, 65536))
    assert limits.connection_cap == 4096


def test_bad_signature_floods_are_limited_per_address_before_they_are_checked(
    tmp_path: Path, dataset_root: Path
) -> None:
    edge = _start(tmp_path, dataset_root, address_checks_per_min=60)  # burst 15
    forger, victim = PureSigner(b"\xb1" * 32), PureSigner(b"\xb2" * 32)
    codes = []
    try:
        for _ in range(25):
            with connect(edge.url.replace("http", "ws") + "/v1/relay") as ws:
                nonce = json.loads(ws.recv(timeout=5))["nonce"]
                forged = proof(forger, "join", nonce) | {"public_key": proof(victim, "join", nonce)["public_key"]}
                ws.send(json.dumps({"type": "join", "proof": forged}))
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv(timeout=5)
                assert closed.value.rcvd is not None
                codes.append(closed.value.rcvd.code)
        assert codes[0] == 4401 and codes[-1] == 4429 and set(codes) == {4401, 4429}
        assert 10 <= codes.count(4401) <= 20  # the burst, give or take the refill during the test
    finally:
        edge.stop()


def test_bad_signature_floods_over_http_are_limited_per_address_too(tmp_path: Path, dataset_root: Path) -> None:
    """Lease requests and candidate uploads with forged signatures, from one address: refused 401 until
    the address's budget of signature checks is spent, then 429 without a check; another address is
    untouched."""
    edge = _start(tmp_path, dataset_root, address_checks_per_min=60)  # burst 15
    forger, victim = PureSigner(b"\xb5" * 32), PureSigner(b"\xb6" * 32)
    try:
        with _client(edge) as http:
            forged_lease = proof(forger, "lease") | {"public_key": proof(victim, "lease")["public_key"]}
            artifact = encode_tensors(init_params(SPEC, 5))
            own_lease = grant_lease(http, forger).lease
            claims_victim = replace(  # the victim's key, the forger's signature
                Candidate.for_lease(
                    own_lease,
                    own_lease.base_head,
                    artifact,
                    forger,
                    peer_kind="native",
                    examples=64,
                    steps=1,
                    created_at_ms=1,
                ),
                public_key=victim.public_key,
            )
            forged_upload = pack_envelope(claims_victim.to_wire(), artifact)
            codes = []
            for i in range(25):
                if i % 2:
                    codes.append(http.post(f"{BASE}/leases", json=forged_lease).status_code)
                else:
                    codes.append(http.post(f"{BASE}/candidates", content=forged_upload).status_code)
            assert codes[0] == 401 and codes[-1] == 429 and set(codes) == {401, 429}
            assert 10 <= codes.count(401) <= 20
            other_address = httpx.HTTPTransport(local_address="127.0.0.3")
            with httpx.Client(base_url=edge.url, transport=other_address) as other:
                assert other.post(f"{BASE}/leases", json=proof(victim, "lease")).status_code == 200
    finally:
        edge.stop()


def _admission_edge(tmp_path: Path, dataset_root: Path) -> tuple[BackgroundEdge, dict[str, str]]:
    """An edge whose network requires admission, and a token for each role."""
    network = write_network(tmp_path / "plain.json")
    (tmp_path / "network.json").write_text(json.dumps(replace(network, admission_required=True).to_wire()))
    store = Store(tmp_path / "edge" / "edge.sqlite3")
    tokens = {role: issue_token(store, role, role, 3600) for role in ("viewer", "trainer", "validator")}
    store.close()
    return BackgroundEdge(edge_settings(tmp_path, dataset_root)).start(), tokens


def test_a_lease_unlocks_its_shards_only_for_its_holder(http: httpx.Client) -> None:
    """Lease ids are public (listings, events, candidates); the secret that reads the data is not."""
    holder = PureSigner(b"\xb1" * 32)
    grant = grant_lease(http, holder)
    listed = http.get(f"{BASE}/leases", params={"base_head": grant.lease.base_head}).json()
    assert [lease["lease_id"] for lease in listed] == [grant.lease.lease_id]
    assert grant.secret not in json.dumps(listed)
    url = f"/v1/datasets/mnist/shards/{grant.lease.shard_ids[0]}"
    params = {"lease": grant.lease.lease_id}
    _refused(http.get(url, params=params), 401, "Unauthorized")  # the lease id alone
    _refused(http.get(url, params=params, headers={LEASE_SECRET_HEADER: "0" * 64}), 403, "Forbidden")
    other = grant_lease(http, PureSigner(b"\xb2" * 32))
    _refused(http.get(url, params=params, headers={LEASE_SECRET_HEADER: other.secret}), 403, "Forbidden")
    unknown = {"lease": "lease-" + "0" * 32}
    _refused(http.get(url, params=unknown, headers={LEASE_SECRET_HEADER: grant.secret}), 403, "Forbidden")
    assert http.get(url, params=params, headers={LEASE_SECRET_HEADER: grant.secret}).status_code == 200
    assert grant_lease(http, holder) == grant  # asking again in the window: the same lease and secret


def test_with_admission_data_leases_and_candidates_are_read_with_a_token(tmp_path: Path, dataset_root: Path) -> None:
    edge, tokens = _admission_edge(tmp_path, dataset_root)

    def bearer(role: str) -> dict[str, str]:
        return {"authorization": f"Bearer {tokens[role]}"}

    try:
        with httpx.Client(base_url=edge.url) as http:
            head, genesis = head_envelope()
            assert http.post(f"{BASE}/heads", content=genesis, headers=bearer("validator")).status_code == 201
            trainer = PureSigner(b"\xb3" * 32)
            grant = grant_lease(http, trainer, **bearer("trainer"))
            artifact = encode_tensors(init_params(SPEC, 3))
            assert _upload(http, trainer, grant.lease, artifact, headers=bearer("trainer")).status_code == 201
            shard = f"/v1/datasets/mnist/shards/{grant.lease.shard_ids[0]}"
            secret = {LEASE_SECRET_HEADER: grant.secret}
            reads = {
                "fetch-manifest": ("/v1/datasets/mnist/fetch-manifest.json", {}, "trainer"),
                "shard": (shard, {"params": {"lease": grant.lease.lease_id}, "headers": secret}, "trainer"),
                "lease list": (f"{BASE}/leases", {"params": {"base_head": head.head_id}}, "validator"),
                "one lease": (f"/v1/leases/{grant.lease.lease_id}", {}, "validator"),
                "candidate list": (f"{BASE}/candidates", {}, "validator"),
                "candidate artifact": (f"/v1/artifacts/{content_id(artifact)}", {}, "validator"),
            }
            for name, (path, options, least_role) in reads.items():
                headers = dict(options.get("headers", {})) | validator_reads(path)  # the window is open
                params = options.get("params")
                anonymous = http.get(path, params=params, headers=headers)
                assert (anonymous.status_code, anonymous.json()["error"]) == (401, "Unauthorized"), name
                viewer = http.get(path, params=params, headers={**headers, **bearer("viewer")})
                assert (viewer.status_code, viewer.json()["error"]) == (403, "Forbidden"), name
                allowed = http.get(path, params=params, headers={**headers, **bearer(least_role)})
                assert allowed.status_code == 200, (name, allowed.text)
                if least_role == "validator":
                    refused = http.get(path, params=params, headers={**headers, **bearer("trainer")})
                    assert (refused.status_code, refused.json()["error"]) == (403, "Forbidden"), name
            # what lets anyone check the model stays public: heads, their artifacts, verdicts
            assert http.get(f"{BASE}/head").json()["head_id"] == head.head_id
            assert content_id(http.get(f"/v1/artifacts/{head.head_id}").content) == head.head_id
            assert http.get(f"{BASE}/verdicts").status_code == 200
    finally:
        edge.stop()


def test_with_admission_the_event_stream_shows_anonymous_viewers_no_lease_ids_shards_or_principals(
    tmp_path: Path, dataset_root: Path
) -> None:
    """Viewers and peers whose token may not read leases see a lease's count of shards, not its id,
    shards or principal, nor a candidate's lease; a validator's relay connection sees them whole."""
    edge, tokens = _admission_edge(tmp_path, dataset_root)
    trainer = PureSigner(b"\xb7" * 32)
    try:
        with (
            httpx.Client(base_url=edge.url) as http,
            connect(edge.url.replace("http", "ws") + "/v1/events") as viewer,
            _join(edge.url, trainer, "native", tokens["trainer"]) as trainer_ws,
            _join(edge.url, VALIDATOR, "validator", tokens["validator"]) as validator_ws,
        ):
            for ws in (trainer_ws, validator_ws):
                assert json.loads(ws.recv(timeout=5))["type"] == "welcome"
                ws.send(json.dumps({"type": "subscribe", "experiment": EXPERIMENT, "topics": ["leases", "candidates"]}))
                assert json.loads(ws.recv(timeout=5))["type"] == "subscribed"
            _, genesis = head_envelope()
            validator = {"authorization": f"Bearer {tokens['validator']}"}
            assert http.post(f"{BASE}/heads", content=genesis, headers=validator).status_code == 201
            grant = grant_lease(http, trainer, authorization=f"Bearer {tokens['trainer']}")
            artifact = encode_tensors(init_params(SPEC, 3))
            upload = _upload(
                http, trainer, grant.lease, artifact, headers={"authorization": f"Bearer {tokens['trainer']}"}
            )
            assert upload.status_code == 201

            def events(ws: ClientConnection) -> dict[str, dict[str, object]]:
                seen: dict[str, dict[str, object]] = {}
                while len(seen) < 2:
                    message = json.loads(ws.recv(timeout=5))
                    if message.get("topic") in ("leases", "candidates"):
                        seen[message["topic"]] = message["data"]
                return seen

            secrets = (grant.lease.lease_id, *grant.lease.shard_ids, token_id(tokens["trainer"]), grant.secret)
            snapshot = http.get("/portal/snapshot").json()["events"]
            for seen in (events(viewer), events(trainer_ws), {e["topic"]: e["data"] for e in snapshot}):
                assert seen["leases"]["shards"] == len(grant.lease.shard_ids)
                assert seen["leases"]["peer_id"] == grant.lease.peer_id
                assert seen["candidates"]["candidate_id"] == content_id(artifact)
                assert not any(secret in json.dumps(seen) for secret in secrets)
            whole = events(validator_ws)
            assert Lease.from_wire(whole["leases"]) == grant.lease and "lease_id" in whole["candidates"]
    finally:
        edge.stop()


def test_tokens_need_the_bearer_scheme_and_revoked_ones_stop_at_once(tmp_path: Path, dataset_root: Path) -> None:
    edge, tokens = _admission_edge(tmp_path, dataset_root)
    try:
        with httpx.Client(base_url=edge.url) as http:
            _, genesis = head_envelope()
            assert (
                http.post(f"{BASE}/heads", content=genesis, headers={"authorization": f"Bearer {tokens['validator']}"})
            ).status_code == 201
            trainer = PureSigner(b"\xb4" * 32)
            for malformed in (tokens["trainer"], f"Basic {tokens['trainer']}", "Bearer", f"Token {tokens['trainer']}"):
                refused = http.post(
                    f"{BASE}/leases", json=proof(trainer, "lease"), headers={"authorization": malformed}
                )
                _refused(refused, 401, "Unauthorized")
                assert "Bearer" in refused.json()["detail"]
            grant_lease(http, trainer, authorization=f"bearer {tokens['trainer']}")  # the scheme is case-insensitive
            with _join(edge.url, trainer, "native", tokens["trainer"]) as ws:
                assert json.loads(ws.recv(timeout=5))["type"] == "welcome"
                ws.send(json.dumps({"type": "subscribe", "experiment": EXPERIMENT, "topics": sorted(TOPICS)}))
                assert json.loads(ws.recv(timeout=5))["type"] == "subscribed"
                listing = tools_output(["token", "list", "--data-dir", str(tmp_path / "edge")])
                assert tokens["trainer"] not in listing and token_id(tokens["trainer"]) in listing
                assert "revoked" in tools_output(
                    ["token", "revoke", "--data-dir", str(tmp_path / "edge"), token_id(tokens["trainer"])]
                )
                with pytest.raises(SystemExit):
                    tools_output(["token", "revoke", "--data-dir", str(tmp_path / "edge"), token_id(tokens["trainer"])])
                with pytest.raises(ConnectionClosed) as closed:  # closed by the sweep, the peer silent
                    ws.recv(timeout=REVOCATION_CHECK_S + 5)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == CLOSE_REVOKED
            refused = http.post(
                f"{BASE}/leases", json=proof(trainer, "lease"), headers={"authorization": f"Bearer {tokens['trainer']}"}
            )
            _refused(refused, 401, "Unauthorized")
            # the other tokens are untouched
            assert (
                http.get(f"{BASE}/candidates", headers={"authorization": f"Bearer {tokens['validator']}"}).status_code
                == 200
            )
    finally:
        edge.stop()


def test_no_lease_once_every_shard_of_the_window_is_held(http: httpx.Client, dataset_root: Path) -> None:
    """Identities are free, data is not: once the window's shards are all leased, a new key gets none."""
    shards = len(json.loads((dataset_root / "mnist" / "train" / "fetch-manifest.json").read_text())["shards"])
    per_lease = 2  # tests.support.experiment_spec
    leases = [_lease(http, PureSigner(bytes([0x10 + i]) * 32)) for i in range(-(-shards // per_lease))]
    held = [shard for lease in leases for shard in lease.shard_ids]
    assert len(held) == len(set(held)) == shards
    sybil = http.post(f"{BASE}/leases", json=proof(PureSigner(b"\xee" * 32), "lease"))
    _refused(sybil, 409, "Conflict")
    assert "every shard" in sybil.json()["detail"]
    assert _lease(http, PureSigner(b"\x10" * 32)) == leases[0]  # a holder asking again still gets its lease


def test_an_open_windows_candidates_are_read_by_validators_only(http: httpx.Client) -> None:
    """What adaptive attacks (ALIE, IPM) need is the other candidates of the window they attack: while
    a window is open its candidates are listed and served to validators only (a signed read proof)."""
    trainer = PureSigner(b"\xc1" * 32)
    artifact = encode_tensors(init_params(SPEC, 4))
    assert _upload(http, trainer, _lease(http, trainer), artifact).status_code == 201
    listing, blob = f"{BASE}/candidates", f"/v1/artifacts/{content_id(artifact)}"
    assert http.get(listing).json() == []
    _refused(http.get(blob), 403, "Forbidden")
    impostor = PureSigner(b"\xc2" * 32)  # a valid proof, but not of a listed validator
    _refused(http.get(blob, headers=validator_reads(blob, impostor)), 403, "Forbidden")
    _refused(http.get(blob, headers=validator_reads(listing)), 403, "Forbidden")  # a proof for another path
    stale = {READ_PROOF_HEADER: PeerProof.for_read(VALIDATOR, "validator", blob, int(time.time() * 1000) - 600_000)}
    _refused(http.get(blob, headers=stale), 403, "Forbidden")
    _refused(http.get(blob, headers={READ_PROOF_HEADER: "not-a-proof"}), 403, "Forbidden")
    unbound = PeerProof("read", VALIDATOR.public_key, "validator", blob, now_ms()).signed(VALIDATOR)  # no fresh part
    _refused(
        http.get(blob, headers={READ_PROOF_HEADER: b64encode(canonical_json(unbound.to_wire()))}), 403, "Forbidden"
    )
    seen_listing, seen_blob = validator_reads(listing), validator_reads(blob)
    assert len(http.get(listing, headers=seen_listing).json()) == 1
    assert content_id(http.get(blob, headers=seen_blob).content) == content_id(artifact)
    for path, seen in ((listing, seen_listing), (blob, seen_blob)):  # replayed by another client, at once
        with httpx.Client(base_url=str(http.base_url)) as other:
            replayed = other.get(path, headers=seen)
        _refused(replayed, 403, "Forbidden")
        assert "presented already" in replayed.json()["detail"]
    genesis = HeadId(http.get(f"{BASE}/head").json()["head_id"])
    _, next_head = head_envelope(window=1, parent=genesis)
    assert http.post(f"{BASE}/heads", content=next_head).status_code == 201  # the window closes
    assert [c["candidate_id"] for c in http.get(listing).json()] == [content_id(artifact)]
    assert content_id(http.get(blob).content) == content_id(artifact)


def test_an_admission_token_admits_a_bounded_number_of_keys(tmp_path: Path, dataset_root: Path) -> None:
    """Keys are free, tokens are not: a token binds the first key(s) that use it, and a lease names it
    as the principal, so validators can cap the weight of everything under one token."""
    edge, tokens = _admission_edge(tmp_path, dataset_root)
    store = Store(tmp_path / "edge" / "edge.sqlite3")
    pair = issue_token(store, "trainer", "two keys", 3600, max_keys=2)
    store.close()
    try:
        with httpx.Client(base_url=edge.url) as http:
            _, genesis = head_envelope()
            validator = {"authorization": f"Bearer {tokens['validator']}"}
            assert http.post(f"{BASE}/heads", content=genesis, headers=validator).status_code == 201
            first = grant_lease(http, PureSigner(b"\xd1" * 32), authorization=f"Bearer {tokens['trainer']}")
            assert first.lease.principal == token_id(tokens["trainer"])
            sybil = PureSigner(b"\xd2" * 32)
            refused = http.post(
                f"{BASE}/leases", json=proof(sybil, "lease"), headers={"authorization": f"Bearer {tokens['trainer']}"}
            )
            _refused(refused, 403, "Forbidden")
            assert "bound to other peer keys" in refused.json()["detail"]
            with _join(edge.url, sybil, "native", tokens["trainer"]) as ws, pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
            for key in (b"\xd3", b"\xd4"):
                grant_lease(http, PureSigner(key * 32), authorization=f"Bearer {pair}")
            third = http.post(
                f"{BASE}/leases",
                json=proof(PureSigner(b"\xd5" * 32), "lease"),
                headers={"authorization": f"Bearer {pair}"},
            )
            _refused(third, 403, "Forbidden")
    finally:
        edge.stop()
