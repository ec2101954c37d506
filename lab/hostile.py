"""Hostile clients against a real edge, for the liveness suite (``tests/test_liveness.py``) and the
benchmarks (``benchmarks.squatting``): each is a thread that attacks until ``close()``, from a few
loopback source addresses, and counts what it got.

    Squatter        leases under fresh identities in each new head's window, and never delivers
    IdleHolder      opens connections and sends nothing (half a request line), as many as it may
    StageSquatter   opens staged uploads with a tiny first chunk from each address, and sends no more
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Sequence

import httpx

from native_peer.edge_client import EdgeClient, EdgeRequestError
from native_peer.identity import NodeIdentity
from protocol.ids import ContentId, ExperimentKey
from protocol.uploads import upload_path

__all__ = ["SOURCES", "IdleHolder", "Squatter", "StageSquatter"]

SOURCES = tuple(f"127.0.0.{i}" for i in range(2, 6))  # a few addresses, as one attacker holds


class _Attacker(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()

    def close(self) -> None:
        self.stop.set()
        self.join(timeout=10)


class Squatter(_Attacker):
    """Leases under ``identities`` fresh identities in each new head's window of ``experiment``,
    spread over ``sources``, never delivering. ``granted``: leases it got; ``windows``: heads it saw."""

    def __init__(self, url: str, experiment: ExperimentKey, identities: int, sources: Sequence[str] = SOURCES) -> None:
        super().__init__()
        self.experiment, self.identities = experiment, identities
        self.clients = [EdgeClient(url, retries=0, transport=httpx.HTTPTransport(local_address=a)) for a in sources]
        self.granted = 0
        self.windows = 0

    def run(self) -> None:
        seen = None
        while not self.stop.is_set():
            try:  # a long poll: the squatter spends no core while it waits
                head = self.clients[0].current_head(self.experiment, after=seen, wait_s=1.0)
            except (EdgeRequestError, httpx.TransportError):
                continue
            if head is None or head.head_id == seen:
                continue
            seen, self.windows = head.head_id, self.windows + 1
            for i in range(self.identities):
                try:
                    self.clients[i % len(self.clients)].request_lease(
                        self.experiment, NodeIdentity(os.urandom(32)), "native"
                    )
                    self.granted += 1
                except (EdgeRequestError, httpx.TransportError):
                    pass  # the window is full, or the edge refused this address

    def close(self) -> None:
        super().close()
        for client in self.clients:
            client.close()


class IdleHolder(_Attacker):
    """Keeps up to ``connections`` connections open to ``host``:``port`` from ``sources``, each having sent
    half a request line; opens new ones as the edge closes them. ``opened``: connections it opened."""

    def __init__(self, host: str, port: int, connections: int, sources: Sequence[str] = SOURCES) -> None:
        super().__init__()
        self.address, self.connections, self.sources = (host, port), connections, list(sources)
        self.opened = 0
        self._held: list[socket.socket] = []

    def run(self) -> None:
        while not self.stop.is_set():
            self._held = [s for s in self._held if _open(s)]
            while len(self._held) < self.connections and not self.stop.is_set():
                held = socket.socket()
                try:
                    held.bind((self.sources[self.opened % len(self.sources)], 0))
                    held.settimeout(2.0)
                    held.connect(self.address)
                    held.sendall(b"GET /healthz HT")
                except OSError:
                    held.close()
                    break
                self._held.append(held)
                self.opened += 1
            self.stop.wait(0.2)
        for held in self._held:
            held.close()


def _open(connection: socket.socket) -> bool:
    """Whether the peer has not closed ``connection`` (closing it here when it has)."""
    connection.setblocking(False)
    try:
        closed = connection.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        closed = False
    except OSError:
        closed = True
    if closed:
        connection.close()
    return not closed


class StageSquatter(_Attacker):
    """Opens a staged upload of a ``size``-byte artifact of ``experiment`` with a 10-byte first chunk from
    each of ``sources``, again whenever one is dropped, and sends no more. ``opened``: stages the edge took."""

    def __init__(self, url: str, experiment: ExperimentKey, size: int, sources: Sequence[str] = SOURCES) -> None:
        super().__init__()
        self.experiment, self.size = experiment, size
        self.clients = [httpx.Client(base_url=url, transport=httpx.HTTPTransport(local_address=a)) for a in sources]
        self.opened = 0

    def run(self) -> None:
        while not self.stop.is_set():
            for client in self.clients:
                cid = ContentId(f"sha256:{os.urandom(32).hex()}")  # never completed: any id will do
                headers = {"content-range": f"bytes 0-9/{self.size}"}
                try:
                    answer = client.put(upload_path(self.experiment, cid), content=b"\0" * 10, headers=headers)
                except httpx.TransportError:
                    continue
                self.opened += answer.status_code == 200
            self.stop.wait(1.0)

    def close(self) -> None:
        super().close()
        for client in self.clients:
            client.close()
