"""The one injectable clock: wall time for what goes on the wire, monotonic time for durations.

Everything that reads time takes a ``Clock`` (default ``SYSTEM_CLOCK``); tests pass a
``ManualClock`` and move it forward instead of sleeping.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time in milliseconds since the epoch (timestamps in signed messages)."""
        ...

    def monotonic_s(self) -> float:
        """Seconds on a clock that never goes back (deadlines, durations, rate limits)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic_s(self) -> float:
        return time.monotonic()


@dataclass
class ManualClock:
    """A clock that moves only when told to."""

    wall_ms: int = 1_700_000_000_000
    mono_s: float = 0.0

    def now_ms(self) -> int:
        return self.wall_ms

    def monotonic_s(self) -> float:
        return self.mono_s

    def advance(self, seconds: float) -> None:
        self.wall_ms += int(seconds * 1000)
        self.mono_s += seconds


SYSTEM_CLOCK: Clock = SystemClock()
