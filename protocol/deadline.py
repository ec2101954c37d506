"""When a validator closes a window it is waiting on: derived from how long recent windows took.

A window closes as soon as every live lease has delivered; otherwise at the deadline, ``factor`` ×
the median of the recent full-window durations, clamped to [``min_s``, the experiment's
``window_timeout_s``]. With no history yet the deadline is ``window_timeout_s``. Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_DEADLINE", "DeadlinePolicy", "window_deadline_s"]


@dataclass(frozen=True)
class DeadlinePolicy:
    factor: float = 3.0
    min_s: float = 5.0
    history: int = 10  # how many recent durations count


DEFAULT_DEADLINE = DeadlinePolicy()


def window_deadline_s(recent_s: Sequence[float], max_s: float, policy: DeadlinePolicy = DEFAULT_DEADLINE) -> float:
    """The deadline for the next window, given the durations of the windows before it (oldest first)."""
    recent = list(recent_s)[-policy.history :]
    if not recent:
        return max_s
    return min(max(policy.factor * statistics.median(recent), policy.min_s), max_s)
