"""Live state of the relay: joined peers, topic subscriptions, fan-out, head and activity waiters,
recent events.

Activity is what a validator waits on instead of polling (``wait_activity``): every candidate, lease,
head, quorum and run-control event of any experiment, here or on another edge, moves this edge's activity token
(``<edge instance>-<count>``) and wakes its waiters. A token from another edge (or an earlier
process) is answered at once with this one's, so a waiter never sleeps through a change it missed.

On an admission network the edge shows anonymous viewers, and peers whose token may not read leases,
each event as ``public_event`` makes it: no lease ids, shard ids or principals (a connection's
``redacted``). Lease secrets are never in an event.

Fan-out never waits on a peer: each connection has a bounded send queue drained by its own task;
a message that does not fit marks the connection as a slow consumer, which the relay then closes
(``CLOSE_SLOW_CONSUMER``). Other subscribers are never stalled by it.

Several edges of one deployment share what happens through a ``Fanout``: events, head changes,
relay messages for a peer joined to another edge, and which edge each peer is joined to.
``LocalFanout`` is the one-edge default (nothing to share); ``server.hub_redis.RedisFanout`` carries
it over Redis pub/sub. The hub delivers its own events at once and another edge's when they arrive
(``deliver``), the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import secrets
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from protocol.clock import SYSTEM_CLOCK, Clock
from protocol.ids import ExperimentKey, PeerId

from .metrics import EdgeMetrics

__all__ = [
    "ACTIVITY_TOPICS",
    "NETWORK_SCOPE",
    "TOPICS",
    "Connection",
    "ConnectionState",
    "Envelope",
    "Fanout",
    "Hub",
    "LocalFanout",
    "public_event",
]

TOPICS = frozenset(
    {"heads", "quorum", "leases", "candidates", "verdicts", "metrics", "peers", "control", "evaluations", "network"}
)
# what a subscription or an event names instead of an experiment key when it is about the whole
# network (peers joining the relay): ``_`` keeps it apart from every key (study/experiment/revision)
NETWORK_SCOPE = "_network"
LEASES_KEPT = 8  # a connection's latest leases remembered: a trainer holds this window's and the next one's
ACTIVITY_TOPICS = frozenset(
    {"heads", "quorum", "leases", "candidates", "control", "network"}
)  # what can decide a window
_PRIVATE_FIELDS = {"leases": ("lease_id", "shard_ids", "principal", "signature"), "candidates": ("lease_id",)}


def public_event(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` (an ``event``) as the edge shows it to whom admission does not let read leases: a
    lease without its id, shards and principal (its signature, over them, goes too; the number of its
    shards stays, as ``shards``), a candidate without its lease id. Other topics are unchanged."""
    hidden = _PRIVATE_FIELDS.get(message.get("topic", ""))
    data = message.get("data")
    if hidden is None or not isinstance(data, dict):
        return message
    public = {name: value for name, value in data.items() if name not in hidden}
    if "shard_ids" in data:
        public["shards"] = len(data["shard_ids"])
    return {**message, "data": public}


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
    redacted: bool = False  # sent events as ``public_event`` makes them
    revoked: bool = False  # its admission token was revoked: the relay closes it (``errors.CLOSE_REVOKED``)
    # (experiment, lease id) of the latest leases granted over it: given back if the peer leaves undelivered
    leases: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=LEASES_KEPT))

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

    def leased(self, experiment: str, lease_id: str) -> None:
        """A lease was granted (or granted again) over this connection."""
        if (experiment, lease_id) not in self.leases:
            self.leases.append((experiment, lease_id))

    def revoke(self) -> None:
        """Its admission token no longer admits it: have the relay close it, sending nothing more."""
        self.revoked = True
        self.overflowed.set()

    def supersede(self) -> None:
        """Tell the peer a newer session replaced this one, then have the relay close it."""
        self.offer(orjson.dumps({"type": "replaced"}).decode())
        self.overflowed.set()


Envelope = dict[str, Any]  # what one edge tells the others: {"kind": "event" | "head" | "send" | "joined", ...}


class Fanout(Protocol):
    """How a hub reaches the other edges of its deployment."""

    async def start(self, deliver: Callable[[Envelope], None]) -> None:
        """Begin passing the other edges' envelopes to ``deliver`` (on the event loop)."""
        ...

    def broadcast(self, envelope: Envelope) -> None:
        """Send ``envelope`` to every other edge, in order, without waiting."""
        ...

    def joined(self, peer_id: str) -> None:
        """Record that ``peer_id`` is joined to this edge (its latest session)."""
        ...

    def left(self, peer_id: str) -> None:
        """Forget ``peer_id``'s session on this edge (not a newer one on another edge)."""
        ...

    async def present(self, peer_id: str) -> bool:
        """Whether ``peer_id`` is joined to some edge of the deployment."""
        ...

    async def close(self) -> None: ...


class LocalFanout:
    """One edge alone: there is nobody to tell."""

    async def start(self, deliver: Callable[[Envelope], None]) -> None:
        return None

    def broadcast(self, envelope: Envelope) -> None:
        return None

    def joined(self, peer_id: str) -> None:
        return None

    def left(self, peer_id: str) -> None:
        return None

    async def present(self, peer_id: str) -> bool:
        return False

    async def close(self) -> None:
        return None


class Hub:
    def __init__(
        self, metrics: EdgeMetrics, queue_size: int, clock: Clock = SYSTEM_CLOCK, fanout: Fanout | None = None
    ) -> None:
        self.fanout: Fanout = LocalFanout() if fanout is None else fanout
        self.metrics = metrics
        self.clock = clock
        self.queue_size = queue_size
        self.connections: dict[PeerId, Connection] = {}
        self._subscribers: dict[tuple[str, str], set[Connection]] = defaultdict(set)
        self._head_changed: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self._instance = secrets.token_hex(6)
        self._activity = 0
        self._activity_changed = asyncio.Event()
        self._waits_ended = False
        self.events: deque[dict[str, object]] = deque(maxlen=200)
        self.viewers: set[Connection] = set()
        self._viewer_numbers = itertools.count(1)
        self.on_revised: Callable[[], None] | None = None  # reads the network's new revisions from the store

    async def start(self) -> None:
        await self.fanout.start(self.deliver)

    async def close(self) -> None:
        await self.fanout.close()

    def register(self, peer_id: PeerId, kind: str) -> Connection:
        """Add a joined peer; a session of the same peer id, here or on another edge, is superseded."""
        previous = self.connections.pop(peer_id, None)
        if previous is not None:
            self.unregister(previous)
            previous.supersede()
        connection = Connection(peer_id, kind, asyncio.Queue(self.queue_size), self.clock.now_ms())
        self.connections[peer_id] = connection
        self.metrics.connections.labels(kind).inc()
        self.fanout.joined(peer_id)
        self.fanout.broadcast({"kind": "joined", "peer_id": peer_id})
        return connection

    def add_viewer(self, *, redacted: bool = False) -> Connection:
        """An anonymous, read-only connection that receives every published event (``redacted``: as
        ``public_event`` makes it)."""
        viewer = Connection(
            f"viewer-{next(self._viewer_numbers)}", "viewer", asyncio.Queue(self.queue_size), self.clock.now_ms()
        )
        viewer.redacted = redacted
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
        if connection.kind != "viewer" and self.connections.get(PeerId(connection.peer_id)) is connection:
            del self.connections[PeerId(connection.peer_id)]
            self.fanout.left(connection.peer_id)
        self.metrics.connections.labels(connection.kind).dec()

    def subscribe(self, connection: Connection, experiment: ExperimentKey, topics: list[str]) -> None:
        for topic in topics:
            key = (str(experiment), topic)
            connection.topics.add(key)
            self._subscribers[key].add(connection)

    def publish(self, experiment: ExperimentKey | str, topic: str, data: object) -> int:
        """Fan ``data`` out to the topic's subscribers here and on every other edge; returns how many
        here accepted it."""
        message = {"type": "event", "topic": topic, "experiment": str(experiment), "data": data}
        self.fanout.broadcast({"kind": "event", "message": message})
        return self._fan_out(message)

    def _fan_out(self, message: dict[str, Any]) -> int:
        self.events.append({**message, "at_ms": self.clock.now_ms()})
        if message["topic"] in ACTIVITY_TOPICS:
            self._activity += 1
            self._activity_changed.set()
            self._activity_changed = asyncio.Event()
        text = orjson.dumps(message).decode()
        public = orjson.dumps(public_event(message)).decode() if message["topic"] in _PRIVATE_FIELDS else text
        subscribers = [*self._subscribers.get((message["experiment"], message["topic"]), ()), *self.viewers]
        delivered: int = sum(conn.offer(public if conn.redacted else text) for conn in subscribers)
        self.metrics.relay_messages.labels(message["topic"]).inc(delivered)
        return delivered

    async def present(self, peer_id: str) -> bool:
        """Whether ``peer_id`` is joined here or to another edge of the deployment."""
        return PeerId(peer_id) in self.connections or await self.fanout.present(peer_id)

    async def send_to(self, peer_id: str, message: object) -> bool:
        """Queue ``message`` for ``peer_id``, joined here or to another edge; False when it is nowhere
        (or its queue here is full)."""
        connection = self.connections.get(PeerId(peer_id))
        if connection is not None:
            return connection.offer(orjson.dumps(message).decode())
        if not await self.fanout.present(peer_id):
            return False
        self.fanout.broadcast({"kind": "send", "peer_id": peer_id, "message": message})
        return True

    def head_changed(self, experiment: ExperimentKey) -> None:
        """Wake the head long-polls of ``experiment``, here and on every other edge."""
        self.fanout.broadcast({"kind": "head", "experiment": str(experiment)})
        self._wake(str(experiment))

    def _wake(self, experiment: str) -> None:
        event = self._head_changed.pop(experiment, None)
        if event is not None:
            event.set()

    def end_waits(self) -> None:
        """The edge is shutting down: every long poll (head, activity) answers now, and later ones at once."""
        self._waits_ended = True
        for experiment in list(self._head_changed):
            self._wake(experiment)
        self._activity_changed.set()

    async def wait_head_change(self, experiment: ExperimentKey, timeout_s: float) -> None:
        if self._waits_ended:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._head_changed[str(experiment)].wait(), timeout_s)

    @property
    def activity(self) -> str:
        """This edge's activity token: it moves with every event that can decide a window."""
        return f"{self._instance}-{self._activity}"

    async def wait_activity(self, since: str | None, timeout_s: float) -> str:
        """The activity token once it differs from ``since`` (at once when it does already), or after
        ``timeout_s`` without a change."""
        if since == self.activity and not self._waits_ended:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._activity_changed.wait(), timeout_s)
        return self.activity

    def deliver(self, envelope: Envelope) -> None:
        """What another edge broadcast, done here."""
        kind = envelope.get("kind")
        if kind == "event":
            if envelope["message"]["topic"] == "network" and self.on_revised is not None:
                self.on_revised()  # the network was revised through another edge: serve it before telling
            self._fan_out(envelope["message"])
        elif kind == "head":
            self._wake(envelope["experiment"])
        elif kind == "send":
            connection = self.connections.get(PeerId(envelope["peer_id"]))
            if connection is not None:
                connection.offer(orjson.dumps(envelope["message"]).decode())
        elif kind == "joined":  # the peer's newer session is on another edge
            previous = self.connections.get(PeerId(envelope["peer_id"]))
            if previous is not None:
                self.unregister(previous)
                previous.supersede()

    def peers_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for connection in [*self.connections.values(), *self.viewers]:
            counts[connection.kind] += 1
        return dict(counts)
