"""When a validator closes a window: the rule every validator of a network computes alike. Pure.

A window closes as soon as it holds the experiment's ``min_candidates`` and every live lease has
delivered; otherwise at the deadline, ``factor`` × the median of the recent full-window durations,
clamped to [``min_s``, the experiment's ``window_timeout_s``] (with no history yet: ``window_timeout_s``).
At the deadline it closes whatever it holds, none included, once anyone leased in it: leases that
never deliver (a squatter holding every shard) delay the next head by one deadline at most, and never
stop the experiment. A window nobody leased waits for its first trainer instead of minting empty heads.
With a quorum, the validator ``turn`` places after the first proposer closes ``turn`` deadlines later
(``window_closes``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_DEADLINE", "DeadlinePolicy", "WindowProgress", "window_closes", "window_deadline_s"]


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


@dataclass(frozen=True)
class WindowProgress:
    """Where an open window stands: ``candidates`` delivered on its head, ``leased`` leases granted in
    it (live or lapsed), ``outstanding`` live leases whose holder has not delivered, ``elapsed_s``
    since the validator saw its head."""

    candidates: int
    leased: int
    outstanding: int
    elapsed_s: float


def window_closes(progress: WindowProgress, *, min_candidates: int, deadline_s: float, turn: int = 0) -> bool:
    """Whether the validator ``turn`` places down the proposer order (0: first) closes the window now."""
    turn_s = turn * deadline_s
    if progress.elapsed_s >= deadline_s + turn_s:
        return progress.candidates > 0 or progress.leased > 0
    return progress.candidates >= min_candidates and progress.outstanding == 0 and progress.elapsed_s >= turn_s
