"""Run control at a real edge (issue #24 item 3): a real uvicorn edge on a 2-of-3 network with SQLite,
real Ed25519 signatures. The route refuses every order that is not a quorum's, or not the next one,
with its status and reason; an applied order is kept across an edge restart and published; a paused
or stopped experiment leases nothing (409 with ``Retry-After``, what trainers wait on), a resumed one
leases again."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from lab.demo import CHROMIUM, CHROMIUM_FLAGS
from native_peer.cli import main as dtn
from protocol.manifests import NetworkManifest
from protocol.messages import Attestation
from protocol.network_pins import fingerprint
from protocol.run_control import RunControl, SignedRunControl
from protocol.signing import PureSigner
from server.control_routes import MAX_CONTROL_BYTES
from server.leasing import HALTED_RETRY_S
from server.serve import BackgroundEdge
from server.settings import Settings

from .support import EXPERIMENT, edge_settings, experiment_spec, head_envelope, missing, proof

A, B, C = (PureSigner(bytes([n]) * 32) for n in (61, 62, 63))
TRAINER = PureSigner(b"\x64" * 32)
BASE = f"/v1/experiments/{EXPERIMENT}"


def _network(path: Path) -> None:
    network = NetworkManifest("control-net", (A.public_key, B.public_key, C.public_key), (experiment_spec(),), quorum=2)
    path.write_text(json.dumps(network.to_wire()))


@pytest.fixture
def settings(tmp_path: Path, dataset_root: Path) -> Settings:
    _network(tmp_path / "network.json")
    return edge_settings(tmp_path, dataset_root)


@contextmanager
def _edge(settings: Settings) -> Iterator[httpx.Client]:
    with BackgroundEdge(settings) as edge, httpx.Client(base_url=edge.url, timeout=10) as client:
        yield client


@pytest.fixture
def http(settings: Settings) -> Iterator[httpx.Client]:
    with _edge(settings) as client:
        head, body = head_envelope(signer=A)  # the genesis, canonical once B attests it too
        assert client.post(f"{BASE}/heads", content=body).status_code == 202
        attestation = Attestation.of(head, (), B, 1)
        assert client.post(f"{BASE}/attestations", json=attestation.to_wire()).status_code == 201
        yield client


def _order(action: str, sequence: int, target: str | None = None, network: str = "control-net") -> RunControl:
    return RunControl(network, EXPERIMENT, action, sequence=sequence, issued_at_ms=1_000 + sequence, target=target)


def _submit(http: httpx.Client, signed: SignedRunControl | object) -> httpx.Response:
    body = signed.to_wire() if isinstance(signed, SignedRunControl) else signed
    return http.post(f"{BASE}/control", json=body)


def _lease(http: httpx.Client) -> httpx.Response:
    return http.post(f"{BASE}/leases", json=proof(TRAINER, "lease"))


def _refused(response: httpx.Response, status: int, error: str, reason: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"] == error
    assert reason in response.json()["detail"]


def test_orders_that_are_not_a_quorums_or_not_the_next_are_refused_with_their_reason(http: httpx.Client) -> None:
    pause = _order("pause", 1)
    _refused(_submit(http, SignedRunControl.of(pause, [A])), 401, "SignatureError", "signed by 1 validator")
    _refused(_submit(http, SignedRunControl.of(pause, [A, A])), 401, "SignatureError", "it needs 2")
    other = _order("pause", 1, network="another-net")
    _refused(_submit(http, SignedRunControl.of(other, [A, B])), 401, "SignatureError", "not 'control-net'")
    _refused(_submit(http, {"order": pause.body()}), 400, "InvalidMessage", "signatures")
    _refused(_submit(http, {**SignedRunControl.of(pause, [A, B]).to_wire(), "order": {}}), 400, "InvalidMessage", "")
    oversize = http.post(f"{BASE}/control", content=b" " * (MAX_CONTROL_BYTES + 1))
    _refused(oversize, 413, "TooLarge", "exceeds")
    unknown = http.post(
        "/v1/experiments/study/nothing/rev-1/control", json=SignedRunControl.of(pause, [A, B]).to_wire()
    )
    _refused(unknown, 404, "NotFound", "no experiment")
    assert http.get(f"{BASE}/control").json() == {
        "state": {"sequence": 0, "paused": False, "stopped": False},
        "orders": [],
    }

    rollback = _order("rollback", 1, target="sha256:" + "0" * 64)
    _refused(_submit(http, SignedRunControl.of(rollback, [A, B])), 404, "NotFound", "no canonical head")
    current = http.get(f"{BASE}/head").json()["head_id"]
    rollback = _order("rollback", 1, target=current)
    _refused(_submit(http, SignedRunControl.of(rollback, [A, B])), 409, "Conflict", "roll back a paused experiment")
    assert _submit(http, SignedRunControl.of(pause, [A, C])).status_code == 201
    _refused(_submit(http, SignedRunControl.of(pause, [A, B])), 409, "Conflict", "sequence 1 was already used")
    assert _submit(http, SignedRunControl.of(_order("stop", 2), [B, C])).status_code == 201
    _refused(_submit(http, SignedRunControl.of(_order("resume", 3), [A, B])), 409, "Conflict", "is stopped")
    state = http.get(f"{BASE}/control").json()
    assert state["state"] == {"sequence": 2, "paused": True, "stopped": True}
    assert [o["order"]["action"] for o in state["orders"]] == ["pause", "stop"]


def test_a_paused_experiment_leases_nothing_and_its_order_is_published(settings: Settings, http: httpx.Client) -> None:
    assert _lease(http).status_code == 200
    with connect(f"{str(http.base_url).replace('http', 'ws', 1)}/v1/events") as events:
        applied = _submit(http, SignedRunControl.of(_order("pause", 1), [B, C]))
        assert applied.status_code == 201, applied.text
        assert applied.json()["state"]["paused"] is True
        event = json.loads(events.recv(timeout=5))
        while event.get("topic") != "control":
            event = json.loads(events.recv(timeout=5))
        assert event["data"]["order"]["action"] == "pause"
        assert event["data"]["signers"] == sorted(fingerprint(s.public_key) for s in (B, C))
    refused = _lease(http)
    _refused(refused, 409, "Halted", "paused by run control")
    assert refused.headers["retry-after"] == str(HALTED_RETRY_S)


def test_an_applied_order_outlives_an_edge_restart(settings: Settings) -> None:
    with _edge(settings) as http:
        head, body = head_envelope(signer=A)
        assert http.post(f"{BASE}/heads", content=body).status_code == 202
        assert http.post(f"{BASE}/attestations", json=Attestation.of(head, (), C, 1).to_wire()).status_code == 201
        assert _submit(http, SignedRunControl.of(_order("pause", 1), [A, B])).status_code == 201
    with _edge(settings) as restarted:
        _refused(_lease(restarted), 409, "Halted", "paused by run control")
        resumed = _submit(restarted, SignedRunControl.of(_order("resume", 2), [A, B]))
        assert resumed.status_code == 201, resumed.text
        assert _lease(restarted).status_code == 200


def test_the_cli_writes_signs_offline_and_submits_an_order(
    settings: Settings, http: httpx.Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, seed in (("a", 61), ("b", 62), ("outsider", 99)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "identity.key").write_bytes(bytes([seed]) * 32)
    network, url, order = str(settings.network), str(http.base_url), tmp_path / "order.json"
    control = ["control", "new", str(order), "--network", network, "--experiment", str(EXPERIMENT)]
    dtn([*control, "--action", "pause", "--edge", url])
    assert "as order 1 of network control-net, unsigned" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="is not a validator of this network"):
        dtn(["control", "sign", str(order), "--network", network, "--storage", str(tmp_path / "outsider")])
    copy = tmp_path / "copy.json"
    copy.write_bytes(order.read_bytes())
    dtn(["control", "sign", str(order), "--network", network, "--storage", str(tmp_path / "a")])
    with pytest.raises(SystemExit, match="not every edge holds it"):
        dtn(["control", "submit", str(order), "--edge", url])
    assert "refused (401 SignatureError): run control 'pause' is signed by 1 validator" in capsys.readouterr().out
    dtn(["control", "sign", str(copy), "--network", network, "--storage", str(tmp_path / "b")])
    dtn(["control", "submit", str(order), str(copy), "--edge", f"{url},{url}"])  # each copy carries one signature
    submitted = capsys.readouterr().out
    assert "applied; the experiment is now" in submitted and "already applied this one" in submitted
    _refused(_lease(http), 409, "Halted", "paused by run control")
    dtn(["control", "show", "--network", network, "--experiment", str(EXPERIMENT), "--edge", url])
    shown = capsys.readouterr().out
    assert "1: pause issued" in shown and f"{EXPERIMENT}: paused by run control (last order 1)" in shown
    dtn([*control, "--action", "resume", "--edge", url])
    assert "as order 2" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="other-exp"):
        dtn(
            [
                "control",
                "new",
                str(order),
                "--network",
                network,
                "--experiment",
                "study/other-exp/rev-1",
                "--action",
                "stop",
                "--sequence",
                "3",
            ]
        )


@pytest.mark.slow
def test_the_viewer_shows_an_order_in_its_timeline_and_the_experiment_paused(
    http: httpx.Client, tmp_path: Path
) -> None:
    """Real Chromium renders the viewer page (``static/app.js``) once the order is in the store: the
    timeline names the action and the fingerprints of the validators who signed it."""
    if not CHROMIUM.exists():
        missing(f"no Chromium at {CHROMIUM}")
    assert _submit(http, SignedRunControl.of(_order("pause", 1), [A, C])).status_code == 201
    page = subprocess.run(
        [
            str(CHROMIUM),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'chromium'}",
            "--virtual-time-budget=20000",
            "--dump-dom",
            f"{http.base_url}#viewer",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    signers = ", ".join(sorted(fingerprint(s.public_key) for s in (A, C)))
    assert f"run control: pause (order 1), signed by validators {signers}" in page
    assert "paused by its validators" in page
