"""Connection budgets against a client with many connections from a few addresses (loopback only,
bounded): slow headers, slow bodies and joined-and-idle WebSockets from 127.0.0.2–127.0.0.5, while an
honest client on 127.0.0.1 asks for health, readiness and a lease. The edge runs as its own process
with a low descriptor limit (``ulimit -n``), as a host's default would give it; behind the deploy's
nginx in the slow tier. What it must hold: the honest client is answered throughout."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from lab.stack import Fleet, free_port
from protocol.signing import PureSigner
from server.budget import Admission, ConnectionBudget, address_group
from server.serve import BackgroundEdge

from .support import EXPERIMENT, edge_settings, head_envelope, proof, write_network

FLOOD_ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
HONEST = "127.0.0.1"
NOFILE = 512  # the edge's descriptor limit: its cap is about 300 connections (server.connections)
LEASES = f"/v1/experiments/{EXPERIMENT}/leases"
KINDS = ("headers", "bodies", "websockets")


def _masked_text(text: str) -> bytes:
    """One masked WebSocket text frame (clients must mask)."""
    data, mask = text.encode(), os.urandom(4)
    length = bytes([0x80 | len(data)]) if len(data) < 126 else bytes([0x80 | 126]) + struct.pack("!H", len(data))
    return b"\x81" + length + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def _read_until(conn: socket.socket, marker: bytes, limit: int = 1 << 16) -> bytes:
    data = b""
    while marker not in data and len(data) < limit:
        chunk = conn.recv(limit)
        if not chunk:
            break
        data += chunk
    return data


def _received(conn: socket.socket) -> bytes:
    """What a readable connection holds, without waiting (TLS: ``b"-"`` for records that carry no
    data, such as session tickets)."""
    conn.settimeout(0)
    try:
        return conn.recv(1 << 16)
    except (ssl.SSLWantReadError, BlockingIOError):
        return b"-"
    finally:
        conn.settimeout(2)


@dataclass
class Flood:
    """Slow connections of one ``kind`` to ``port``, spread over ``addresses``: ``headers`` never
    finish their headers, ``bodies`` a lease request's body, ``websockets`` join the relay (a new
    identity each) and stay silent. ``closed`` counts those the server answered or closed."""

    port: int
    kind: str
    wrap: Callable[[socket.socket], socket.socket] = lambda conn: conn
    host: str = "edge"
    addresses: tuple[str, ...] = FLOOD_ADDRESSES
    open: list[socket.socket] = field(default_factory=list)
    opened: int = 0
    closed: int = 0

    def grow(self, per_address: int) -> None:
        fresh = []
        for address in self.addresses:
            for _ in range(per_address):
                with contextlib.suppress(OSError):
                    conn = socket.create_connection(("127.0.0.1", self.port), timeout=2, source_address=(address, 0))
                    conn = self.wrap(conn)
                    conn.sendall(self._opening())
                    fresh.append(conn)
        if self.kind == "websockets":
            fresh = [conn for conn in fresh if self._join(conn)]
        self.opened += len(fresh)
        self.open += fresh

    def _opening(self) -> bytes:
        head = f"Host: {self.host}\r\n"
        if self.kind == "headers":
            return f"GET /healthz HTTP/1.1\r\n{head}".encode()
        if self.kind == "bodies":
            return f"POST {LEASES} HTTP/1.1\r\n{head}content-type: application/json\r\ncontent-length: 4096\r\n\r\n{{".encode()
        key = "dGhlIHNhbXBsZSBub25jZQ=="
        return (
            f"GET /v1/relay HTTP/1.1\r\n{head}Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()

    def _join(self, conn: socket.socket) -> bool:
        """Answers the relay's challenge with a fresh identity's join; whether it was welcomed."""
        try:
            data = _read_until(conn, b"\r\n\r\n")
            if not data.startswith(b"HTTP/1.1 101"):
                raise ConnectionRefusedError
            if b'"nonce"' not in data:
                data += _read_until(conn, b'"nonce"')
            nonce = json.loads(data[data.index(b'{"type"') :].split(b"}", 1)[0] + b"}")["nonce"]
            signer = PureSigner(os.urandom(32))
            conn.sendall(_masked_text(json.dumps({"type": "join", "proof": proof(signer, "join", nonce)})))
            if b'"welcome"' in _read_until(conn, b'"welcome"'):
                return True
        except (OSError, ValueError, KeyError):
            pass
        self.closed += 1
        conn.close()
        return False

    def trickle(self) -> None:
        """A byte on every slow HTTP connection (what keeps a naive server waiting); forgets those the
        server has answered or closed."""
        poller = select.poll()
        for conn in self.open:
            poller.register(conn, select.POLLIN)
        answered = {fd for fd, _ in poller.poll(0)}
        still = []
        for conn in self.open:
            try:
                if conn.fileno() in answered and _received(conn)[:1] in (b"", b"H", b"\x88"):
                    raise ConnectionResetError  # EOF, an HTTP answer or a WebSocket close
                if self.kind != "websockets":
                    conn.send(b"x" if self.kind == "headers" else b" ")
                still.append(conn)
            except (OSError, ssl.SSLError):
                self.closed += 1
                conn.close()
        self.open = still

    def close(self) -> None:
        for conn in self.open:
            conn.close()
        self.open = []


@dataclass
class Probes:
    """What the honest client asked and what it got: (what, status or the transport error)."""

    answers: list[tuple[str, object]] = field(default_factory=list)

    def ask(self, client: httpx.Client, trainer: PureSigner) -> None:
        requests = {
            "healthz": client.build_request("GET", "/healthz"),
            "readyz": client.build_request("GET", "/readyz"),
            "lease": client.build_request("POST", LEASES, json=proof(trainer, "lease")),
        }
        for what, request in requests.items():
            try:
                self.answers.append((what, client.send(request).status_code))
            except httpx.TransportError as exc:
                self.answers.append((what, type(exc).__name__))

    @property
    def summary(self) -> str:
        kinds = sorted({what for what, _ in self.answers})
        return ", ".join(
            f"{what} {sum(1 for w, s in self.answers if w == what and s == 200)}/"
            f"{sum(1 for w, _ in self.answers if w == what)}"
            for what in kinds
        )

    @property
    def all_answered(self) -> bool:
        return bool(self.answers) and all(status == 200 for _, status in self.answers)


def flood_and_probe(flood: Flood, client: Callable[[], httpx.Client], *, first: int, rounds: int, more: int) -> Probes:
    """``first`` slow connections per flooding address, then ``rounds`` rounds each adding ``more`` per
    address and trickling on all, while the honest client (a new connection per request) probes."""
    trainer = PureSigner(b"\x5a" * 32)  # one trainer: asked again in the window, the same lease
    probes = Probes()
    flood.grow(first)
    try:
        for _ in range(rounds):
            flood.trickle()
            with client() as http:
                probes.ask(http, trainer)
            flood.grow(more)
        flood.trickle()
    finally:
        print(f"\n{flood.kind}: {flood.opened} opened, {flood.closed} refused or closed; honest: {probes.summary}")
        flood.close()
    return probes


def _edge_process(fleet: Fleet, root: Path, dataset_root: Path, *flags: str) -> str:
    """``python -m server`` under ``ulimit -n NOFILE`` with ``flags``, its genesis head posted; its URL."""
    write_network(root / "network.json")
    port = free_port()
    argv = ["sh", "-c", f'ulimit -n {NOFILE} && exec "$@"', "sh", sys.executable, "-m", "server", "--no-access-log"]
    argv += ["--port", str(port), "--data-dir", str(root / "edge"), "--datasets-dir", str(dataset_root)]
    argv += ["--network", str(root / "network.json"), "--pyodide-dir", str(root / "no-pyodide"), *flags]
    fleet.start("edge", argv)
    url = f"http://127.0.0.1:{port}"
    fleet.wait_ready(f"{url}/livez")
    _, genesis = head_envelope()
    assert httpx.post(f"{url}/v1/experiments/{EXPERIMENT}/heads", content=genesis).status_code == 201
    return url


@pytest.fixture(scope="module")
def low_limit_edge(tmp_path_factory: pytest.TempPathFactory, dataset_root: Path) -> Iterator[str]:
    """The edge alone, with the default settings, under ``ulimit -n NOFILE``."""
    root = tmp_path_factory.mktemp("budgets")
    with Fleet(root) as fleet:
        yield _edge_process(fleet, root, dataset_root)
        fleet.check_alive()


@dataclass
class Proxied:
    """The deploy's nginx (the rendered site) in front of one edge: its public URL and TLS context."""

    public_url: str
    tls: ssl.SSLContext

    def wrap(self, conn: socket.socket) -> socket.socket:
        return self.tls.wrap_socket(conn, server_hostname="127.0.0.1")


@pytest.fixture(scope="module")
def behind_nginx(tmp_path_factory: pytest.TempPathFactory, dataset_root: Path) -> Iterator[Proxied]:
    """The edge as the deploy runs it (``dtn.env.example``: per-address cap lifted, nginx believed),
    under ``ulimit -n NOFILE``, behind a started nginx on the rendered site."""
    from .test_edges_behind_nginx import _nginx, _nginx_site

    nginx = _nginx()
    root = tmp_path_factory.mktemp("budgets-nginx")
    with Fleet(root) as fleet:
        flags = ("--max-connections-per-address", "4096", "--forwarded-allow-ips", "127.0.0.1")
        url = _edge_process(fleet, root, dataset_root, *flags)
        conf, public_url = _nginx_site(root, [url.removeprefix("http://")], dataset_root)
        fleet.start("nginx", [nginx, "-c", str(conf), "-p", str(conf.parent)])
        tls = ssl.create_default_context(cafile=str(root / "tls" / "cert.pem"))
        deadline = time.monotonic() + 20
        while True:
            fleet.check_alive()
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{public_url}/livez", verify=tls).status_code == 200:
                    break
            assert time.monotonic() < deadline, "nginx did not answer"
            time.sleep(0.1)
        yield Proxied(public_url, tls)
        fleet.check_alive()


@pytest.mark.slow  # slow clients trickling bytes for seconds, by design
@pytest.mark.parametrize("kind", KINDS)
def test_a_few_addresses_cannot_stop_the_edge(low_limit_edge: str, kind: str) -> None:
    """About 1,000 slow connections of one kind from four addresses, past the edge's cap (about 300
    under ``ulimit -n 512``): health, readiness and a lease request from a fifth address are answered
    every time (before: 503 once the flood held the cap), and the flood was cut down to its share."""
    port = int(low_limit_edge.rsplit(":", 1)[1])
    transport = httpx.HTTPTransport(local_address=HONEST)

    def honest() -> httpx.Client:
        return httpx.Client(base_url=low_limit_edge, transport=transport, timeout=10, headers={"connection": "close"})

    flood = Flood(port, kind)
    probes = flood_and_probe(flood, honest, first=150, rounds=5, more=20)
    assert flood.closed > 0, "the flood never reached the edge's cap: the test tests nothing"
    assert probes.all_answered, probes.answers


def test_at_the_cap_health_is_answered_from_the_reserve_and_the_heaviest_address_gives_way(
    tmp_path: Path, dataset_root: Path
) -> None:
    """Joined WebSockets from one address hold the whole cap (20 here): from that address /healthz and
    /readyz are still answered (the reserve), a lease request is refused 503 with Retry-After; from
    another address the lease is granted, and the flood's oldest WebSocket is closed with 1013."""
    write_network(tmp_path / "network.json")
    settings = edge_settings(
        tmp_path, dataset_root, max_connections=20, reserved_connections=2, max_connections_per_address=100
    )
    with BackgroundEdge(settings) as edge:
        _, genesis = head_envelope()
        assert httpx.post(f"{edge.url}/v1/experiments/{EXPERIMENT}/heads", content=genesis).status_code == 201
        flood = Flood(edge.settings.port, "websockets", addresses=("127.0.0.2",))
        flood.grow(20)
        try:
            assert flood.opened == 20
            trainer = PureSigner(b"\x5b" * 32)
            same = httpx.HTTPTransport(local_address="127.0.0.2")
            with httpx.Client(base_url=edge.url, transport=same, timeout=10) as http:
                assert http.get("/healthz").status_code == 200
                assert http.get("/readyz").status_code == 200
                refused = http.post(LEASES, json=proof(trainer, "lease"))
            assert (refused.status_code, refused.json()["error"]) == (503, "Unavailable")
            assert refused.headers["retry-after"] == "5"
            other = httpx.HTTPTransport(local_address="127.0.0.3")
            with httpx.Client(base_url=edge.url, transport=other, timeout=10) as http:
                assert http.post(LEASES, json=proof(trainer, "lease")).status_code == 200
            oldest = flood.open[0]
            oldest.settimeout(5)
            frame = _read_until(oldest, b"capacity")
            assert frame[:1] == b"\x88" and struct.unpack("!H", frame[2:4])[0] == 1013, frame
        finally:
            flood.close()


# The budget's rules, without sockets.


class _Conn:
    def __init__(self) -> None:
        self.shed_count = 0

    def shed(self) -> None:
        self.shed_count += 1


def test_the_heaviest_address_gives_way_and_the_reserve_takes_the_rest() -> None:
    budget = ConnectionBudget(cap=4, per_address=3, reserve=2)
    flood = [_Conn() for _ in range(3)]
    for i, conn in enumerate(flood):
        assert budget.admit(("a", i), "10.0.0.1", conn) is Admission.ADMITTED
    assert budget.admit("b", "10.0.0.2", _Conn()) is Admission.ADMITTED  # at the cap now
    assert budget.admit(("a", 3), "10.0.0.1", _Conn()) is Admission.OVER_ADDRESS
    newcomer = _Conn()
    assert budget.admit("c", "10.0.0.3", newcomer) is Admission.ADMITTED  # 10.0.0.1's oldest gives way
    assert [conn.shed_count for conn in flood] == [1, 0, 0] and budget.held == 4
    budget.release(("a", 0))  # shed, then closed: released again, no harm
    assert budget.held == 4
    # 2 + 1 + 1: nobody is two ahead of a newcomer from 10.0.0.2, which gets a reserved slot
    reserved = [_Conn() for _ in range(3)]
    assert budget.admit("r0", "10.0.0.2", reserved[0]) is Admission.RESERVE
    assert budget.admit("r1", "10.0.0.4", reserved[1]) is Admission.ADMITTED  # 0 vs 2: 10.0.0.1 gives way
    assert budget.admit("r2", "10.0.0.2", reserved[2]) is Admission.RESERVE
    assert budget.admit("r3", "10.0.0.3", _Conn()) is Admission.RESERVE  # the reserve is full: its oldest goes
    assert reserved[0].shed_count == 1 and budget.reserved == 2
    budget.release("r2")
    assert budget.reserved == 1


def test_without_a_reserve_a_connection_over_the_cap_is_refused() -> None:
    budget = ConnectionBudget(cap=2, per_address=5, reserve=0)
    assert budget.admit(1, "10.0.0.1", _Conn()) is Admission.ADMITTED
    assert budget.admit(2, "10.0.0.2", _Conn()) is Admission.ADMITTED
    assert budget.admit(3, "10.0.0.3", _Conn()) is Admission.OVER_CAP


def test_an_ipv6_slash_64_counts_as_one_address() -> None:
    assert address_group("2001:db8:1:2::1") == address_group("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert address_group("2001:db8:1:3::1") != address_group("2001:db8:1:2::1")
    assert address_group("::ffff:192.0.2.7") == address_group("192.0.2.7") == "192.0.2.7"
    assert address_group(None) == "" and address_group("unix") == "unix"


@pytest.mark.slow  # nginx
@pytest.mark.parametrize("kind", KINDS)
def test_a_few_addresses_cannot_stop_the_edge_behind_nginx(behind_nginx: Proxied, kind: str) -> None:
    """The same flood on nginx's public TLS port: nginx holds slow headers and bodies itself (its own
    connections, ``client_header_timeout``, ``client_body_timeout``) and passes at most
    ``limit_conn`` requests and WebSockets per address to the edge; the honest client through nginx
    is answered every time."""
    port = int(behind_nginx.public_url.rsplit(":", 1)[1])
    transport = httpx.HTTPTransport(local_address=HONEST, verify=behind_nginx.tls)

    def honest() -> httpx.Client:
        return httpx.Client(base_url=behind_nginx.public_url, transport=transport, timeout=10)

    flood = Flood(port, kind, wrap=behind_nginx.wrap, host=f"127.0.0.1:{port}")
    probes = flood_and_probe(flood, honest, first=150, rounds=5, more=20)
    assert flood.opened + flood.closed >= 1000, "the flood never reached nginx: the test tests nothing"
    assert probes.all_answered, probes.answers
