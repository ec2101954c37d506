"""``Once``: what the edge accepts only once within a while, such as a validator's read proof
(``admission.reads_as_validator``), so that a proof seen on the way cannot be presented again.

``LocalOnce`` remembers in this process, ``RedisOnce`` in Redis, where every edge of a deployment sees
the same keys. Both forget a key once its time is up: by then what it stands for is refused as stale
anyway. Memory is bounded by how many keys are recorded within that time, and only keys that passed
their checks (a verified signature of a listed key) are recorded."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol

from protocol.clock import SYSTEM_CLOCK, Clock

from .errors import RateLimited

__all__ = ["LocalOnce", "Once", "RedisOnce"]


class Once(Protocol):
    def first(self, key: str, ttl_ms: int) -> bool:
        """Record ``key`` for ``ttl_ms``; False when it was recorded already and its time is not up."""
        ...


class LocalOnce:
    """``Once`` in this process: at most ``max_keys`` keys at a time (past it ``RateLimited``, never a
    key forgotten early)."""

    def __init__(self, max_keys: int = 100_000, clock: Clock = SYSTEM_CLOCK) -> None:
        self.max_keys, self.clock = max_keys, clock
        self._until: OrderedDict[str, int] = OrderedDict()  # key -> when it may be forgotten, in that order

    def first(self, key: str, ttl_ms: int) -> bool:
        now_ms = self.clock.now_ms()
        while self._until and next(iter(self._until.values())) <= now_ms:
            self._until.popitem(last=False)
        if key in self._until:
            return False
        if len(self._until) >= self.max_keys:
            raise RateLimited(f"over {self.max_keys} one-time proofs at once; try again shortly")
        latest = next(reversed(self._until.values()), 0)
        self._until[key] = max(now_ms + ttl_ms, latest)  # in order, so the oldest is always first
        return True


class RedisOnce:
    """``Once`` in Redis (``SET NX PX``): a key recorded by any edge that shares ``client``."""

    def __init__(self, client: Any, name: str) -> None:
        self.client, self.name = client, name

    def first(self, key: str, ttl_ms: int) -> bool:
        return bool(self.client.set(f"dtn:once:{self.name}:{key}", b"1", nx=True, px=ttl_ms))
