"""Following the edge's activity token (``GET /v1/activity``, ``server.hub``) in a thread of its own, so
that a validator's round starts the moment something happens at the edge (a candidate, a lease, a head,
a quorum event) and work that decides nothing (``Validator.warm``, ``Validator.evaluate``) gives way to
the next round as soon as it does, instead of holding a candidate that arrived meanwhile."""

from __future__ import annotations

import logging
import threading

from protocol.backoff import Backoff

from .edge_client import EdgeClient

__all__ = ["ActivityWatch"]

log = logging.getLogger(__name__)

LONG_POLL_S = 20.0  # how long one request waits for the token to move (the edge caps it at its max_long_poll_s)


class ActivityWatch:
    """Whether the edge's activity moved since the last ``wait``, followed with ``edge`` (a client of
    its own: it holds a long poll at all times) until ``close``. An edge that cannot be asked counts as
    moved, so the caller's round meets the failure and handles it (its own back-off); the watch asks
    again after a back-off of its own."""

    def __init__(self, edge: EdgeClient, *, long_poll_s: float = LONG_POLL_S) -> None:
        self._edge = edge
        self._long_poll_s = long_poll_s
        self._moved = threading.Event()
        self._moved.set()  # the first round runs at once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="edge-activity", daemon=True)
        self._thread.start()

    @property
    def moved(self) -> bool:
        """Something happened at the edge since the last ``wait`` returned."""
        return self._moved.is_set()

    def quiet(self) -> bool:
        """Nothing happened at the edge since the last ``wait`` returned (``not moved``)."""
        return not self._moved.is_set()

    def wait(self, timeout_s: float) -> None:
        """Until the activity moved since the last call returned, or ``timeout_s``. What happens from
        its return on counts for the next call: a round that reads the edge after it misses nothing."""
        self._moved.wait(max(timeout_s, 0.0))
        self._moved.clear()

    def close(self) -> None:
        self._stop.set()
        self._moved.set()
        self._edge.close()

    def _follow(self) -> None:
        since: str | None = None
        backoff = Backoff(initial_s=0.2, max_s=10.0)
        while not self._stop.is_set():
            try:
                token = self._edge.activity(since, 0.0 if since is None else self._long_poll_s)
            except Exception as exc:  # the round that follows meets it too, and handles it
                if self._stop.is_set():
                    return
                log.debug("edge activity: %s", exc)
                self._moved.set()
                self._stop.wait(backoff.next_delay_s())
                continue
            backoff.reset()
            if token != since:
                since = token
                self._moved.set()
