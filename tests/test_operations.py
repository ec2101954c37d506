"""What hosting an edge needs from the edge itself, on a real uvicorn edge (no proxy here; through a
real nginx: tests/test_deploy.py): shard answers for a proxy (X-Accel-Redirect) with every check
still made, liveness and readiness, metrics read from the store, proxy-related settings, and the
trainer's pinning of the network manifest by a validator key."""

from __future__ import annotations

import base64
import hashlib
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from lab.stack import Fleet, free_port
from native_peer.cli import pinned_network
from protocol.hashing import content_id
from protocol.manifests import NetworkManifest
from protocol.messages import LEASE_SECRET_HEADER, LeaseGrant, Verdict
from protocol.network_pins import fingerprint
from protocol.reasons import Reason
from protocol.signing import PureSigner, b64encode
from server.serve import BackgroundEdge
from server.settings import Settings

from .support import (
    EXPERIMENT,
    VALIDATOR,
    candidate_envelope,
    edge_settings,
    grant_lease,
    head_envelope,
    metric,
    now_ms,
    proof,
    write_network,
)

BASE = f"/v1/experiments/{EXPERIMENT}"
ACCEL = "/_shards/"


@pytest.fixture
def accel_edge(tmp_path: Path, dataset_root: Path) -> Iterator[tuple[BackgroundEdge, httpx.Client]]:
    write_network(tmp_path / "network.json")
    settings = edge_settings(tmp_path, dataset_root, accel_prefix=ACCEL, public_url="https://dtn.example.org")
    with BackgroundEdge(settings) as edge, httpx.Client(base_url=edge.url, timeout=10) as http:
        yield edge, http


def _genesis_and_lease(http: httpx.Client) -> LeaseGrant:
    _, body = head_envelope()
    assert http.post(f"{BASE}/heads", content=body).status_code == 201
    return grant_lease(http, PureSigner(b"\x31" * 32))


def test_behind_a_proxy_the_edge_checks_the_lease_and_hands_the_file_to_the_proxy(
    accel_edge: tuple[BackgroundEdge, httpx.Client], dataset_root: Path
) -> None:
    _, http = accel_edge
    grant = _genesis_and_lease(http)
    shard_id = grant.lease.shard_ids[0]
    url = f"/v1/datasets/mnist/shards/{shard_id}"
    lease, secret = {"lease": grant.lease.lease_id}, {LEASE_SECRET_HEADER: grant.secret}
    on_disk = (dataset_root / "mnist/train/shards" / f"{shard_id}.safetensors").read_bytes()
    etag = f'"{content_id(on_disk)}"'
    for method in ("GET", "HEAD"):  # the fast path (AccelShards) and the route answer alike
        answer = http.request(method, url, params=lease, headers=secret)
        assert answer.status_code == 200 and answer.content == b""
        assert answer.headers["x-accel-redirect"] == f"{ACCEL}mnist/train/shards/{shard_id}.safetensors"
        assert answer.headers["etag"] == etag
        assert answer.headers["cache-control"] == "private, max-age=31536000, immutable"
    ranged = http.get(url, params=lease, headers={**secret, "range": "bytes=10-19"})
    assert ranged.headers["x-accel-redirect"] and ranged.content == b""  # the proxy cuts the range
    # conditional requests the proxy cannot judge against the content id are the edge's
    assert http.get(url, params=lease, headers={**secret, "if-none-match": etag}).status_code == 304
    matching = http.get(url, params=lease, headers={**secret, "range": "bytes=10-19", "if-range": etag})
    assert (
        matching.status_code == 206
        and matching.content == on_disk[10:20]
        and "x-accel-redirect" not in matching.headers
    )
    stale = http.get(url, params=lease, headers={**secret, "range": "bytes=10-19", "if-range": '"sha256:other"'})
    assert stale.status_code == 200 and stale.content == on_disk
    # every refusal is still the edge's, with its usual status and body, never a redirect
    outside = next(s for s in ("train-00000", "train-00001", "train-00002") if s not in grant.lease.shard_ids)
    refusals = [
        (http.get(url, headers=secret), 401),
        (http.get(url, params=lease), 401),
        (http.get(url, params=lease, headers={LEASE_SECRET_HEADER: "0" * 64}), 403),
        (http.get(url, params={"lease": "lease-forged"}, headers=secret), 403),
        (http.get(f"/v1/datasets/mnist/shards/{outside}", params=lease, headers=secret), 403),
        (http.get("/v1/datasets/mnist/shards/nope", params=lease, headers=secret), 404),
        (http.get(url, params={"lease": "x" * 81}, headers=secret), 400),
    ]
    for answer, status in refusals:
        assert answer.status_code == status and "x-accel-redirect" not in answer.headers, answer.text
        assert set(answer.json()) == {"error", "detail"}
    # a wrong secret after the right one (the lease is then remembered) is still refused
    assert (
        http.get(
            url,
            params=lease,
            headers={LEASE_SECRET_HEADER: grant.secret[:-1] + ("1" if grant.secret[-1] == "0" else "0")},
        ).status_code
        == 403
    )
    served = metric(http.get("/metrics").text, "dtn_shard_bytes_total")
    assert served == len(on_disk)  # GETs without Range only: not HEAD, ranges or 304s


def test_an_expired_lease_is_refused_on_the_fast_path_too(tmp_path: Path, dataset_root: Path) -> None:
    write_network(tmp_path / "network.json")
    settings = edge_settings(tmp_path, dataset_root, accel_prefix=ACCEL, lease_ttl_s=0.5)
    with BackgroundEdge(settings) as edge, httpx.Client(base_url=edge.url, timeout=10) as http:
        grant = _genesis_and_lease(http)
        url = f"/v1/datasets/mnist/shards/{grant.lease.shard_ids[0]}"
        request = {"params": {"lease": grant.lease.lease_id}, "headers": {LEASE_SECRET_HEADER: grant.secret}}
        assert http.get(url, **request).status_code == 200  # type: ignore[arg-type]
        time.sleep(max(0.0, (grant.lease.expires_at_ms - now_ms()) / 1000) + 0.1)
        expired = http.get(url, **request)  # type: ignore[arg-type]
        assert (expired.status_code, expired.json()["detail"]) == (403, "lease expired")


def test_liveness_readiness_and_metrics_from_the_store(accel_edge: tuple[BackgroundEdge, httpx.Client]) -> None:
    _, http = accel_edge
    assert http.get("/livez").json() == {"live": True}
    ready = http.get("/readyz")
    assert ready.status_code == 200 and ready.headers["cache-control"] == "no-store"
    body = ready.json()
    assert body["ready"] is True and body["failing"] == [] and body["windows"] == {str(EXPERIMENT): None}
    assert body["public_url"] == "https://dtn.example.org"
    assert metric(http.get("/metrics").text, "dtn_window", experiment=str(EXPERIMENT)) == -1
    grant = _genesis_and_lease(http)
    trainer = PureSigner(b"\x31" * 32)
    candidate, envelope = candidate_envelope(trainer, grant.lease.base_head, grant.lease.lease_id)
    assert http.post(f"{BASE}/candidates", content=envelope).status_code in (200, 201)
    assert metric(http.get("/metrics").text, "dtn_window_leases", experiment=str(EXPERIMENT)) == 1
    verdict = Verdict(
        EXPERIMENT, candidate.candidate_id, grant.lease.base_head, candidate.peer_id, False, Reason.FREE_RIDER,
        "no update", VALIDATOR.public_key, now_ms(),
    ).signed(VALIDATOR)  # fmt: skip
    _, next_head = head_envelope(parent=grant.lease.base_head, window=1)  # the window closes, merging nothing
    assert http.post(f"{BASE}/heads", content=next_head).status_code == 201
    assert http.post(f"{BASE}/verdicts", json=verdict.to_wire()).status_code == 201  # a quorum of 1: counted
    text = http.get("/metrics").text
    key = str(EXPERIMENT)
    assert metric(text, "dtn_window", experiment=key) == 1
    assert metric(text, "dtn_window_leases", experiment=key) == 0
    assert 0 <= metric(text, "dtn_head_age_seconds", experiment=key) < 60
    assert metric(text, "dtn_verdicts_total", experiment=key, decision="rejected") == 1
    assert metric(text, "dtn_verdicts_total", experiment=key, decision="accepted") == 0
    assert metric(text, "dtn_leases_total") == 1
    assert "dtn_ws_connections" in text and "dtn_shard_bytes_total" in text


def test_readiness_fails_while_an_experiment_has_no_dataset(tmp_path: Path, dataset_root: Path) -> None:
    write_network(tmp_path / "network.json")
    with BackgroundEdge(edge_settings(tmp_path, tmp_path / "no-datasets")) as edge:
        ready = httpx.get(f"{edge.url}/readyz")
        assert ready.status_code == 503
        assert ready.json()["ready"] is False and ready.json()["failing"] == ["dataset mnist not loaded"]
        assert httpx.get(f"{edge.url}/livez").status_code == 200


def test_proxy_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(public_url="https://dtn.example.org:8443", allowed_origins="https://other.example")
    assert settings.allowed_origins == "https://other.example,https://dtn.example.org:8443"
    assert replace(settings, port=1).allowed_origins == settings.allowed_origins  # added once
    for bad in ({"public_url": "https://host/path"}, {"public_url": "ftp://host"}, {"accel_prefix": "_shards"}):
        with pytest.raises(ValueError):
            Settings(**bad)  # type: ignore[arg-type]
    monkeypatch.setenv("DTN_ACCESS_LOG", "0")
    monkeypatch.setenv("DTN_ACCEL_PREFIX", "/_shards/")
    monkeypatch.setenv("DTN_FORWARDED_ALLOW_IPS", "127.0.0.1")
    from_env = Settings.from_args([])
    assert (from_env.access_log, from_env.accel_prefix, from_env.forwarded_allow_ips) == (
        False,
        "/_shards/",
        "127.0.0.1",
    )
    assert Settings.from_args(["--access-log"]).access_log is True
    monkeypatch.setenv("DTN_ACCESS_LOG", "maybe")
    with pytest.raises(SystemExit):
        Settings.from_args([])
    monkeypatch.delenv("DTN_ACCESS_LOG")
    with pytest.raises(SystemExit):  # refused like any bad flag: a usage error, not a traceback
        Settings.from_args(["--public-url", "https://host/sub/"])


def test_the_edge_believes_forwarded_addresses_only_from_listed_proxies(tmp_path: Path, dataset_root: Path) -> None:
    forged = {"x-forwarded-for": "203.0.113.9"}
    flood = PureSigner(b"\x41" * 32)
    for trusted, seen in (("127.0.0.1", "203.0.113.9"), ("", "127.0.0.1")):
        root = tmp_path / (trusted or "none")
        root.mkdir()
        write_network(root / "network.json")
        settings = edge_settings(root, dataset_root, address_checks_per_min=4.0)
        with BackgroundEdge(replace(settings, forwarded_allow_ips=trusted)) as edge:
            with httpx.Client(base_url=edge.url, headers=forged) as http:
                answers = [http.post(f"{BASE}/leases", json=_bad_lease_proof(flood)) for _ in range(3)]
            assert answers[-1].status_code == 429
            assert answers[-1].json()["detail"].startswith(f"{seen} is over")


def test_python_m_server_listens_on_its_unix_socket_too_and_trusts_it_as_the_proxy(
    tmp_path: Path, dataset_root: Path
) -> None:
    """``--unix-socket``: one server on host:port and the socket; X-Forwarded-For is believed from the
    socket (the proxy's way in) and not from an address outside ``forwarded_allow_ips``."""
    write_network(tmp_path / "network.json")
    settings = edge_settings(tmp_path, dataset_root)
    sock, port = tmp_path / "run" / "edge.sock", free_port()
    argv = [
        sys.executable, "-m", "server", "--port", str(port), "--data-dir", str(settings.data_dir),
        "--datasets-dir", str(dataset_root), "--network", str(settings.network), "--unix-socket", str(sock),
        "--forwarded-allow-ips", "", "--address-checks-per-min", "4", "--no-access-log",
    ]  # fmt: skip
    forged = {"x-forwarded-for": "203.0.113.9"}
    flood = PureSigner(b"\x42" * 32)
    with Fleet(tmp_path / "fleet") as fleet:
        fleet.start("edge", argv)
        fleet.wait_ready(f"http://127.0.0.1:{port}/livez")
        unix = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://edge", headers=forged)
        tcp = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=forged)
        with unix, tcp:
            assert unix.get("/livez").json() == {"live": True}
            for http, seen in ((unix, "203.0.113.9"), (tcp, "127.0.0.1")):
                answers = [http.post(f"{BASE}/leases", json=_bad_lease_proof(flood)) for _ in range(3)]
                assert answers[-1].status_code == 429
                assert answers[-1].json()["detail"].startswith(f"{seen} is over")
        fleet.stop("edge")
        fleet.start("edge", argv)  # the socket file the first one left behind is replaced
        fleet.wait_ready(f"http://127.0.0.1:{port}/livez")
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://edge") as unix:
            assert unix.get("/livez").status_code == 200


def _bad_lease_proof(signer: PureSigner) -> dict[str, object]:
    """A current lease proof whose signature does not verify: counted per address, then refused."""
    wire = proof(signer, "lease")
    wire["signature"] = b64encode(b"\x00" * 64)
    return wire


def test_a_trainer_pins_the_served_manifest_by_a_validator_key() -> None:
    ours, theirs, third = (PureSigner(bytes([n]) * 32).public_key for n in (1, 2, 3))
    network = NetworkManifest("net", (ours,), ())
    full_fingerprint = hashlib.sha256(ours).hexdigest()
    pins = [
        b64encode(ours),  # URL-safe, unpadded, as manifests write keys
        base64.b64encode(ours).decode(),  # standard base64 with padding
        fingerprint(ours),
        full_fingerprint,
        f"sha256:{full_fingerprint[:24].upper()}",
    ]
    for pin in pins:
        assert pinned_network(network, [pin], "edge") is network
    for wrong in (fingerprint(theirs), b64encode(theirs), full_fingerprint[:15], "not-a-key"):
        with pytest.raises(SystemExit, match="none is the pinned validator"):
            pinned_network(network, [wrong], "edge")
    # an edge that adds a validator of its own must not let it make heads without ours
    swapped = replace(network, validator_keys=(ours, theirs))
    with pytest.raises(SystemExit, match="without a pinned one"):
        pinned_network(swapped, [fingerprint(ours)], "edge")
    assert pinned_network(replace(swapped, quorum=2), [fingerprint(ours)], "edge")  # every head needs ours
    three = replace(network, validator_keys=(ours, theirs, third), quorum=2)
    with pytest.raises(SystemExit, match="without a pinned one"):
        pinned_network(three, [fingerprint(ours)], "edge")
    assert pinned_network(three, [fingerprint(ours), fingerprint(theirs)], "edge")
