"""The edge as a public web server, against a real uvicorn edge: security headers on every response,
WebSocket handshakes only from allowed browser origins, an aborted upload costs one log line, and
honest trainers at the demo's fastest window rate are never rate limited."""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from protocol.codec import encode_tensors
from protocol.envelope import pack_envelope
from protocol.ids import ExperimentKey, HeadId
from protocol.messages import Candidate, LeaseGrant
from protocol.model import init_params
from protocol.signing import PureSigner
from server.serve import BackgroundEdge

from .support import EXPERIMENT, SPEC, edge_settings, experiment_spec, head_envelope, now_ms, proof, write_network

REPO = Path(__file__).resolve().parent.parent
SECOND = ExperimentKey.parse("study/mnist-low-lr/rev-1")
# The demo's shortest windows (0.46 s on 2 cores); its native trainers train both experiments.
DEMO_FASTEST_WINDOW_S = 0.4


def _start(tmp_path: Path, dataset_root: Path, **settings: object) -> BackgroundEdge:
    tmp_path.mkdir(exist_ok=True)
    write_network(tmp_path / "network.json", experiment_spec(), experiment_spec(SECOND))
    return BackgroundEdge(edge_settings(tmp_path, dataset_root, **settings)).start()


@pytest.fixture
def edge(tmp_path: Path, dataset_root: Path) -> Iterator[BackgroundEdge]:
    running = _start(tmp_path, dataset_root)
    try:
        yield running
    finally:
        running.stop()


def _policy(response: httpx.Response) -> dict[str, set[str]]:
    directives = (d.split() for d in response.headers["content-security-policy"].split(";") if d.strip())
    return {name: set(values) for name, *values in directives}


def test_every_response_carries_security_headers(edge: BackgroundEdge) -> None:
    with httpx.Client(base_url=edge.url) as http:
        responses = [
            http.get(path)
            for path in ("/", "/static/app.js", "/static/worker.js", "/healthz", "/v1/network", "/metrics", "/nope")
        ]
        responses.append(http.post(f"/v1/experiments/{EXPERIMENT}/leases", content=b"not json"))
        for response in responses:
            assert response.headers["x-content-type-options"] == "nosniff", response.url
            assert response.headers["referrer-policy"] == "no-referrer", response.url
            policy = _policy(response)
            assert policy["default-src"] == policy["connect-src"] == {"'self'"}, response.url
            # Pyodide compiles WebAssembly; nothing may run from strings or inline
            assert policy["script-src"] == {"'self'", "'wasm-unsafe-eval'"}, response.url
            assert policy["frame-ancestors"] == policy["object-src"] == policy["base-uri"] == {"'none'"}
        assert [r.status_code for r in responses] == [200, 200, 200, 200, 200, 200, 404, 400]
        # the interactive docs load Swagger UI from a CDN: still never framed, no plugins, no <base>
        docs = _policy(http.get("/docs"))
        assert docs == {"frame-ancestors": {"'none'"}, "object-src": {"'none'"}, "base-uri": {"'none'"}}


def test_a_page_may_reach_its_edges_mirrors_at_their_livez_only(tmp_path: Path, dataset_root: Path) -> None:
    """An edge with mirrors lets its page probe each mirror's ``/livez`` (``static/app.js`` moves the page to
    one that answers when this edge is gone), and connect nowhere else there."""
    mirrors = "https://b.example:8443,https://c.example/dtn"
    running = _start(tmp_path, dataset_root, mirrors=mirrors)
    try:
        policy = _policy(httpx.get(running.url + "/"))
    finally:
        running.stop()
    assert policy["connect-src"] == {"'self'", "https://b.example:8443/livez", "https://c.example/dtn/livez"}
    assert policy["default-src"] == {"'self'"}


def test_the_page_needs_nothing_inline() -> None:
    """What the policy forbids, the web app does not do: inline scripts, styles or event handlers."""
    page = (REPO / "static" / "index.html").read_text()
    assert re.findall(r"<script\b[^>]*>", page) == ['<script src="/static/app.js" type="module">']
    for text in [page, *(path.read_text() for path in (REPO / "static").glob("*.js"))]:
        assert re.search(r"<style\b|\sstyle=|\son[a-z]+=[\"']|javascript:", text) is None


def _ws_url(edge: BackgroundEdge, path: str) -> str:
    return edge.url.replace("http", "ws", 1) + path


def _opens(edge: BackgroundEdge, path: str, origin: str | None) -> bool:
    headers = {} if origin is None else {"origin": origin}
    with connect(_ws_url(edge, path), additional_headers=headers, open_timeout=5) as ws:
        if path == "/v1/relay":
            return bool(json.loads(ws.recv(timeout=5))["type"] == "challenge")
        ws.send('{"type":"ping"}')
        return bool(json.loads(ws.recv(timeout=5))["type"] == "pong")


@pytest.mark.parametrize("path", ["/v1/relay", "/v1/events"])
def test_websockets_refuse_foreign_browser_origins(edge: BackgroundEdge, path: str) -> None:
    assert _opens(edge, path, None)  # native clients send no Origin
    assert _opens(edge, path, edge.url)  # the edge's own page (Playwright loads it from this URL too)
    for origin in ("https://evil.example", f"http://evil.example:{edge.settings.port}", "null"):
        with pytest.raises(InvalidStatus) as refused:
            _opens(edge, path, origin)
        response = refused.value.response
        assert response.status_code == 403
        assert response.headers["x-content-type-options"] == "nosniff"
        body = json.loads(response.body or b"{}")
        assert body["error"] == "Forbidden" and origin in body["detail"] and "allowed_origins" in body["detail"]


def test_allowed_origins_are_configurable(tmp_path: Path, dataset_root: Path) -> None:
    listed = _start(tmp_path / "listed", dataset_root, allowed_origins="https://app.example, https://b.example/")
    try:
        assert _opens(listed, "/v1/events", "https://app.example")
        assert _opens(listed, "/v1/relay", "https://b.example")
        assert _opens(listed, "/v1/relay", listed.url)  # still same-origin
        with pytest.raises(InvalidStatus):
            _opens(listed, "/v1/relay", "https://c.example")
    finally:
        listed.stop()
    anyone = _start(tmp_path / "anyone", dataset_root, allowed_origins="*")
    try:
        assert _opens(anyone, "/v1/relay", "https://c.example")
    finally:
        anyone.stop()


def test_an_aborted_upload_logs_one_line_and_the_edge_carries_on(
    edge: BackgroundEdge, caplog: pytest.LogCaptureFixture
) -> None:
    uvicorn_log = logging.getLogger("uvicorn")  # uvicorn's own logging config does not propagate to root
    uvicorn_log.addHandler(caplog.handler)
    caplog.set_level(logging.INFO)
    path = f"/v1/experiments/{EXPERIMENT}/candidates"
    try:
        with socket.create_connection((edge.settings.host, edge.settings.port)) as client:
            client.sendall(
                f"POST {path} HTTP/1.1\r\nhost: {edge.settings.host}\r\ncontent-length: 1000000\r\n\r\n".encode()
                + b"x" * 10_000
            )
            time.sleep(0.2)
        deadline = time.monotonic() + 10
        while not any(path in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(f"{edge.url}/healthz").status_code == 200
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    assert len([r for r in caplog.records if path in r.getMessage()]) == 1, [r.getMessage() for r in caplog.records]
    assert [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []


@pytest.mark.slow
def test_honest_trainers_at_the_demos_fastest_window_rate_are_never_rate_limited(edge: BackgroundEdge) -> None:
    """A trainer of both experiments leases and uploads once per window of each, windows closing every
    ``DEMO_FASTEST_WINDOW_S``, for longer than any burst allowance lasts: no request is refused."""
    trainer = PureSigner(b"\x51" * 32)
    heads: dict[ExperimentKey, HeadId | None] = {EXPERIMENT: None, SECOND: None}
    statuses: list[int] = []
    windows = int(15 / DEMO_FASTEST_WINDOW_S)
    with httpx.Client(base_url=edge.url) as http:
        tick = time.monotonic()
        for window in range(windows):
            for i, key in enumerate(heads):  # the validator closes the window: a new head
                params = init_params(SPEC, 4 * window + i)
                head, envelope = head_envelope(params, parent=heads[key], window=window, experiment=key)
                assert http.post(f"/v1/experiments/{key}/heads", content=envelope).status_code == 201
                heads[key] = head.head_id
            for i, key in enumerate(heads):  # the trainer: one lease and one candidate per window of each
                leased = http.post(f"/v1/experiments/{key}/leases", json=proof(trainer, "lease"))
                statuses.append(leased.status_code)
                if leased.status_code == 200:
                    lease = LeaseGrant.from_wire(leased.json()).lease
                    artifact = encode_tensors(init_params(SPEC, 4 * window + 2 + i))
                    candidate = Candidate.for_lease(
                        lease,
                        lease.base_head,
                        artifact,
                        trainer,
                        peer_kind="native",
                        examples=64,
                        steps=1,
                        created_at_ms=now_ms(),
                    )
                    uploaded = http.post(
                        f"/v1/experiments/{key}/candidates", content=pack_envelope(candidate.to_wire(), artifact)
                    )
                    statuses.append(uploaded.status_code)
            tick += DEMO_FASTEST_WINDOW_S
            time.sleep(max(0.0, tick - time.monotonic()))
    assert statuses.count(429) == 0, f"{statuses.count(429)} of {len(statuses)} honest requests were throttled"
    assert set(statuses) == {200, 201} and len(statuses) == 4 * windows


def test_the_access_log_never_holds_an_admission_token(
    tmp_path: Path, dataset_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A token in a URL (an old link's ``/?token=``; the page reads it from the fragment, which no
    browser sends) is written ``[hidden]`` in uvicorn's access log, which stays on."""
    token = "dtn_" + "s3cr3t-T0ken_abcdefghijklmnop"
    write_network(tmp_path / "network.json", experiment_spec())
    caplog.set_level(logging.INFO, logger="uvicorn.access")
    edge = BackgroundEdge(edge_settings(tmp_path, dataset_root), log_level="info", log_config=None)
    with edge, httpx.Client(base_url=edge.url) as http:
        for path in (f"/?token={token}", f"/v1/network?a=1&TOKEN={token}", f"/v1/leases/{token}"):
            http.get(path)
        deadline = time.monotonic() + 5
        while caplog.text.count("[hidden]") < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "GET /?token=[hidden]" in caplog.text and "/v1/network?a=1&TOKEN=[hidden]" in caplog.text
    assert "s3cr3t" not in caplog.text
