"""Heads from other tabs under CPython: ``SwarmBridge`` is ``lab.browser_host.NativeBridge`` that also
takes heads from the other peers of a ``Swarm``, in memory, as pages do over WebRTC."""

from __future__ import annotations

from dataclasses import dataclass, field

from browser_peer.bridge import PeerBytes
from lab.browser_host import NativeBridge


@dataclass
class Swarm:
    """What each peer's page keeps to serve (peer id -> head id -> bytes); a liar's bytes arrive flipped."""

    heads: dict[str, dict[str, bytes]] = field(default_factory=dict)
    liars: set[str] = field(default_factory=set)
    asked: list[tuple[str, str]] = field(default_factory=list)  # (asker, holder) in order


class SwarmBridge(NativeBridge):
    shares_heads = True

    def __init__(self, swarm: Swarm, peer_id: str, storage: dict[str, bytes] | None = None) -> None:
        super().__init__(storage)
        self.swarm, self.peer_id = swarm, peer_id
        self.dropped: dict[str, str] = {}  # peer id -> reason, as the page hears it

    async def fetch_head(self, head_id: str, holders: list[str], max_bytes: int) -> PeerBytes | None:
        for holder in holders:
            if holder in self.dropped:
                continue
            self.swarm.asked.append((self.peer_id, holder))
            data = self.swarm.heads.get(holder, {}).get(head_id)
            if data is not None and len(data) <= max_bytes:
                return PeerBytes(bytes([data[0] ^ 1]) + data[1:] if holder in self.swarm.liars else data, holder)
        return None

    def keep_head(self, head_id: str, data: bytes) -> None:
        self.swarm.heads.setdefault(self.peer_id, {})[head_id] = data

    def drop_peer(self, peer_id: str, reason: str) -> None:
        self.dropped[peer_id] = reason
