"""Retry back-off, pure: how long to wait before the next attempt. The caller does the waiting
(``threading.Event.wait``, ``time.sleep`` or ``asyncio.sleep``), so one rule serves native peers,
validators, the edge client and the browser peer alike."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass
class Backoff:
    """Exponential back-off: ``initial_s``, then × ``factor`` per failure, at most ``max_s``."""

    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    failures: int = 0

    def next_delay_s(self) -> float:
        """Record a failure and return how long to wait before trying again."""
        delay = min(self.max_s, self.initial_s * self.factor**self.failures)
        self.failures += 1
        return delay

    def reset(self) -> None:
        """An attempt succeeded: the next failure starts from ``initial_s`` again."""
        self.failures = 0
