"""``RedisFanout``: the hub's ``Fanout`` over Redis, for several edges of one deployment (``server.hub``).

Every edge publishes its envelopes on one pub/sub channel, tagged with its own random id, and
passes on every envelope another edge published. A hash maps each joined peer to the edge holding
its latest session, so that a relay message for a peer on another edge is sent there (and one for a
peer joined nowhere is refused at once). Outgoing commands go through one queue drained by one task:
they leave in order and never stall the event loop. Pub/sub keeps nothing: an edge that is down
misses what is published meanwhile, which is why it reads state from the store, never from events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from typing import Any

import orjson
import redis
import redis.asyncio

from .hub import Envelope

__all__ = ["CHANNEL", "PEERS", "RedisFanout"]

log = logging.getLogger(__name__)

CHANNEL = "dtn:hub"
PEERS = "dtn:peers"  # peer id -> the id of the edge holding its latest session
RETRY_S = 1.0
CLOSE_TIMEOUT_S = 5.0
# forget a peer's session only if no newer one, on another edge, has taken its place
_RELEASE = (
    "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end return 0"
)


class RedisFanout:
    def __init__(self, url: str) -> None:
        self.edge_id = secrets.token_hex(8)
        self._redis = redis.asyncio.Redis.from_url(url)
        self._release: Any = self._redis.register_script(_RELEASE)
        self._outbox: asyncio.Queue[tuple[str, bytes | str]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, deliver: Callable[[Envelope], None]) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(CHANNEL)  # subscribed before the edge serves: nothing after is missed
        self._tasks = [asyncio.create_task(self._listen(pubsub, deliver)), asyncio.create_task(self._send())]

    def broadcast(self, envelope: Envelope) -> None:
        self._outbox.put_nowait(("publish", orjson.dumps({**envelope, "edge": self.edge_id})))

    def joined(self, peer_id: str) -> None:
        self._outbox.put_nowait(("joined", peer_id))

    def left(self, peer_id: str) -> None:
        self._outbox.put_nowait(("left", peer_id))

    async def present(self, peer_id: str) -> bool:
        return bool(await self._redis.hexists(PEERS, peer_id))

    async def close(self) -> None:
        """Send what is queued (for at most ``CLOSE_TIMEOUT_S``), then stop listening."""
        if self._tasks:
            listener, sender = self._tasks
            self._outbox.put_nowait(("stop", b""))
            await asyncio.wait({sender}, timeout=CLOSE_TIMEOUT_S)
            for task in (sender, listener):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._redis.aclose()

    async def _send(self) -> None:
        while True:
            command, argument = await self._outbox.get()
            if command == "stop":
                return
            try:
                if command == "publish":
                    await self._redis.publish(CHANNEL, argument)
                elif command == "joined":
                    await self._redis.hset(PEERS, argument, self.edge_id)
                else:
                    await self._release(keys=[PEERS], args=[argument, self.edge_id])
            except redis.RedisError as exc:  # the others miss this one; the store keeps the state
                log.warning("redis %s failed: %s", command, exc)

    async def _listen(self, pubsub: Any, deliver: Callable[[Envelope], None]) -> None:
        while True:
            try:
                async for message in pubsub.listen():
                    envelope = orjson.loads(message["data"])
                    if envelope.get("edge") == self.edge_id:
                        continue
                    try:
                        deliver(envelope)
                    except (KeyError, TypeError, ValueError) as exc:  # written by another version of the edge
                        log.warning("dropping a malformed envelope from edge %s: %r", envelope.get("edge"), exc)
            except redis.RedisError as exc:
                log.warning("redis subscription lost (%s); retrying in %.0f s", exc, RETRY_S)
                await asyncio.sleep(RETRY_S)
