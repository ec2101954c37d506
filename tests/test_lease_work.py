"""A proof of work per lease, set per experiment (issue #27 item 2; ``protocol.lease_work``): the rule,
a real uvicorn edge refusing leases without it over HTTP and the relay with their reasons, and a native
trainer and the browser peer's Python paying it as they lease."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from browser_peer.peer import BrowserPeer, PeerConfig
from lab.browser_host import NativeBridge
from lab.stack import prepare_network, validating
from native_peer.edge_client import EdgeClient
from native_peer.trainer import WindowOutcome
from protocol.errors import InvalidMessage
from protocol.lease_work import MAX_LEASE_WORK_BITS, lease_work, lease_work_done, solve_lease_work, work_challenge
from protocol.manifests import ExperimentSpec, NetworkManifest
from protocol.messages import HeadDescriptor, LeaseGrant
from protocol.signing import PureSigner, peer_id_from_public_key
from protocol.window import NoWindow
from server.serve import BackgroundEdge
from tools.networks import BASELINE, mnist_network

from .support import (
    EXPERIMENT,
    edge_settings,
    experiment_spec,
    head_envelope,
    mnist_trainer,
    proof,
    until,
    write_network,
)

BITS = 12  # about 4,000 hashes a lease: milliseconds, and a 1-in-4,096 chance that a nonce passes by luck
BASE = f"/v1/experiments/{EXPERIMENT}"
TRAINER = PureSigner(b"\x41" * 32)
ME = peer_id_from_public_key(TRAINER.public_key)


def test_work_is_bound_to_the_peer_and_the_head_and_costs_about_two_to_the_bits() -> None:
    challenge = work_challenge(str(EXPERIMENT), ME, "sha256:" + "a" * 64)
    nonces = [solve_lease_work(challenge, BITS, start) for start in (0, 10**6, 2 * 10**6, 3 * 10**6)]
    assert all(lease_work_done(challenge, n, BITS) for n in nonces)
    tries = sum(n - start for n, start in zip(nonces, (0, 10**6, 2 * 10**6, 3 * 10**6), strict=True)) / 4
    assert 2**BITS / 20 < tries < 2**BITS * 20  # a geometric draw of mean 2^bits
    other_peer = work_challenge(str(EXPERIMENT), peer_id_from_public_key(b"\x42" * 32), "sha256:" + "a" * 64)
    other_head = work_challenge(str(EXPERIMENT), ME, "sha256:" + "b" * 64)
    assert sum(lease_work_done(c, n, BITS) for c in (other_peer, other_head) for n in nonces) <= 1
    assert not lease_work_done(challenge, -1, 0) and lease_work_done(challenge, 5, 0)
    assert lease_work(0, str(EXPERIMENT), ME, "h") is None
    with pytest.raises(InvalidMessage, match="lease_work_bits"):
        experiment_spec(lease_work_bits=MAX_LEASE_WORK_BITS + 1)
    wire = experiment_spec(lease_work_bits=BITS).to_wire()
    assert ExperimentSpec.from_wire(wire).lease_work_bits == BITS
    assert ExperimentSpec.from_wire({k: v for k, v in wire.items() if k != "lease_work_bits"}).lease_work_bits == 0


@pytest.fixture
def edge(tmp_path: Path, dataset_root: Path) -> Iterator[tuple[BackgroundEdge, list[HeadDescriptor]]]:
    """A real edge whose experiment asks for ``BITS`` of work a lease, with two heads."""
    write_network(tmp_path / "network.json", experiment_spec(lease_work_bits=BITS))
    with (
        BackgroundEdge(edge_settings(tmp_path, dataset_root)) as started,
        httpx.Client(base_url=started.url, timeout=10) as http,
    ):
        genesis, body = head_envelope()
        assert http.post(f"{BASE}/heads", content=body).status_code == 201
        yield started, [genesis]


def _lease(url: str, work: int | None, after: str | None = None) -> httpx.Response:
    params: dict[str, object] = {} if work is None else {"work": work}
    if after is not None:
        params["after"] = after
    return httpx.post(f"{url}{BASE}/leases", json=proof(TRAINER, "lease"), params=params, timeout=10)


def test_the_edge_leases_only_against_work_on_the_current_head_or_its_parent(
    edge: tuple[BackgroundEdge, list[HeadDescriptor]],
) -> None:
    server, (genesis,) = edge
    missing = _lease(server.url, None)
    assert missing.status_code == 403 and f"proof of work of {BITS} bits" in missing.json()["detail"]
    elsewhere = lease_work(BITS, str(EXPERIMENT), ME, "sha256:" + "c" * 64)  # on a head that is none of these
    stale = _lease(server.url, elsewhere)
    assert stale.status_code == 409 and "do it again on the current head" in stale.json()["detail"], stale.text
    someone_else = lease_work(BITS, str(EXPERIMENT), peer_id_from_public_key(b"\x42" * 32), genesis.head_id)
    assert _lease(server.url, someone_else).status_code == 409
    on_genesis = lease_work(BITS, str(EXPERIMENT), ME, genesis.head_id)
    granted = _lease(server.url, on_genesis)
    assert granted.status_code == 200, granted.text
    assert LeaseGrant.from_wire(granted.json()).lease.base_head == genesis.head_id
    child, body = head_envelope(parent=genesis.head_id, window=1)
    assert httpx.post(f"{server.url}{BASE}/heads", content=body, timeout=10).status_code == 201
    crossed = _lease(server.url, on_genesis, after=genesis.head_id)  # asked as the next head came: still good
    assert crossed.status_code == 200 and LeaseGrant.from_wire(crossed.json()).lease.base_head == child.head_id
    _, body = head_envelope(parent=child.head_id, window=2)
    assert httpx.post(f"{server.url}{BASE}/heads", content=body, timeout=10).status_code == 201
    assert _lease(server.url, on_genesis).status_code == 409  # two heads on: done again, on the current one


def test_the_relay_leases_only_against_work(edge: tuple[BackgroundEdge, list[HeadDescriptor]]) -> None:
    server, (genesis,) = edge
    browser = PureSigner(b"\x77" * 32)
    with connect(server.url.replace("http", "ws") + "/v1/relay", open_timeout=5) as ws:
        challenge = json.loads(ws.recv(timeout=5))
        ws.send(json.dumps({"type": "join", "proof": proof(browser, "join", challenge["nonce"], "browser")}))
        assert json.loads(ws.recv(timeout=5))["type"] == "welcome"
        ws.send(json.dumps({"type": "lease.request", "experiment": EXPERIMENT, "request_id": 1}))
        refused = json.loads(ws.recv(timeout=5))
        assert refused["status"] == 403 and "proof of work" in refused["detail"], refused
        work = lease_work(BITS, str(EXPERIMENT), peer_id_from_public_key(browser.public_key), genesis.head_id)
        ws.send(json.dumps({"type": "lease.request", "experiment": EXPERIMENT, "request_id": 2, "work": work}))
        granted = json.loads(ws.recv(timeout=5))
        assert granted["type"] == "lease" and granted["request_id"] == 2, granted


def _worked(validator_key: bytes) -> NetworkManifest:
    """The demo's network, its baseline asking ``BITS`` of work a lease."""
    network = mnist_network(validator_key)
    return replace(network, experiments=(replace(network.experiment(BASELINE), lease_work_bits=BITS),))


@pytest.mark.slow  # a native trainer and the browser peer's Python each train two windows: about 20 s
def test_trainers_pay_the_work_as_they_lease_and_their_windows_are_merged(tmp_path: Path, dataset_root: Path) -> None:
    stack = prepare_network(tmp_path, datasets=dataset_root, network=_worked)
    with (
        BackgroundEdge(stack.edge_settings(pyodide_dir=tmp_path / "no-pyodide")) as edge,
        validating(stack, edge.url, [stack.network.experiment(BASELINE)]),
    ):
        native = mnist_trainer(stack.network, tmp_path / "native", edge.url, continuous=True)
        experiment = native.experiment(*BASELINE.parts)

        def next_window() -> WindowOutcome | None:  # once the validator promoted the head it trains on
            try:
                return native.train_window_once(experiment)
            except NoWindow:
                return None

        outcomes = [until("a window on a new head", next_window, 60) for _ in range(2)]  # the second leased ahead
        native.close()
        bridge = NativeBridge()
        browser = BrowserPeer(bridge, PeerConfig(edge.url, BASELINE, b"\x48" * 32, max_windows=2))

        async def contribute() -> None:
            await asyncio.wait_for(browser.run(), 120)
            await bridge.aclose()

        asyncio.run(contribute())
        client = EdgeClient(edge.url)
        try:
            merged = until(
                "both peers' candidates merged",
                lambda: (
                    (ids := {c for h in client.heads(BASELINE) for c in h.merged}) >= {outcomes[0].candidate_id}
                    and any(c.peer_id == browser.peer_id and c.candidate_id in ids for c in client.candidates(BASELINE))
                ),
                60,
            )
        finally:
            client.close()
    assert merged and browser.status["windows_done"] == 2, browser.status
