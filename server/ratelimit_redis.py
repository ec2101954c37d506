"""``RedisRateLimiter``: per-key token buckets kept in Redis, so that every edge of a deployment
draws on one budget per peer or client address (``server.ratelimit``).

Each bucket is a hash (tokens, stamp) refilled and taken from in one Lua script on the Redis
server's clock, so edges with skewed clocks agree; a bucket left alone until it would be full again
expires, which is the same as a full one."""

from __future__ import annotations

from typing import Any

import redis

from .ratelimit import over_limit

__all__ = ["RedisRateLimiter"]

_TAKE = """
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local bucket = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens = math.min(burst, (tonumber(bucket[1]) or burst) + (now - (tonumber(bucket[2]) or now)) * rate)
local taken = 0
if tokens >= 1 then
    tokens = tokens - 1
    taken = 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'stamp', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return taken
"""


class RedisRateLimiter:
    """``check(key)`` raises ``RateLimited`` past ``rate_per_s`` (burst ``burst``) for that key, counted
    over every edge that shares ``client`` and ``name``."""

    def __init__(self, client: redis.Redis, name: str, rate_per_s: float, burst: float) -> None:
        self.name, self.rate_per_s, self.burst = name, rate_per_s, burst
        self._take: Any = client.register_script(_TAKE)

    def check(self, key: str) -> None:
        if not self._take(keys=[f"dtn:rate:{self.name}:{key}"], args=[self.rate_per_s, self.burst]):
            raise over_limit(key, self.rate_per_s)
