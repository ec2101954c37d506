"""How many shards a continuous trainer's next lease asks for, in one experiment.

The trainer's thread sizes the next lease when it has trained a window's lease; the head follower's
thread sizes it when a head arrives while that lease waits, trained (``Trainer._on_head``), so the lease
is asked for at once. Both count the waits that a larger lease would have hidden. ``LeaseSizer`` holds
what they share (the waits counted since the last sizing, the calm windows, the size, the head it was
last sized on) behind one lock, and sizes at most once per head: a wait counted and sized on at a
head's arrival is not counted again when the trainer wakes on that head. The rule itself is
``protocol.lease_size.next_lease_shards``.
"""

from __future__ import annotations

import threading

from protocol.ids import HeadId
from protocol.lease_size import next_lease_shards

__all__ = ["LeaseSizer"]


class LeaseSizer:
    """The next lease's size for one experiment, within ``least`` and ``most`` shards; ``shards`` is
    ``None`` (the experiment's default) until the first sizing."""

    def __init__(self, least: int, most: int) -> None:
        self.least, self.most = least, most
        self._lock = threading.Lock()
        self._shards: int | None = None
        self._idle_s = 0.0  # waited since the last sizing
        self._calm = 0  # windows in a row sized without a wait (``next_lease_shards``)
        self._sized_on: HeadId | None = None

    @property
    def shards(self) -> int | None:
        with self._lock:
            return self._shards

    @property
    def idle_s(self) -> float:
        """Seconds waited since the last sizing, not yet sized on."""
        with self._lock:
            return self._idle_s

    def waited(self, seconds: float, *, until: HeadId | None = None) -> None:
        """Count ``seconds`` of waiting for a head or a lease; not when the wait ended with the head
        ``until`` and the lease was sized on that head's arrival (that wait was counted then)."""
        with self._lock:
            if until is None or until != self._sized_on:
                self._idle_s += seconds

    def size(self, on: HeadId, shards: int, train_s: float, *, waited_s: float = 0.0, late: bool = False) -> None:
        """Size the lease after the head ``on`` from one of ``shards`` shards trained in ``train_s``
        seconds, ``waited_s`` more seconds waited, and the waits counted since the last sizing (``late``:
        the work missed its window). Once per head: a second sizing on ``on`` changes nothing."""
        with self._lock:
            if on == self._sized_on:
                return
            idle_s, self._idle_s = self._idle_s + waited_s, 0.0
            self._shards, self._calm = next_lease_shards(
                shards, train_s, idle_s, least=self.least, most=self.most, late=late, calm=self._calm
            )
            self._sized_on = on
