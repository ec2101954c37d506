"""The edge against a real uvicorn server on a free port, with real files, SQLite and signatures."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.asyncio.client import ClientConnection as AsyncClientConnection
from websockets.asyncio.client import connect as async_connect
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from protocol.envelope import MAX_DESCRIPTOR_BYTES, pack_envelope
from protocol.hashing import content_id
from protocol.ids import HeadId
from protocol.manifests import FetchManifest
from protocol.messages import (
    CANDIDATE_PAGE,
    CURRENT_HEAD_HEADER,
    LEASE_SECRET_HEADER,
    NEXT_SINCE_HEADER,
    HeadDescriptor,
    Lease,
)
from protocol.signing import PureSigner, b64decode, peer_id_from_public_key
from server.portal import PEER_PAGE
from server.serve import BackgroundEdge
from server.settings import Settings
from server.state import EdgeState

from .support import (
    EXPERIMENT,
    candidate_envelope,
    edge_settings,
    experiment_spec,
    grant_lease,
    head_envelope,
    metric,
    now_ms,
    proof,
    validator_reads,
    write_network,
)

BASE = f"/v1/experiments/{EXPERIMENT}"


@pytest.fixture
def settings(tmp_path: Path, dataset_root: Path) -> Settings:
    write_network(tmp_path / "network.json")
    return edge_settings(
        tmp_path,
        dataset_root,
        max_artifact_bytes=1_000_000,
        max_frame_bytes=2_000_000,
        send_queue_size=64,
        messages_per_s=2000.0,
    )


@pytest.fixture
def edge(settings: Settings) -> Iterator[BackgroundEdge]:
    with BackgroundEdge(settings) as running:
        yield running


@pytest.fixture
def client(edge: BackgroundEdge) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=edge.url, timeout=10) as http:
        yield http


def _genesis(client: httpx.Client) -> str:
    head, body = head_envelope()
    response = client.post(f"{BASE}/heads", content=body)
    assert response.status_code == 201, response.text
    return head.head_id


def _lease(client: httpx.Client, trainer: PureSigner) -> Lease:
    return grant_lease(client, trainer).lease


_SOCKETS = ExitStack()


@pytest.fixture(autouse=True)
def _close_sockets() -> Iterator[None]:
    yield
    _SOCKETS.close()


def _connect(url: str) -> ClientConnection:
    return _SOCKETS.enter_context(connect(url.replace("http", "ws") + "/v1/relay", max_size=None, open_timeout=5))


def _join(url: str, signer: PureSigner, kind: str = "native") -> ClientConnection:
    ws = _connect(url)
    challenge = json.loads(ws.recv(timeout=5))
    ws.send(json.dumps({"type": "join", "proof": proof(signer, "join", challenge["nonce"], kind)}))
    welcome = json.loads(ws.recv(timeout=5))
    assert welcome["type"] == "welcome", welcome
    return ws


def test_health_docs_and_metrics(client: httpx.Client) -> None:
    assert client.get("/healthz").json()["ok"] is True
    assert client.get("/docs").status_code == 200
    assert (
        f"{BASE.replace(str(EXPERIMENT), '{study}/{experiment}/{revision}')}/candidates"
        in client.get("/openapi.json").text
    )
    assert "dtn_ws_connections" in client.get("/metrics").text


def test_openapi_documents_upload_bodies_and_every_refusal(client: httpx.Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    experiment = "/v1/experiments/{study}/{experiment}/{revision}"
    upload = paths[f"{experiment}/candidates"]["post"]
    assert "DTN1 envelope" in upload["requestBody"]["description"]
    assert upload["requestBody"]["content"]["application/octet-stream"]["schema"]["format"] == "binary"
    assert {"400", "401", "403", "404", "409", "413", "422", "429", "507"} <= set(upload["responses"])
    assert upload["responses"]["507"]["description"] == "QuotaExceeded"
    listing = paths[f"{experiment}/candidates"]["get"]
    assert {"400", "401", "403", "404", "429"} <= set(listing["responses"])  # a read proof presented again: 403
    for operation in (listing, paths["/v1/peers"]["get"]):
        limit = next(p for p in operation["parameters"] if p["name"] == "limit")
        assert limit["schema"]["maximum"] == 1000 and "400" in operation["responses"]
    assert upload["responses"]["413"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    lease = paths[f"{experiment}/leases"]["post"]
    assert "PeerProof" in lease["requestBody"]["description"] and "429" in lease["responses"]
    assert {"401", "403", "404"} <= set(paths["/v1/datasets/{dataset_id}/shards/{shard_id}"]["get"]["responses"])
    assert "409" in paths[f"{experiment}/heads"]["post"]["responses"]
    for path, operations in paths.items():  # every operation that takes input says how it can refuse it
        for method, operation in operations.items():
            if method != "head" and ("parameters" in operation or "requestBody" in operation):
                assert any(code.startswith("4") for code in operation["responses"]), (method, path)
                assert "422" not in operation["responses"] or "Validation Error" not in str(
                    operation["responses"]["422"]
                )


def test_framework_refusals_use_the_edges_error_shape(client: httpx.Client) -> None:
    assert client.get("/v1/nowhere").json() == {"error": "NotFound", "detail": "Not Found"}
    wrong_method = client.delete("/v1/network")
    assert (wrong_method.status_code, wrong_method.json()["error"]) == (405, "MethodNotAllowed")
    too_long = client.get(f"{BASE}/verdicts", params={"peer_id": "x" * 61})
    assert (too_long.status_code, too_long.json()["error"]) == (400, "InvalidMessage")
    assert "peer_id" in too_long.json()["detail"]


def test_shard_fetch_with_range_etag_and_lease_scope(client: httpx.Client, dataset_root: Path) -> None:
    manifest = client.get("/v1/datasets/mnist/fetch-manifest.json")
    assert manifest.status_code == 200 and manifest.headers["etag"].startswith('"sha256:')
    assert (
        client.get(
            "/v1/datasets/mnist/fetch-manifest.json", headers={"if-none-match": manifest.headers["etag"]}
        ).status_code
        == 304
    )
    _genesis(client)
    grant = grant_lease(client, PureSigner(b"\x21" * 32))
    lease = grant.lease
    assert len(lease.shard_ids) == 2
    shard_id = lease.shard_ids[0]
    url = f"/v1/datasets/mnist/shards/{shard_id}"
    client.headers[LEASE_SECRET_HEADER] = grant.secret
    assert client.get(url).status_code == 401
    outside = next(s["shard_id"] for s in manifest.json()["shards"] if s["shard_id"] not in lease.shard_ids)
    assert client.get(f"/v1/datasets/mnist/shards/{outside}", params={"lease": lease.lease_id}).status_code == 403
    assert client.get(url, params={"lease": "lease-forged"}).status_code == 403
    full = client.get(url, params={"lease": lease.lease_id})
    assert full.status_code == 200
    on_disk = (dataset_root / "mnist/train/shards" / f"{shard_id}.safetensors").read_bytes()
    assert full.content == on_disk
    assert full.headers["etag"] == f'"{content_id(on_disk)}"'
    assert "immutable" in full.headers["cache-control"]
    part = client.get(url, params={"lease": lease.lease_id}, headers={"range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == on_disk[100:200]
    assert part.headers["content-range"] == f"bytes 100-199/{len(on_disk)}"
    assert (
        client.get(url, params={"lease": lease.lease_id}, headers={"if-none-match": full.headers["etag"]}).status_code
        == 304
    )


def test_validation_split_is_never_served(client: httpx.Client) -> None:
    for path in ("/v1/datasets/mnist/shards/validation", "/v1/datasets/validation/fetch-manifest.json"):
        assert client.get(path).status_code == 404
    traversal = client.get("/v1/datasets/..%2Fmnist/fetch-manifest.json")  # "/" decoded: matches no route
    assert traversal.status_code == 404 and traversal.json() == {"error": "NotFound", "detail": "Not Found"}


MANIFEST = "/v1/datasets/mnist/fetch-manifest.json"


def _bundle(client: httpx.Client) -> dict[str, str]:
    runtime = client.get("/v1/peer-runtime")
    assert runtime.status_code == 200 and runtime.headers["cache-control"] == "no-cache"
    return dict(runtime.json()["bundle"])


def test_the_peer_bundle_is_served_by_content_and_cached_for_a_year(client: httpx.Client) -> None:
    bundle = _bundle(client)
    assert client.get("/v1/peer-runtime").json()["pyodide"] is None  # this edge has no runtime directory
    got = client.get(bundle["url"])
    assert got.status_code == 200 and content_id(got.content) == bundle["id"]
    assert bundle["url"] == f"/bundle/{bundle['id'].removeprefix('sha256:')[:32]}.zip"
    assert got.headers["cache-control"] == "public, max-age=31536000, immutable"
    stale = client.get("/bundle/" + "0" * 32 + ".zip")  # e.g. an older page's bundle
    assert stale.status_code == 404 and "/v1/peer-runtime" in stale.json()["detail"]
    assert client.get("/bundle/peer.zip").status_code == 404
    worker = client.get("/sw.js")  # the Service Worker, at the root so that its scope is the whole page
    assert worker.status_code == 200 and worker.headers["content-type"].startswith("text/javascript")
    assert worker.headers["cache-control"] == "no-cache" and "dtn-content-v1" in worker.text


def test_the_pyodide_runtime_is_served_under_its_content_id(tmp_path: Path, settings: Settings) -> None:
    runtime = tmp_path / "pyodide"
    runtime.mkdir()
    (runtime / "pyodide-lock.json").write_text('{"packages": {}}')
    (runtime / "pyodide.js").write_text("// v1")
    ids = []
    for version in ("// v1", "// v2"):
        (runtime / "pyodide.js").write_text(version)
        with (
            BackgroundEdge(replace(settings, pyodide_dir=runtime)) as edge,
            httpx.Client(base_url=edge.url) as http,
        ):
            core = http.get("/v1/peer-runtime").json()["pyodide"]
            script = http.get(f"{core['url']}pyodide.js")
            assert script.status_code == 200 and script.text == version
            assert script.headers["cache-control"] == "public, max-age=31536000, immutable"
            assert http.get("/pyodide/pyodide.js").status_code == 404  # only under the id
            assert core["files"] == {  # what the page's Service Worker checks each kept file against
                name: hashlib.sha256((runtime / name).read_bytes()).hexdigest()
                for name in ("pyodide-lock.json", "pyodide.js")
            }
            ids.append(core["id"])
    assert ids[0] != ids[1]  # changed files, a new id: browsers never keep a stale runtime


def test_conditional_get_answers_304_for_star_and_any_matching_tag(client: httpx.Client) -> None:
    for url in (f"/v1/artifacts/{_genesis(client)}", MANIFEST, _bundle(client)["url"]):
        full = client.get(url)
        etag = full.headers["etag"]
        for if_none_match in ("*", f'"other", {etag}', f'W/"other",W/{etag}'):
            cached = client.get(url, headers={"if-none-match": if_none_match})
            assert cached.status_code == 304 and cached.content == b"", (url, if_none_match)
            assert cached.headers["etag"] == etag and cached.headers["cache-control"] == full.headers["cache-control"]
        assert client.get(url, headers={"if-none-match": '"other", W/"another"'}).status_code == 200


def test_head_answers_the_headers_of_get_without_the_body(client: httpx.Client) -> None:
    artifact = f"/v1/artifacts/{_genesis(client)}"
    grant = grant_lease(client, PureSigner(b"\x22" * 32))
    client.headers[LEASE_SECRET_HEADER] = grant.secret
    shard = f"/v1/datasets/mnist/shards/{grant.lease.shard_ids[0]}?lease={grant.lease.lease_id}"
    for url in (artifact, shard, MANIFEST, _bundle(client)["url"]):
        got, head = client.get(url), client.head(url)
        assert got.status_code == head.status_code == 200 and got.content and head.content == b"", url
        assert dict(head.headers.items() - {("date", head.headers["date"])}) == dict(
            got.headers.items() - {("date", got.headers["date"])}
        )


def test_artifact_ranges_are_served_as_rfc_9110_says(client: httpx.Client) -> None:
    url = f"/v1/artifacts/{_genesis(client)}"
    body = client.get(url).content
    size = len(body)
    part = client.get(url, headers={"range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == body[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{size}"
    # unsatisfiable range-specs are dropped, overlapping ones coalesced into one part
    merged = client.get(url, headers={"range": f"bytes={size}-, 0-9, 5-14"})
    assert merged.status_code == 206 and merged.content == body[:15]
    assert merged.headers["content-range"] == f"bytes 0-14/{size}"
    two = client.get(url, headers={"range": "bytes=0-1, -2"})
    assert two.status_code == 206 and two.headers["content-type"].startswith("multipart/byteranges; boundary=")
    for unsatisfiable in (f"bytes={size}-", f"bytes={size + 5}-{size + 9}", "bytes=-0"):
        refused = client.get(url, headers={"range": unsatisfiable})
        assert refused.status_code == 416 and refused.headers["content-range"] == f"bytes */{size}", unsatisfiable
    matching = client.get(url, headers={"range": "bytes=0-1", "if-range": part.headers["etag"]})
    assert matching.status_code == 206 and matching.content == body[:2]


@pytest.mark.parametrize(
    ("method", "headers"),
    [
        ("GET", {"range": "bytes=5-2"}),  # last-pos below first-pos: an invalid range-spec (RFC 9110 §14.1.1)
        ("GET", {"range": "bytes=0-1, 5-2"}),  # one invalid range-spec makes the whole ranges-specifier invalid
        ("GET", {"range": "bytes=1"}),
        ("GET", {"range": "items=0-1"}),  # a unit the edge does not understand must be ignored (§14.2)
        ("GET", {"range": "bytes=0-1", "if-range": '"other"'}),  # If-Range names another representation
        ("GET", {"range": "bytes=0-1", "if-range": 'W/"other"'}),
        ("HEAD", {"range": "bytes=0-1"}),  # ranges are defined for GET only (§14.2)
    ],
)
def test_ignored_ranges_get_the_whole_artifact(client: httpx.Client, method: str, headers: dict[str, str]) -> None:
    url = f"/v1/artifacts/{_genesis(client)}"
    full = client.get(url)
    whole = client.request(method, url, headers=headers)
    assert whole.status_code == 200 and "content-range" not in whole.headers
    assert whole.headers["content-length"] == full.headers["content-length"]
    assert whole.content == (full.content if method == "GET" else b"")


def test_in_memory_resources_ignore_ranges(client: httpx.Client) -> None:
    for url in (MANIFEST, _bundle(client)["url"]):
        full = client.get(url)
        assert full.status_code == 200 and "accept-ranges" not in full.headers
        whole = client.get(url, headers={"range": "bytes=0-1"})
        assert whole.status_code == 200 and whole.content == full.content


def test_leases_are_distinct_and_idempotent(client: httpx.Client) -> None:
    head = _genesis(client)
    trainers = [PureSigner(bytes([i]) * 32) for i in range(40, 45)]
    leases = [_lease(client, t) for t in trainers]
    shards = [s for lease in leases for s in lease.shard_ids]
    assert len(shards) == len(set(shards)) == 10
    assert _lease(client, trainers[0]).lease_id == leases[0].lease_id
    network = client.get("/v1/network").json()
    edge_key = b64decode(network["edge_key"])
    for lease in leases:
        assert lease.base_head == head
        lease.verify(edge_key)
    listed = client.get(f"{BASE}/leases", params={"base_head": head}).json()
    assert len(listed) == 5


def _shards_held_over_windows(root: Path, dataset_root: Path, cache_bytes: int | None) -> list[set[str]]:
    """The shards two peers were leased in windows 1–6 (in window 0 nobody trained before: no homes
    yet), each declaring a shard cache of ``cache_bytes``."""
    root.mkdir(exist_ok=True)
    write_network(root / "network.json", experiment_spec(shards_per_lease=4))
    peers = [PureSigner(bytes([i]) * 32) for i in (50, 51)]
    held: list[set[str]] = [set(), set()]
    with BackgroundEdge(edge_settings(root, dataset_root)) as edge, httpx.Client(base_url=edge.url) as http:
        parent = None
        for window in range(7):
            head, body = head_envelope(parent=parent, window=window)
            assert http.post(f"{BASE}/heads", content=body).status_code == 201
            parent = head.head_id
            for peer, shards in zip(peers, held, strict=True):
                lease = grant_lease(http, peer, cache_bytes=cache_bytes).lease
                if window:
                    shards.update(lease.shard_ids)
    return held


def test_peers_keep_to_their_own_shards_from_window_to_window(
    tmp_path: Path, dataset_root: Path, train_manifest: FetchManifest
) -> None:
    """Leases with homes (``protocol.leases.Homes``): once two peers have trained a window, each one's
    leases come from its own share of the dataset, so neither is ever leased a shard the other held,
    when their shard caches cannot hold the split (or they declare none)."""
    for cache_bytes in (None, train_manifest.size_bytes - 1):
        held = _shards_held_over_windows(tmp_path / str(cache_bytes), dataset_root, cache_bytes)
        assert not held[0] & held[1]
        assert len(held[0]) >= 4 and len(held[1]) >= 4


def test_peers_that_hold_the_split_lease_across_it(tmp_path: Path, dataset_root: Path) -> None:
    """Peers whose shard caches hold the whole split keep to no home (``protocol.leases.keeps_home``):
    over a few windows both are leased shards the other was leased too."""
    held = _shards_held_over_windows(tmp_path, dataset_root, cache_bytes=1 << 40)
    assert held[0] & held[1]


def test_head_upload_requires_validator_signature(client: httpx.Client) -> None:
    _, forged = head_envelope(signer=PureSigner(b"\x66" * 32))
    response = client.post(f"{BASE}/heads", content=forged)
    assert response.status_code == 401 and response.json()["error"] == "SignatureError"
    head, body = head_envelope()
    tampered = bytearray(body)
    tampered[-5] ^= 0xFF
    assert client.post(f"{BASE}/heads", content=bytes(tampered)).status_code == 422
    assert client.get(f"{BASE}/head").status_code == 404
    assert client.post(f"{BASE}/heads", content=body).status_code == 201
    _, orphan = head_envelope(window=1, parent=None)
    assert client.post(f"{BASE}/heads", content=orphan).status_code == 409
    current = client.get(f"{BASE}/head").json()
    assert current["head_id"] == head.head_id
    artifact = client.get(f"/v1/artifacts/{head.head_id}")
    assert content_id(artifact.content) == head.head_id and artifact.headers["etag"] == f'"{head.head_id}"'


def test_candidate_upload_checks_hash_signature_and_size(client: httpx.Client) -> None:
    base = _genesis(client)
    trainer = PureSigner(b"\x31" * 32)
    candidate, body = candidate_envelope(trainer, base, _lease(client, trainer).lease_id)
    wrong_hash = pack_envelope({**candidate.to_wire()}, body[-1000:])
    response = client.post(f"{BASE}/candidates", content=wrong_hash)
    assert response.status_code == 422 and response.json()["error"] == "IntegrityError"
    forged = candidate.to_wire() | {"examples": 999_999}
    assert client.post(f"{BASE}/candidates", content=pack_envelope(forged, b"x")).status_code == 401
    assert client.post(f"{BASE}/candidates", content=b"\x00" * 2_000_000).status_code == 413
    # an artifact over what the experiment's model (the MLP, ~0.42 MB) needs, with the largest descriptor
    assert client.post(f"{BASE}/candidates", content=b"\x00" * (600_000 + MAX_DESCRIPTOR_BYTES)).status_code == 413
    assert client.post(f"{BASE}/candidates", content=b"garbage").status_code == 400
    assert client.post(f"{BASE}/candidates", content=body).status_code == 201
    assert client.post(f"{BASE}/candidates", content=body).status_code == 200
    listed = client.get(f"{BASE}/candidates", params={"base_head": base}, headers=validator_reads(f"{BASE}/candidates"))
    assert [c["candidate_id"] for c in listed.json()] == [candidate.candidate_id]


def test_ws_join_requires_signed_challenge(edge: BackgroundEdge) -> None:
    ws = _connect(edge.url)
    challenge = json.loads(ws.recv(timeout=5))
    signer = PureSigner(b"\x41" * 32)
    ws.send(json.dumps({"type": "join", "proof": proof(signer, "join", "not-the-nonce")}))
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400
    assert challenge["type"] == "challenge"


def test_oversize_frame_is_closed_with_1009(edge: BackgroundEdge) -> None:
    ws = _join(edge.url, PureSigner(b"\x42" * 32))
    ws.send(b"\x00" * 2_500_000)
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


@pytest.mark.parametrize(("inline", "frame"), [(300_000, 2_000_000), (300_000, 200_000)])
def test_the_welcome_names_the_largest_candidate_frame_the_edge_takes(
    settings: Settings, inline: int, frame: int
) -> None:
    """A browser stages a candidate over HTTP when its envelope is larger than this: the frame limit, or
    an envelope with its artifact inline (``max_inline_bytes``), whichever is less."""
    with BackgroundEdge(replace(settings, max_inline_bytes=inline, max_frame_bytes=frame)) as running:
        ws = _connect(running.url)
        challenge = json.loads(ws.recv(timeout=5))
        ws.send(json.dumps({"type": "join", "proof": proof(PureSigner(b"\x31" * 32), "join", challenge["nonce"])}))
        welcome = json.loads(ws.recv(timeout=5))
    assert welcome["max_frame_bytes"] == min(frame, inline + MAX_DESCRIPTOR_BYTES)


def test_bad_message_closes_with_4400_and_reason(edge: BackgroundEdge) -> None:
    ws = _join(edge.url, PureSigner(b"\x43" * 32))
    ws.send(json.dumps({"type": "subscribe", "experiment": EXPERIMENT, "topics": ["nope"]}))
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400
    assert "unknown topic" in closed.value.rcvd.reason


def test_fan_out_to_many_subscribers_and_ws_candidate(edge: BackgroundEdge, client: httpx.Client) -> None:
    subscribers = [_join(edge.url, PureSigner(bytes([50 + i]) * 32)) for i in range(20)]
    for ws in subscribers:
        ws.send(json.dumps({"type": "subscribe", "experiment": EXPERIMENT, "topics": ["heads", "candidates"]}))
        assert json.loads(ws.recv(timeout=5))["type"] == "subscribed"
    head = _genesis(client)
    for ws in subscribers:
        event = json.loads(ws.recv(timeout=5))
        assert event["topic"] == "heads" and event["data"]["head_id"] == head
    browser = PureSigner(b"\x77" * 32)
    ws = _join(edge.url, browser, "browser")
    ws.send(json.dumps({"type": "lease.request", "experiment": EXPERIMENT, "request_id": 7}))
    reply = json.loads(ws.recv(timeout=5))
    assert reply["type"] == "lease" and reply["request_id"] == 7
    candidate, body = candidate_envelope(browser, head, reply["lease"]["lease_id"], peer_kind="browser")
    ws.send(body)
    assert json.loads(ws.recv(timeout=5)) == {"type": "candidate.ack", "candidate_id": candidate.candidate_id}
    ws.send(body[:-10])
    assert json.loads(ws.recv(timeout=5))["status"] == 422
    for sub in subscribers:
        event = json.loads(sub.recv(timeout=5))
        assert event["topic"] == "candidates" and event["data"]["candidate_id"] == candidate.candidate_id


def test_signaling_relays_between_named_peers(edge: BackgroundEdge) -> None:
    alice, bob = PureSigner(b"\x81" * 32), PureSigner(b"\x82" * 32)
    ws_a, ws_b = _join(edge.url, alice, "browser"), _join(edge.url, bob, "browser")
    offer = {"kind": "offer", "sdp": "v=0..."}
    ws_a.send(json.dumps({"type": "signal", "to": peer_id_from_public_key(bob.public_key), "data": offer}))
    message = json.loads(ws_b.recv(timeout=5))
    assert message == {"type": "signal", "from": peer_id_from_public_key(alice.public_key), "data": offer}


def test_a_signal_to_a_peer_that_is_not_here_is_answered_with_its_id(edge: BackgroundEdge) -> None:
    ws = _join(edge.url, PureSigner(b"\x83" * 32), "browser")
    absent = peer_id_from_public_key(PureSigner(b"\x84" * 32).public_key)
    ws.send(json.dumps({"type": "signal", "to": absent, "data": {"kind": "offer", "sdp": "v=0..."}}))
    answer = json.loads(ws.recv(timeout=5))
    assert answer["type"] == "error" and answer["status"] == 404 and answer["to"] == absent


def test_holders_of_the_current_head_are_named_to_other_joined_peers(
    edge: BackgroundEdge, client: httpx.Client
) -> None:
    head_id = _genesis(client)
    alice, bob, carol = (PureSigner(bytes([seed]) * 32) for seed in (0x85, 0x86, 0x87))
    ws_a, ws_b, ws_c = (_join(edge.url, signer, "browser") for signer in (alice, bob, carol))

    def holders(ws: ClientConnection, head: str = head_id) -> list[str]:
        ws.send(json.dumps({"type": "holders", "experiment": EXPERIMENT, "head_id": head}))
        answer = json.loads(ws.recv(timeout=5))
        assert answer["type"] == "holders" and answer["head_id"] == head and answer["experiment"] == EXPERIMENT
        return list(answer["peers"])

    assert holders(ws_b) == []  # B asked first: it downloads the head from the edge
    ws_c.send(json.dumps({"type": "holders", "experiment": EXPERIMENT, "head_id": head_id}))
    assert json.loads(ws_c.recv(timeout=5))["fetching"] is True  # C waits for B to announce it
    ws_a.send(json.dumps({"type": "have", "experiment": EXPERIMENT, "head_id": head_id}))
    stale = content_id(b"not the current head")
    ws_c.send(json.dumps({"type": "have", "experiment": EXPERIMENT, "head_id": stale}))  # ignored, unanswered
    assert holders(ws_b) == [peer_id_from_public_key(alice.public_key)]
    assert holders(ws_a) == []  # never the asker itself
    assert holders(ws_b, stale) == []
    ws_a.close()  # a holder that left is named no more
    time.sleep(0.2)
    assert holders(ws_b) == []
    ws_c.send(json.dumps({"type": "have", "experiment": EXPERIMENT, "head_id": "../etc/passwd"}))
    with pytest.raises(ConnectionClosed) as closed:
        ws_c.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400


def test_the_edge_counts_the_head_bytes_it_serves(client: httpx.Client) -> None:
    head_id = _genesis(client)

    def served() -> float:
        return metric(client, "dtn_head_bytes_total")

    before = served()
    size = len(client.get(f"/v1/artifacts/{head_id}").content)
    assert served() == before + size
    client.head(f"/v1/artifacts/{head_id}")
    client.get(f"/v1/artifacts/{head_id}", headers={"if-none-match": f'"{head_id}"'})
    client.get(f"/v1/artifacts/{head_id}", headers={"range": "bytes=0-99"})
    assert served() == before + size  # HEAD, 304 and ranges: not a full head


def test_slow_consumer_is_closed_without_stalling_others(edge: BackgroundEdge, client: httpx.Client) -> None:
    _genesis(client)
    asyncio.run(_slow_consumer_scenario(edge.url.replace("http", "ws") + "/v1/relay"))


async def _slow_consumer_scenario(url: str) -> None:
    async def join(seed: bytes, **options: Any) -> AsyncClientConnection:
        ws = await async_connect(url, max_size=None, **options)
        challenge = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "join", "proof": proof(PureSigner(seed), "join", challenge["nonce"])}))
        assert json.loads(await ws.recv())["type"] == "welcome"
        return ws

    # The slow peer stops reading its socket after one unread frame (max_queue=1), with a small
    # kernel receive buffer and no compression, so unread data backs up into the edge.
    tiny = socket.socket()
    tiny.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    tiny.connect((urlsplit(url).hostname, urlsplit(url).port))
    slow = await join(b"\x91" * 32, max_queue=1, sock=tiny, compression=None)
    fast, publisher = await join(b"\x92" * 32), await join(b"\x93" * 32)
    for ws in (slow, fast):
        await ws.send(json.dumps({"type": "subscribe", "experiment": EXPERIMENT, "topics": ["metrics"]}))
        assert json.loads(await ws.recv())["type"] == "subscribed"
    blob = base64.b64encode(os.urandom(30_000)).decode()  # 400 x 40 kB incompressible = 16 MB
    for i in range(400):
        await publisher.send(json.dumps({"type": "metrics", "experiment": EXPERIMENT, "data": {"i": i, "blob": blob}}))
        assert json.loads(await asyncio.wait_for(fast.recv(), 10))["data"]["i"] == i
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(slow.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4413
    for ws in (slow, fast, publisher):
        await ws.close()


def test_restart_keeps_heads_candidates_and_leases(settings: Settings) -> None:
    trainer = PureSigner(b"\xa1" * 32)
    with BackgroundEdge(settings) as edge, httpx.Client(base_url=edge.url) as http:
        head = _genesis(http)
        grant = grant_lease(http, trainer)
        lease = grant.lease
        candidate, body = candidate_envelope(trainer, head, lease.lease_id)
        assert http.post(f"{BASE}/candidates", content=body).status_code == 201
        edge_key = http.get("/v1/network").json()["edge_key"]
    with BackgroundEdge(settings) as edge, httpx.Client(base_url=edge.url) as http:
        assert http.get(f"{BASE}/head").json()["head_id"] == head
        assert http.get(f"/v1/leases/{lease.lease_id}").json()["shard_ids"] == list(lease.shard_ids)
        listed = http.get(f"{BASE}/candidates", headers=validator_reads(f"{BASE}/candidates")).json()
        assert [c["candidate_id"] for c in listed] == [candidate.candidate_id]
        path = f"/v1/artifacts/{candidate.candidate_id}"
        assert content_id(http.get(path, headers=validator_reads(path)).content) == candidate.candidate_id
        assert http.get("/v1/network").json()["edge_key"] == edge_key
        assert grant_lease(http, trainer) == grant  # the same lease and secret after a restart
        _join(edge.url, trainer).close()


def test_leases_are_forgotten_once_their_window_is_lease_retention_windows_behind(settings: Settings) -> None:
    with BackgroundEdge(replace(settings, lease_retention_windows=8)) as edge, httpx.Client(base_url=edge.url) as http:
        parent = _genesis(http)
        lease = _lease(http, PureSigner(b"\xa2" * 32))
        for window in range(1, 9):
            assert http.get(f"/v1/leases/{lease.lease_id}").status_code == 200  # kept until 8 heads behind
            head, body = head_envelope(parent=HeadId(parent), window=window)
            assert http.post(f"{BASE}/heads", content=body).status_code == 201
            parent = head.head_id
        assert http.get(f"/v1/leases/{lease.lease_id}").status_code == 404
    for fewer in (1, 7):  # leases must outlive the windows their lapses cost priority over
        with pytest.raises(ValueError, match="lease_retention_windows"):
            replace(settings, lease_retention_windows=fewer)


def _relay_lease(ws: ClientConnection, **request: object) -> dict[str, Any]:
    ws.send(json.dumps({"type": "lease.request", "experiment": EXPERIMENT, **request}))
    return dict(json.loads(ws.recv(timeout=5)))


def _whole_window_settings(
    tmp_path: Path, dataset_root: Path, train_manifest: FetchManifest, grace_s: float
) -> Settings:
    """An edge whose one lease takes every shard of a window (a second asker is refused until it is
    free), giving back a leaver's leases ``grace_s`` after it left."""
    write_network(tmp_path / "network.json", experiment_spec(shards_per_lease=len(train_manifest.shard_ids)))
    return edge_settings(tmp_path, dataset_root, lease_release_grace_s=grace_s, messages_per_s=2000.0)


def test_a_peer_that_leaves_the_relay_gives_back_its_undelivered_leases(
    tmp_path: Path, dataset_root: Path, train_manifest: FetchManifest
) -> None:
    """A page that closes (or loses) its relay connection abandons its window: after the grace, the
    leases it took there and did not deliver are stored lapsed, signed by the edge (what validators
    read: they wait for it no longer), announced on the leases topic, free for the next asker, and
    refuse a candidate; a delivered lease stays as it was."""
    settings = _whole_window_settings(tmp_path, dataset_root, train_manifest, 0.2)
    leaver, other, delivering = (PureSigner(bytes([seed]) * 32) for seed in (0x91, 0x92, 0x93))
    with BackgroundEdge(settings) as edge, httpx.Client(base_url=edge.url, timeout=10) as http:
        head = _genesis(http)
        watcher = _join(edge.url, PureSigner(b"\x94" * 32))
        watcher.send(json.dumps({"type": "subscribe", "experiment": EXPERIMENT, "topics": ["leases"]}))
        assert json.loads(watcher.recv(timeout=5))["type"] == "subscribed"
        ws = _join(edge.url, leaver, "browser")
        held = Lease.from_wire(_relay_lease(ws, request_id=1)["lease"])
        assert sorted(held.shard_ids) == sorted(train_manifest.shard_ids)
        refused = _relay_lease(_join(edge.url, other, "browser"))
        assert refused["type"] == "error" and refused["status"] == 409  # every shard is held
        assert json.loads(watcher.recv(timeout=5))["data"]["lease_id"] == held.lease_id  # granted
        ws.close()
        event = json.loads(watcher.recv(timeout=5))["data"]
        assert event["lease_id"] == held.lease_id and event["released"] is True
        [listed] = http.get(f"{BASE}/leases", params={"base_head": head}).json()
        given_back = Lease.from_wire(listed)
        given_back.verify(b64decode(http.get("/v1/network").json()["edge_key"]))
        assert given_back.expires_at_ms <= now_ms() and given_back.shard_ids == held.shard_ids
        _, late = candidate_envelope(leaver, head, held.lease_id, peer_kind="browser")
        answer = http.post(f"{BASE}/candidates", content=late)
        assert answer.status_code == 409 and "given back" in answer.json()["detail"]
        assert metric(http, "dtn_leases_released_total") == 1
        # the shards go to the next asker, who delivers before it leaves: its lease stays
        ws = _join(edge.url, delivering, "browser")
        taken = _relay_lease(ws)["lease"]
        assert sorted(taken["shard_ids"]) == sorted(train_manifest.shard_ids)
        candidate, body = candidate_envelope(delivering, head, taken["lease_id"], peer_kind="browser")
        ws.send(body)
        assert json.loads(ws.recv(timeout=5)) == {"type": "candidate.ack", "candidate_id": candidate.candidate_id}
        ws.close()
        time.sleep(0.6)
        kept = Lease.from_wire(http.get(f"/v1/leases/{taken['lease_id']}").json())
        assert kept.expires_at_ms > now_ms()
        assert metric(http, "dtn_leases_released_total") == 1


def test_a_peer_that_joins_again_within_the_grace_keeps_its_lease(
    tmp_path: Path, dataset_root: Path, train_manifest: FetchManifest
) -> None:
    """A connection that drops and comes back (a network blip, a page moving between edges of one
    deployment) within ``lease_release_grace_s`` keeps its lease: asked again, the same one."""
    settings = _whole_window_settings(tmp_path, dataset_root, train_manifest, 0.5)
    peer = PureSigner(b"\x95" * 32)
    with BackgroundEdge(settings) as edge, httpx.Client(base_url=edge.url, timeout=10) as http:
        head = _genesis(http)
        first = _join(edge.url, peer, "browser")
        held = _relay_lease(first)["lease"]
        first.close()
        again = _join(edge.url, peer, "browser")
        time.sleep(1.0)  # past the grace
        assert _relay_lease(again)["lease"]["lease_id"] == held["lease_id"]
        _, body = candidate_envelope(peer, head, held["lease_id"], peer_kind="browser")
        assert http.post(f"{BASE}/candidates", content=body).status_code == 201
        assert metric(http, "dtn_leases_released_total") == 0


def test_long_poll_returns_when_head_changes(client: httpx.Client, edge: BackgroundEdge) -> None:
    genesis = _genesis(client)
    result: dict[str, object] = {}

    def poll() -> None:
        with httpx.Client(base_url=edge.url, timeout=20) as http:
            started = time.monotonic()
            result["head"] = http.get(f"{BASE}/head", params={"after": genesis, "wait_s": 15}).json()["head_id"]
            result["waited"] = time.monotonic() - started

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.5)
    head, body = head_envelope(window=1, parent=genesis)
    assert client.post(f"{BASE}/heads", content=body).status_code == 201
    thread.join()
    assert result["head"] == head.head_id and float(result["waited"]) < 10  # type: ignore[arg-type]


def test_a_long_poll_ends_when_its_client_leaves_and_when_the_edge_shuts_down(settings: Settings) -> None:
    """A client that closes its connection mid long-poll frees the edge's task at once (not after
    ``wait_s``), and an edge shutting down answers the long polls it holds instead of waiting them out."""
    with BackgroundEdge(settings) as edge:
        with httpx.Client(base_url=edge.url, timeout=10) as client:
            genesis = _genesis(client)
        tasks = edge._server.server_state.tasks
        host, port = edge.url.removeprefix("http://").split(":")
        leaving = socket.create_connection((host, int(port)))
        leaving.sendall(f"GET {BASE}/head?after={genesis}&wait_s=25 HTTP/1.1\r\nhost: edge\r\n\r\n".encode())
        deadline = time.monotonic() + 5
        while not tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(tasks) == 1  # the edge holds the long poll
        leaving.close()
        while tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not tasks  # ended with its client, 25 s early
        answers: list[int] = []

        def poll() -> None:
            with httpx.Client(base_url=edge.url, timeout=30) as http:
                answers.append(http.get(f"{BASE}/head", params={"after": genesis, "wait_s": 25}).status_code)

        waiting = threading.Thread(target=poll)
        waiting.start()
        while not tasks and time.monotonic() < deadline + 5:
            time.sleep(0.01)
        stopping = time.monotonic()
    stopped_s = time.monotonic() - stopping
    waiting.join(5)
    assert answers == [200] and stopped_s < 3, (answers, stopped_s)


def test_viewers_get_a_read_only_event_stream(edge: BackgroundEdge, client: httpx.Client) -> None:
    url = edge.url.replace("http", "ws") + "/v1/events"
    viewers = [_SOCKETS.enter_context(connect(url, open_timeout=5)) for _ in range(3)]
    time.sleep(0.2)
    assert client.get("/portal/snapshot").json()["peers"]["by_kind"] == {"viewer": 3}
    head = _genesis(client)
    for viewer in viewers:
        event = json.loads(viewer.recv(timeout=5))
        assert event["topic"] == "heads" and event["data"]["head_id"] == head
    viewers[0].send(json.dumps({"type": "ping"}))
    assert json.loads(viewers[0].recv(timeout=5)) == {"type": "pong"}
    viewers[1].send(json.dumps({"type": "lease.request", "experiment": EXPERIMENT}))
    with pytest.raises(ConnectionClosed) as closed:
        viewers[1].recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400
    viewers[2].close()
    for _ in range(50):  # leaving is counted: the ones gone are no longer connections
        if metric(client, "dtn_ws_connections", kind="viewer") == 1:
            break
        time.sleep(0.1)
    assert metric(client, "dtn_ws_connections", kind="viewer") == 1
    assert client.get("/portal/snapshot").json()["peers"]["by_kind"] == {"viewer": 1}


def test_candidates_are_followed_with_a_cursor(client: httpx.Client) -> None:
    """A follower reads each candidate once: ``since=<cursor>`` pages and ``dtn-next-since``; a reader
    who is no validator stops before the open window's first candidate."""
    genesis = _genesis(client)
    path = f"{BASE}/candidates"
    first, body = candidate_envelope(
        PureSigner(b"\xe1" * 32), genesis, _lease(client, PureSigner(b"\xe1" * 32)).lease_id
    )
    assert client.post(path, content=body).status_code == 201
    page = client.get(path, params={"since": 0}, headers=validator_reads(path))
    assert [c["candidate_id"] for c in page.json()] == [first.candidate_id]
    assert page.headers[CURRENT_HEAD_HEADER] == genesis  # the head as the page was read
    cursor = int(page.headers[NEXT_SINCE_HEADER])
    again = client.get(path, params={"since": cursor}, headers=validator_reads(path))
    assert again.json() == [] and int(again.headers[NEXT_SINCE_HEADER]) == cursor
    public = client.get(path, params={"since": 0})
    assert public.json() == [] and public.headers[NEXT_SINCE_HEADER] == "0"  # the window is open
    _, next_head = head_envelope(window=1, parent=genesis)
    assert client.post(f"{BASE}/heads", content=next_head).status_code == 201
    public = client.get(path, params={"since": 0})
    assert [c["candidate_id"] for c in public.json()] == [first.candidate_id]
    assert int(public.headers[NEXT_SINCE_HEADER]) == cursor
    assert public.headers[CURRENT_HEAD_HEADER] == HeadDescriptor.from_wire(client.get(f"{BASE}/head").json()).head_id


def test_lists_answer_bounded_pages_with_a_cursor(client: httpx.Client) -> None:
    """Candidates and known peers come a page at a time (``limit``, capped; a cursor to go on from), and
    a limit over the cap is refused: however many peers and candidates there are, no answer grows."""
    genesis = _genesis(client)
    path = f"{BASE}/candidates"
    trainers = [PureSigner(bytes([0xE2 + i]) * 32) for i in range(3)]
    uploaded = []
    for seed, trainer in enumerate(trainers):
        candidate, body = candidate_envelope(trainer, genesis, _lease(client, trainer).lease_id, seed=seed)
        assert client.post(path, content=body).status_code == 201
        uploaded.append(candidate.candidate_id)
    seen, cursor = [], 0
    while page := client.get(path, params={"since": cursor, "limit": 2}, headers=validator_reads(path)):
        assert len(page.json()) <= 2
        if not page.json():
            break
        seen += [c["candidate_id"] for c in page.json()]
        cursor = int(page.headers[NEXT_SINCE_HEADER])
    assert seen == uploaded
    assert client.get(path, params={"limit": CANDIDATE_PAGE + 1}).status_code == 400
    known, after = [], ""
    while True:
        directory = client.get("/v1/peers", params={"limit": 2, "cursor": after}).json()
        assert len(directory["known"]) <= 2
        known += [p["peer_id"] for p in directory["known"]]
        if directory["next"] is None:
            break
        after = directory["next"]
    assert known == sorted(str(peer_id_from_public_key(t.public_key)) for t in trainers)
    assert client.get("/v1/peers", params={"limit": PEER_PAGE + 1}).status_code == 400


def test_the_edge_closes_its_store_only_after_the_work_it_gave_worker_threads(
    tmp_path: Path, dataset_root: Path
) -> None:
    """A background task cancelled at shutdown (the follower's import, the relay's revocation sweep)
    leaves its store call running in a worker thread: ``EdgeState.close`` waits for it before it closes
    the store (SQLite closed under a running statement can crash the process)."""
    write_network(tmp_path / "network.json")

    async def shut_down_mid_call() -> list[object]:
        state = EdgeState.open(edge_settings(tmp_path, dataset_root))
        await state.start()
        finished: list[object] = []

        def slow_read() -> None:
            time.sleep(0.3)
            finished.append(state.store.current_head(EXPERIMENT))  # the store is still open

        caller = asyncio.ensure_future(state.offload(slow_read))
        await asyncio.sleep(0.05)
        caller.cancel()
        await state.close()
        return finished

    assert asyncio.run(shut_down_mid_call()) == [None]
