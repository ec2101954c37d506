"""``Guest``: how much of the person's machine the browser peer may use, and when.

The page decides (``static/app.js``): it pauses the peer while the tab is hidden or the device runs
on battery (unless the person allows either) and sets the CPU share from its control. The peer asks
``Guest`` between batches: paused, it waits there; at a share below 1 it rests after each batch in
proportion to the batch's compute time (a share of 0.5 rests as long as it worked). It also waits
before asking for a lease, so a paused tab never holds shards it does not train on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["MIN_SHARE", "YIELD_EVERY_S", "Guest"]

MIN_SHARE = 0.1
YIELD_EVERY_S = 0.1  # compute between two yields at full share


class Guest:
    def __init__(self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.share = 1.0
        self.reason: str | None = None  # why the peer is paused; None while it may run
        self._running = asyncio.Event()
        self._running.set()
        self._sleep = sleep
        self._since_yield_s = 0.0

    def pause(self, reason: str) -> None:
        self.reason = reason
        self._running.clear()

    def resume(self) -> None:
        self.reason = None
        self._running.set()

    def set_share(self, share: float) -> None:
        """The fraction of one core's time to train (clamped to [``MIN_SHARE``, 1])."""
        self.share = min(1.0, max(MIN_SHARE, float(share)))

    async def admit(self) -> None:
        """Return once the peer may run (at once unless paused)."""
        await self._running.wait()

    async def after_batch(self, batch_s: float) -> None:
        """Rest for the share, then wait while paused. At full share it yields to the event loop (where
        the page's messages arrive) once ``YIELD_EVERY_S`` of batches have run since the last yield: in
        a browser each yield is a timer, which browsers hold back by a few milliseconds once nested,
        and a batch takes a few milliseconds with the kernels."""
        self._since_yield_s += batch_s
        rest = batch_s * (1.0 / self.share - 1.0)
        if rest > 0 or self._since_yield_s >= YIELD_EVERY_S:
            self._since_yield_s = 0.0
            await self._sleep(rest)
        await self._running.wait()
