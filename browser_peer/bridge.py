"""What the browser peer needs from its host, as a small interface: HTTP, a WebSocket, status
reports, durable storage (small values, and shards by content) and other peers' copies of heads.

``js_bridge.JsBridge`` implements it with ``pyfetch`` and ``js.WebSocket`` inside Pyodide, and heads
from peers through the page's WebRTC connections (``static/head_sharing.js``); tests implement it
with httpx and websockets to run the same peer code under CPython (heads over HTTP only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from protocol.ice import IceConfig

__all__ = ["Bridge", "HttpAnswer", "PeerBytes", "Socket", "SocketClosed"]


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


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


@dataclass(frozen=True)
class PeerBytes:
    """Bytes another peer sent for an artifact: unchecked until the caller verifies them."""

    data: bytes
    peer_id: str


class Bridge(Protocol):
    shares_heads: bool  # whether the host reaches other peers for heads (below); False: HTTP only

    async def request(self, method: str, url: str, headers: dict[str, str], body: bytes | None = None) -> HttpAnswer:
        """``method`` ``url`` with ``headers`` (and ``body``): the answer, whatever its status (the peer's
        ``session.EdgeSession`` reads it); ``OSError`` when the transfer fails."""
        ...

    async def connect(self, url: str) -> Socket: ...

    def post_status(self, status: dict[str, Any]) -> None: ...

    async def load(self, key: str) -> bytes | None:
        """What ``save`` kept under ``key`` in the tab's durable storage (IndexedDB), or None."""
        ...

    async def save(self, key: str, data: bytes) -> None: ...

    # -- shards by content (``shard_store.ShardStore`` keeps their index) -------------------------
    async def shard_keys(self) -> list[str]:
        """The keys of every stored shard."""
        ...

    async def shard_get(self, key: str) -> bytes | None:
        """The bytes stored under ``key``, or None (never stored, or lost); unchecked."""
        ...

    async def shard_put(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key``: durably where the host can (IndexedDB), else in memory; False
        when it could not be stored at all."""
        ...

    async def shard_delete(self, key: str) -> None: ...

    def part_workers(self) -> int:
        """Other workers ready to train parts of a window (``browser_peer.parts``); 0: this one alone."""
        ...

    async def train_part(self, index: int, payload: bytes) -> bytes:
        """An encoded ``PartTask`` trained by part worker ``index`` (1 to ``part_workers()``)."""
        ...

    # -- heads from peers (used only where ``shares_heads``) ------------------------------------
    async def fetch_head(self, head_id: str, holders: list[str], max_bytes: int) -> PeerBytes | None:
        """The artifact ``head_id`` (at most ``max_bytes``) from the first of ``holders`` (peers that
        announced it) that sends it; None when none does. The bytes are not checked here."""
        ...

    def keep_head(self, head_id: str, data: bytes) -> None:
        """Serve ``data``, verified as ``head_id``, to other peers that ask (a few recent heads)."""
        ...

    def drop_peer(self, peer_id: str, reason: str) -> None:
        """Close ``peer_id``'s connection and never ask it again (it sent wrong bytes)."""
        ...

    def use_ice(self, ice: IceConfig) -> None:
        """The ICE servers (and policy) for the connections made from now on (the edge's, checked)."""
        ...

    def signal_in(self, peer_id: str, data: dict[str, Any]) -> None:
        """A signaling message from ``peer_id``, relayed by the edge (``{"kind": "unreachable"}``:
        the edge could not deliver ours)."""
        ...

    async def signal_out(self) -> tuple[str, dict[str, Any]]:
        """The next signaling message for the edge to relay: (to peer id, data); waits for one."""
        ...
