"""Live state of the relay: joined peers, topic subscriptions, fan-out, head waiters, recent events.

Fan-out never waits on a peer: each connection has a bounded send queue drained by its own task;
a message that does not fit marks the connection as a slow consumer, which the relay then closes
(``CLOSE_SLOW_CONSUMER``). Other subscribers are never stalled by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
from collections import defaultdict, deque
from dataclasses import dataclass, field

import orjson

from protocol.clock import SYSTEM_CLOCK, Clock
from protocol.ids import ExperimentKey, PeerId

from .metrics import EdgeMetrics

__all__ = ["TOPICS", "Connection", "ConnectionState", "Hub"]

TOPICS = frozenset({"heads", "quorum", "leases", "candidates", "verdicts", "metrics", "peers"})


class ConnectionState(enum.Enum):
    """A registered connection's state (it is registered once its join proof verified)."""

    JOINED = "joined"
    CLOSED = "closed"


@dataclass(eq=False)
class Connection:
    peer_id: str  # a PeerId for joined peers, ``viewer-<n>`` for anonymous viewers
    kind: str
    queue: asyncio.Queue[str | bytes]
    joined_at_ms: int
    topics: set[tuple[str, str]] = field(default_factory=set)
    overflowed: asyncio.Event = field(default_factory=asyncio.Event)
    state: ConnectionState = ConnectionState.JOINED
    token: str | None = None

    def offer(self, item: str | bytes) -> bool:
        """Queue ``item`` without waiting; on a full queue flag the connection and drop the item."""
        if self.overflowed.is_set():
            return False
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.overflowed.set()
            return False
        return True


class Hub:
    def __init__(self, metrics: EdgeMetrics, queue_size: int, clock: Clock = SYSTEM_CLOCK) -> None:
        self.metrics = metrics
        self.clock = clock
        self.queue_size = queue_size
        self.connections: dict[PeerId, Connection] = {}
        self._subscribers: dict[tuple[str, str], set[Connection]] = defaultdict(set)
        self._head_changed: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.events: deque[dict[str, object]] = deque(maxlen=200)
        self.viewers: set[Connection] = set()
        self._viewer_numbers = itertools.count(1)

    def register(self, peer_id: PeerId, kind: str) -> tuple[Connection, Connection | None]:
        """Add a joined peer; returns it and the connection it replaces (same peer id), if any."""
        previous = self.connections.pop(peer_id, None)
        if previous is not None:
            self.unregister(previous)
        connection = Connection(peer_id, kind, asyncio.Queue(self.queue_size), self.clock.now_ms())
        self.connections[peer_id] = connection
        self.metrics.connections.labels(kind).inc()
        return connection, previous

    def add_viewer(self) -> Connection:
        """An anonymous, read-only connection that receives every published event."""
        viewer = Connection(
            f"viewer-{next(self._viewer_numbers)}", "viewer", asyncio.Queue(self.queue_size), self.clock.now_ms()
        )
        self.viewers.add(viewer)
        self.metrics.connections.labels("viewer").inc()
        return viewer

    def unregister(self, connection: Connection) -> None:
        if connection.state is ConnectionState.CLOSED:
            return
        connection.state = ConnectionState.CLOSED
        self.viewers.discard(connection)
        for key in connection.topics:
            self._subscribers[key].discard(connection)
        if self.connections.get(connection.peer_id) is connection:
            del self.connections[connection.peer_id]
        self.metrics.connections.labels(connection.kind).dec()

    def subscribe(self, connection: Connection, experiment: ExperimentKey, topics: list[str]) -> None:
        for topic in topics:
            key = (str(experiment), topic)
            connection.topics.add(key)
            self._subscribers[key].add(connection)

    def publish(self, experiment: ExperimentKey | str, topic: str, data: object) -> int:
        """Fan ``data`` out to the topic's subscribers; returns how many accepted it."""
        message = {"type": "event", "topic": topic, "experiment": str(experiment), "data": data}
        self.events.append({**message, "at_ms": self.clock.now_ms()})
        text = orjson.dumps(message).decode()
        subscribers = [*self._subscribers.get((str(experiment), topic), ()), *self.viewers]
        delivered = sum(conn.offer(text) for conn in subscribers)
        self.metrics.relay_messages.labels(topic).inc(delivered)
        return delivered

    def send_to(self, peer_id: str, message: object) -> bool:
        connection = self.connections.get(PeerId(peer_id))
        return connection is not None and connection.offer(orjson.dumps(message).decode())

    def head_changed(self, experiment: ExperimentKey) -> None:
        event = self._head_changed.pop(str(experiment), None)
        if event is not None:
            event.set()

    async def wait_head_change(self, experiment: ExperimentKey, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._head_changed[str(experiment)].wait(), timeout_s)

    def peers_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for connection in [*self.connections.values(), *self.viewers]:
            counts[connection.kind] += 1
        return dict(counts)
