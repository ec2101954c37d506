"""How many shards a continuous trainer asks for: enough to keep its core busy while windows are judged.

A continuous trainer trains the next window's lease while the last window is judged (decision 0011).
Once that lease is trained it can only wait for the next head: the wait is compute the network did not
get. ``next_lease_shards`` sizes the next lease from the last one, its training time t and the wait w
that followed it: to fill the window period it saw, ``n × (t + w) / t`` shards, within the experiment's
bounds (``ExperimentSpec.lease_shards``). After ``CALM_WINDOWS`` windows in a row in which it did not
wait (it was the one the window waited for) it gives one shard back, and when its work came too late for
its window (a newer head arrived while it trained) it halves: so a fleet of trainers settles on windows
the validator's pace (or the slowest trainer's lease) sets, instead of ratcheting them up to the bound
on measurement noise (a wait under ``IDLE_SLACK`` of the training time counts as none). Giving shards
back only after calm windows keeps a lone trainer whose validator just keeps up from oscillating
around the size at which it waits (decision 0043). Pure: every trainer, native or browser, computes
the same sizes from the same measurements.

``granted_shards`` is the edge's side: how many of the free shards of a window a lease may take. More
than the experiment's least only out of what is free beyond a reserve of the least for each peer
expected in the window (one that leased in the window before and has not leased in this one yet) and
for one newcomer: a trainer alone takes what keeps its core busy (half the free shards, the rule before,
left a lone trainer waiting a third of its time), and nobody who trained last window, nor the next
peer to join, finds the window full. Peers with accepted work are served first in a contended window
(issue #27): a peer without a record (no accepted candidate) takes nothing of the least kept for each
expected peer that has one, so identities made up by the dozen can fill only what the peers with a
record leave, never their share; while nobody has a record (a new network) everyone is a newcomer.
"""

from __future__ import annotations

import math

__all__ = ["CALM_WINDOWS", "IDLE_SLACK", "granted_shards", "next_lease_shards", "waited"]

IDLE_SLACK = 0.05  # a wait under this share of the training time counts as none (measurement noise)
CALM_WINDOWS = 3  # windows in a row without a wait before a trainer gives a shard back


def waited(train_s: float, idle_s: float) -> bool:
    """Whether ``idle_s`` seconds of waiting after ``train_s`` of training count as a wait."""
    return train_s > 0.0 and idle_s > IDLE_SLACK * train_s


def next_lease_shards(
    shards: int, train_s: float, idle_s: float, *, least: int, most: int, late: bool = False, calm: int = 0
) -> tuple[int, int]:
    """The next lease's shard count, always within [``least``, ``most``], after one of ``shards`` shards
    trained in ``train_s`` seconds and followed by ``idle_s`` seconds of waiting for the next head
    (``late``: the work missed its window), and the ``calm`` to pass with the next: the windows in a
    row that did not wait nor come late since the last shard given back (``calm`` here: those before
    this one)."""
    if late:
        size, calm = shards // 2, 0
    elif train_s <= 0.0:  # nothing measured: the size and the calm windows as they were
        size = shards
    elif waited(train_s, idle_s):
        size, calm = math.ceil(shards * (train_s + idle_s) / train_s), 0
    elif calm + 1 >= CALM_WINDOWS:
        size, calm = shards - 1, 0
    else:
        size, calm = shards, calm + 1
    return min(max(size, least), most), calm


def granted_shards(asked: int, free: int, *, least: int, expected_peers: int, served_first: int = 0) -> int:
    """How many shards a lease asking for ``asked`` (within the experiment's bounds already) gets when
    ``free`` shards of its window are unleased and ``expected_peers`` other peers are expected in it, of
    which ``served_first`` have a record that the asking peer lacks (0 for a peer with a record); at
    most ``free`` (0: the window is full, or full but for the least of peers served first)."""
    spare = free - least * (expected_peers + 1)
    return max(0, min(asked, max(least, spare), free - least * served_first))
