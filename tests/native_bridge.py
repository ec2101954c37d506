"""A ``browser_peer.bridge.Bridge`` for CPython (httpx + websockets), so the browser peer's code
runs in tests exactly as in Pyodide, minus the JS glue."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from browser_peer.bridge import HttpError, SocketClosed
from browser_peer.parts import PartRunner


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
    def __init__(self, storage: dict[str, bytes] | None = None, part_workers: int = 0) -> None:
        self.runners = [PartRunner() for _ in range(part_workers)]  # each in a thread of its own when used
        self.statuses: list[dict[str, Any]] = []
        self.fetched: list[str] = []
        self.storage = {} if storage is None else storage  # the tab's IndexedDB: pass one to share it
        self._http = httpx.AsyncClient(timeout=30)

    async def fetch_bytes(self, url: str, headers: dict[str, str]) -> bytes:
        self.fetched.append(url)
        response = await self._http.get(url, headers=headers)
        if response.status_code >= 400:
            raise HttpError(response.status_code, url)
        return response.content

    async def connect(self, url: str) -> NativeSocket:
        return NativeSocket(await connect(url, max_size=None))

    def post_status(self, status: dict[str, Any]) -> None:
        self.statuses.append(status)

    async def load(self, key: str) -> bytes | None:
        return self.storage.get(key)

    async def save(self, key: str, data: bytes) -> None:
        self.storage[key] = data

    def part_workers(self) -> int:
        return len(self.runners)

    async def train_part(self, index: int, payload: bytes) -> bytes:
        return await asyncio.to_thread(asyncio.run, self.runners[index - 1].run(payload))

    async def aclose(self) -> None:
        await self._http.aclose()
