"""Rate limits: a token bucket, and one bucket per key (a peer id, a client address) for requests
that cost the edge work.

``RateLimiter`` is the interface the edge checks; ``KeyedRateLimiter`` keeps the buckets in this
process, ``server.ratelimit_redis.RedisRateLimiter`` in Redis, where every edge of a deployment
draws on one budget per key."""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from protocol.clock import SYSTEM_CLOCK, Clock

from .errors import RateLimited

__all__ = ["KeyedRateLimiter", "RateLimiter", "TokenBucket", "over_limit"]


class RateLimiter(Protocol):
    def check(self, key: str) -> None:
        """Count one request of ``key``; ``RateLimited`` when its bucket is empty."""
        ...


def over_limit(key: str, rate_per_s: float) -> RateLimited:
    return RateLimited(f"{key} is over {rate_per_s * 60:.0f} requests per minute")


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self.rate, self.capacity, self.tokens, self.clock = rate_per_s, burst, burst, clock
        self.stamp = clock.monotonic_s()

    def take(self) -> bool:
        now = self.clock.monotonic_s()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class KeyedRateLimiter:
    """``check(key)`` raises ``RateLimited`` past ``rate_per_s`` (burst ``burst``) for that key.

    Remembers the most recent ``max_keys`` keys; a forgotten key starts with a full bucket."""

    def __init__(self, rate_per_s: float, burst: float, max_keys: int = 100_000, clock: Clock = SYSTEM_CLOCK) -> None:
        self.rate_per_s, self.burst, self.max_keys, self.clock = rate_per_s, burst, max_keys, clock
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def check(self, key: str) -> None:
        bucket = self._buckets.pop(key, None) or TokenBucket(self.rate_per_s, self.burst, self.clock)
        self._buckets[key] = bucket
        if len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        if not bucket.take():
            raise over_limit(key, self.rate_per_s)
