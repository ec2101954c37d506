"""``native_peer.activity.ActivityWatch``: a validator's rounds follow the edge's activity token, and what
a round does that decides nothing gives way once the token moves (here against a stand-in edge client
whose token moves when told; ``tests/test_native_peer.py`` runs a validator on a real edge)."""

from __future__ import annotations

import threading
import time

from native_peer.activity import ActivityWatch


class _Edge:
    """``EdgeClient.activity`` as the edge answers it: the token once it is not ``since``, or after ``wait_s``."""

    def __init__(self) -> None:
        self.token, self.asked = 0, 0
        self._changed = threading.Condition()

    def activity(self, since: str | None, wait_s: float) -> str:
        with self._changed:
            self.asked += 1
            self._changed.wait_for(lambda: since != str(self.token), wait_s)
            return str(self.token)

    def move(self) -> None:
        with self._changed:
            self.token += 1
            self._changed.notify_all()

    def close(self) -> None:
        self.move()


def test_a_watch_wakes_its_waiter_when_the_activity_moves_and_stays_quiet_until_it_does() -> None:
    edge = _Edge()
    watch = ActivityWatch(edge, long_poll_s=5.0)  # type: ignore[arg-type]
    try:
        watch.wait(1.0)  # the first round runs at once
        while edge.asked < 2:  # the watch read the token and waits for it to move
            time.sleep(0.01)
        watch.wait(0.0)
        assert watch.quiet()
        started = time.monotonic()
        watch.wait(0.2)  # nothing moved: it waited its time out
        assert time.monotonic() - started >= 0.2 and watch.quiet()
        threading.Timer(0.1, edge.move).start()
        started = time.monotonic()
        watch.wait(5.0)
        assert time.monotonic() - started < 2.0  # woken by the move, not the timeout
        edge.move()
        deadline = time.monotonic() + 2.0
        while watch.quiet():  # a move during a round: the round's work gives way
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        watch.close()
