"""When a validator closes a window: the rule every validator of a network computes alike. Pure.

A window closes as soon as it holds the experiment's ``min_candidates`` and every live lease has
delivered, or every live lease of a peer with a record has and the newcomers' grace is over; otherwise
at the deadline, ``factor`` × the median of the recent window durations, clamped to [``min_s``, the
experiment's ``window_timeout_s``] (with no history yet: ``window_timeout_s``).
At the deadline it closes whatever it holds, none included, once anyone leased in it: leases that
never deliver (a squatter holding every shard) delay the next head by one deadline at most, and never
stop the experiment. A window nobody leased waits for its first trainer instead of minting empty heads.
With a quorum, the validator ``turn`` places after the first proposer closes ``turn`` deadlines later
(``window_closes``).

The grace (``window_grace_s``: ``grace_factor`` × the same median; with no history, as long again as
the window took to hold its ``min_candidates``, the deadline until it does) is what
a lease of a peer without a record costs the window: fresh identities that lease and never deliver (a
squatter taking a new one every window) would otherwise hold every window to its deadline, many times
its usual length. A peer has a record (``DeliveryRecord``) while its last judged candidate was accepted
and no lease of its own lapsed undelivered since: a newcomer's work that misses the grace is one window
late, a delayed update, and gives it a record once accepted; a peer with a record that squats holds one
window to its deadline and loses it.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_DEADLINE",
    "DeadlinePolicy",
    "DeliveryRecord",
    "WindowProgress",
    "window_closes",
    "window_deadline_s",
    "window_grace_s",
]


@dataclass(frozen=True)
class DeadlinePolicy:
    factor: float = 3.0
    min_s: float = 5.0
    history: int = 10  # how many recent durations count
    grace_factor: float = 1.0  # × the median: how long newcomers' leases are waited for


DEFAULT_DEADLINE = DeadlinePolicy()


def window_deadline_s(recent_s: Sequence[float], max_s: float, policy: DeadlinePolicy = DEFAULT_DEADLINE) -> float:
    """The deadline for the next window, given the durations of the windows before it (oldest first)."""
    recent = list(recent_s)[-policy.history :]
    if not recent:
        return max_s
    return min(max(policy.factor * statistics.median(recent), policy.min_s), max_s)


def window_grace_s(
    recent_s: Sequence[float],
    max_s: float,
    policy: DeadlinePolicy = DEFAULT_DEADLINE,
    first_s: float | None = None,
) -> float:
    """How long after its head a window waits for the leases of peers without a record, once the others
    delivered: ``grace_factor`` × the median recent duration, never past the deadline. With no history
    yet (an experiment's first window, where no peer has a record either) the window's own pace stands in
    for it once known: ``first_s``, how long after the head the window held its ``min_candidates``; the
    grace is then as long again, ``(1 + grace_factor)`` × ``first_s``, so the slowest first window (a tab
    still starting its runtime) does not hold everyone else's: its work comes one window late, a delayed
    update. Unknown (``None``): the deadline."""
    recent = list(recent_s)[-policy.history :]
    deadline_s = window_deadline_s(recent, max_s, policy)
    if recent:
        return min(policy.grace_factor * statistics.median(recent), deadline_s)
    return deadline_s if first_s is None else min((1.0 + policy.grace_factor) * first_s, deadline_s)


@dataclass(frozen=True)
class WindowProgress:
    """Where an open window stands: ``candidates`` delivered on its head, ``leased`` leases granted in
    it (live or lapsed), ``outstanding`` live leases whose holder has a record and has not delivered,
    ``unproven`` those of holders without a record, ``elapsed_s`` since the validator saw its head."""

    candidates: int
    leased: int
    outstanding: int
    elapsed_s: float
    unproven: int = 0


def window_closes(
    progress: WindowProgress, *, min_candidates: int, deadline_s: float, grace_s: float | None = None, turn: int = 0
) -> bool:
    """Whether the validator ``turn`` places down the proposer order (0: first) closes the window now;
    ``grace_s``: how long newcomers' leases are waited for (``window_grace_s``; None: to the deadline)."""
    turn_s = turn * deadline_s
    if progress.elapsed_s >= deadline_s + turn_s:
        return progress.candidates > 0 or progress.leased > 0
    grace_over = progress.elapsed_s >= (deadline_s if grace_s is None else grace_s) + turn_s
    return (
        progress.candidates >= min_candidates
        and progress.outstanding == 0
        and (progress.unproven == 0 or grace_over)
        and progress.elapsed_s >= turn_s
    )


class DeliveryRecord:
    """The peers with a record: their last judged candidate was accepted and no lease of theirs lapsed
    undelivered since. Holds the ``capacity`` peers heard of last (a peer forgotten has no record)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._last: OrderedDict[str, bool] = OrderedDict()

    def judged(self, peer_id: str, accepted: bool) -> None:
        self._set(peer_id, accepted)

    def missed(self, peer_id: str) -> None:
        """A lease of ``peer_id`` lapsed, or its window closed, without its candidate."""
        self._set(peer_id, False)

    def __contains__(self, peer_id: object) -> bool:
        return self._last.get(peer_id, False) if isinstance(peer_id, str) else False

    def _set(self, peer_id: str, value: bool) -> None:
        self._last[peer_id] = value
        self._last.move_to_end(peer_id)
        while len(self._last) > self.capacity:
            self._last.popitem(last=False)
