"""The browser peer's host under CPython: a ``browser_peer.bridge.Bridge`` over httpx and websockets,
so the peer's code (what Pyodide runs) runs in tests and benchmarks exactly as in a tab, minus the JS
glue, with heads over HTTP only; and its record of answers read window by window (``windows``)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from browser_peer.bridge import HttpAnswer, PeerBytes, SocketClosed
from browser_peer.numpy_trainer import fastest_backend
from browser_peer.parts import PartRunner
from protocol.ice import IceConfig
from protocol.ids import ExperimentKey

__all__ = ["NativeBridge", "NativeSocket", "windows"]


class NativeSocket:
    def __init__(self, connection: ClientConnection) -> None:
        self._connection = connection

    async def send_text(self, text: str) -> None:
        await self._send(text)

    async def send_bytes(self, data: bytes) -> None:
        await self._send(data)

    async def _send(self, message: str | bytes) -> None:
        try:
            await self._connection.send(message)
        except ConnectionClosed as exc:
            raise SocketClosed(exc.rcvd.code if exc.rcvd else 1006, exc.rcvd.reason if exc.rcvd else "") from None

    async def recv(self) -> str | bytes:
        try:
            return await self._connection.recv()
        except ConnectionClosed as exc:
            raise SocketClosed(exc.rcvd.code if exc.rcvd else 1006, exc.rcvd.reason if exc.rcvd else "") from None

    async def close(self) -> None:
        await self._connection.close()


class NativeBridge:
    shares_heads = False

    def __init__(
        self, storage: dict[str, bytes] | None = None, part_workers: int = 0, shards: dict[str, bytes] | None = None
    ) -> None:
        self.runners = [
            PartRunner(fastest_backend()) for _ in range(part_workers)
        ]  # each in a thread of its own when used
        self.statuses: list[dict[str, Any]] = []
        self.fetched: list[str] = []
        self.received: list[tuple[str, int]] = []  # (url, body bytes) of every answer, in order
        self.storage = {} if storage is None else storage  # the tab's IndexedDB: pass one to share it
        self.shards = {} if shards is None else shards  # its shard store, likewise
        self.ice_given: list[IceConfig] = []
        self._http = httpx.AsyncClient(timeout=30)

    async def request(self, method: str, url: str, headers: dict[str, str], body: bytes | None = None) -> HttpAnswer:
        if method == "GET":
            self.fetched.append(url)
        try:
            response = await self._http.request(method, url, headers=headers, content=body)
        except httpx.TransportError as exc:
            raise OSError(f"{method} {url}: {exc}") from exc  # as pyfetch fails
        self.received.append((url, len(response.content)))
        return HttpAnswer(response.status_code, dict(response.headers), response.content)

    async def connect(self, url: str) -> NativeSocket:
        return NativeSocket(await connect(url, max_size=None))

    def post_status(self, status: dict[str, Any]) -> None:
        self.statuses.append(status)

    async def load(self, key: str) -> bytes | None:
        return self.storage.get(key)

    async def save(self, key: str, data: bytes) -> None:
        self.storage[key] = data

    async def shard_keys(self) -> list[str]:
        return list(self.shards)

    async def shard_get(self, key: str) -> bytes | None:
        return self.shards.get(key)

    async def shard_put(self, key: str, data: bytes) -> bool:
        self.shards[key] = data
        return True

    async def shard_delete(self, key: str) -> None:
        self.shards.pop(key, None)

    def part_workers(self) -> int:
        return len(self.runners)

    async def train_part(self, index: int, payload: bytes) -> bytes:
        return await asyncio.to_thread(asyncio.run, self.runners[index - 1].run(payload))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def fetch_head(self, head_id: str, holders: list[str], max_bytes: int) -> PeerBytes | None:
        return None

    def keep_head(self, head_id: str, data: bytes) -> None:
        return None

    def drop_peer(self, peer_id: str, reason: str) -> None:
        return None

    def use_ice(self, ice: IceConfig) -> None:
        self.ice_given.append(ice)  # what a page would configure its connections with (the tests read it)

    def signal_in(self, peer_id: str, data: dict[str, Any]) -> None:
        return None

    async def signal_out(self) -> tuple[str, dict[str, Any]]:
        await asyncio.Event().wait()  # nothing to signal, ever
        raise AssertionError("unreachable")


def windows(received: list[tuple[str, int]], experiment: ExperimentKey) -> list[list[tuple[str, int]]]:
    """A page load's answers (``NativeBridge.received``) window by window: a window starts where the peer
    reads a head after the last window's: ``experiment``'s current head from the edge, or a head's bytes
    (its delta or its artifact, whose Range pieces share one address) when it took the head from the
    relay's heads event."""
    grouped: list[list[tuple[str, int]]] = []
    heads: set[str] = set()  # the addresses of the head bytes in the window so far
    for url, size in received:
        head_bytes = "/v1/artifacts/" in url or "/delta?from=" in url
        descriptor = url.endswith(f"/experiments/{experiment}/head")
        if not grouped or (heads and (descriptor or (head_bytes and url not in heads))):
            grouped.append([])
            heads = set()
        if head_bytes:
            heads.add(url)
        grouped[-1].append((url, size))
    return grouped
