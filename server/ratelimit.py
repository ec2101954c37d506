"""Rate limits: a token bucket, and one bucket per peer for HTTP requests that cost the edge work."""

from __future__ import annotations

from collections import OrderedDict

from protocol.clock import SYSTEM_CLOCK, Clock

from .errors import RateLimited

__all__ = ["PeerRateLimiter", "TokenBucket"]


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


class PeerRateLimiter:
    """``check(peer_id)`` raises ``RateLimited`` past ``rate_per_s`` (burst ``burst``) for that peer.

    Remembers the most recent ``max_peers`` peers; a forgotten peer starts with a full bucket."""

    def __init__(self, rate_per_s: float, burst: float, max_peers: int = 100_000, clock: Clock = SYSTEM_CLOCK) -> None:
        self.rate_per_s, self.burst, self.max_peers, self.clock = rate_per_s, burst, max_peers, clock
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def check(self, peer_id: str) -> None:
        bucket = self._buckets.pop(peer_id, None) or TokenBucket(self.rate_per_s, self.burst, self.clock)
        self._buckets[peer_id] = bucket
        if len(self._buckets) > self.max_peers:
            self._buckets.popitem(last=False)
        if not bucket.take():
            raise RateLimited(f"peer {peer_id} is over {self.rate_per_s * 60:.0f} requests per minute")
