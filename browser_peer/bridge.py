"""What the browser peer needs from its host, as a small interface: HTTP, a WebSocket, status
reports and durable storage.

``js_bridge.JsBridge`` implements it with ``pyfetch`` and ``js.WebSocket`` inside Pyodide; tests
implement it with httpx and websockets to run the same peer code under CPython.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Bridge", "HttpError", "Socket", "SocketClosed"]


class HttpError(Exception):
    def __init__(self, status: int, url: str) -> None:
        super().__init__(f"HTTP {status} for {url}")
        self.status = status


class SocketClosed(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"socket closed {code}: {reason}")
        self.code, self.reason = code, reason


class Socket(Protocol):
    async def send_text(self, text: str) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def recv(self) -> str | bytes:
        """The next message; raises ``SocketClosed`` once the socket is closed."""
        ...

    async def close(self) -> None: ...


class Bridge(Protocol):
    async def fetch_bytes(self, url: str, headers: dict[str, str]) -> bytes:
        """GET ``url`` with ``headers``; raises ``HttpError`` for a status of 400 or more."""
        ...

    async def connect(self, url: str) -> Socket: ...

    def post_status(self, status: dict[str, Any]) -> None: ...

    async def load(self, key: str) -> bytes | None:
        """What ``save`` kept under ``key`` in the tab's durable storage (IndexedDB), or None."""
        ...

    async def save(self, key: str, data: bytes) -> None: ...

    def part_workers(self) -> int:
        """Other workers ready to train parts of a window (``browser_peer.parts``); 0: this one alone."""
        ...

    async def train_part(self, index: int, payload: bytes) -> bytes:
        """An encoded ``PartTask`` trained by part worker ``index`` (1 to ``part_workers()``)."""
        ...
