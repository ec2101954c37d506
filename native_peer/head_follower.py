"""Following an experiment's head in the background, so that a trainer's next window starts from memory.

A ``HeadFollower`` long-polls the edge for a head newer than the last it saw (``GET …/head?after=``)
and downloads and decodes each new head's artifact at once, in its own thread. A trainer reads the
latest head (``current``) or waits for one newer than a given head (``newer``) without a request of
its own on its critical path: while it trains, the next head is already on its way.

A head is handed out only with its artifact's tensors. A head whose parent's artifact is on disk comes
as a delta from it (``protocol.head_delta``: rebuilt exactly and checked against the head's content
id), else, or when the edge serves no delta or it does not rebuild the head, as the whole artifact.
Only the newest ``KEEP_HEADS`` head artifacts stay on disk. Trust is the caller's to check (``protocol.window.head_to_train``): the follower only
fetches. When the edge cannot be reached the follower retries with back-off
(``protocol.backoff``), and a caller that has no head yet gets the error it met.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from protocol.backoff import Backoff
from protocol.codec import decode_tensors
from protocol.errors import ProtocolError
from protocol.head_delta import apply_delta
from protocol.ids import ContentId, ExperimentKey, HeadId
from protocol.messages import HeadDescriptor

from .edge_client import EdgeClient
from .storage import StorageConfig, write_atomic

__all__ = ["KEEP_HEADS", "FollowedHead", "HeadFollower"]

log = logging.getLogger(__name__)

DELTA_SLACK_BYTES = 1 << 16  # a delta larger than its base by more than this is not taken
KEEP_HEADS = 3  # head artifacts a follower keeps on disk: the newest ones (a trainer reconciles onto the latest)
LONG_POLL_S = 20.0  # how long one request waits for a newer head (the edge caps it at its max_long_poll_s)
NO_HEAD_POLL_S = 0.2  # between asks while the experiment has no head yet (there is nothing to wait on)


@dataclass(frozen=True)
class FollowedHead:
    head: HeadDescriptor
    tensors: dict[str, np.ndarray]


class HeadFollower:
    """The newest head of ``key`` the edge serves, with its tensors, kept up to date by a daemon thread."""

    def __init__(
        self,
        edge: EdgeClient,
        key: ExperimentKey,
        storage: StorageConfig,
        *,
        on_head: Callable[[HeadDescriptor], None] | None = None,
    ) -> None:
        """``on_head``: called with each new head, before anyone is handed it, in the thread that took it
        (the follower's, or the caller's of ``refresh`` or ``reach``)."""
        self._edge = edge
        self._on_head = on_head
        self._key = key
        self._storage = storage
        self._changed = threading.Condition()
        self._taking = threading.Lock()
        self._latest: FollowedHead | None = None
        self._answered = False  # the edge answered (with a head or none) or failed at least once
        self._error: Exception | None = None  # the last request's failure, cleared by the next success
        self._stop = threading.Event()
        self._kept: list[ContentId] = []
        self.delta_bytes = 0  # head deltas downloaded
        self._thread = threading.Thread(target=self._follow, name=f"head-{key}", daemon=True)
        self._thread.start()

    def current(self, timeout_s: float = 60.0) -> FollowedHead | None:
        """The newest head fetched so far (``None``: the experiment has none yet). Waits for the edge's
        first answer; raises the error met when there is no head to give."""
        with self._changed:
            self._changed.wait_for(lambda: self._answered or self._stop.is_set(), timeout_s)
            if self._latest is None and self._error is not None:
                raise self._error
            return self._latest

    def refresh(self) -> FollowedHead | None:
        """Ask the edge for its current head now (one request, in the caller's thread), then as
        ``current``: for a caller that must not miss a head promoted a moment ago."""
        head = self._edge.current_head(self._key)
        if head is not None:
            self._take(head)
        return self.current()

    def newer(self, than: HeadId | None, wait_s: float) -> FollowedHead | None:
        """The newest head once it is not ``than`` (``None``: once there is one), waiting up to
        ``wait_s``; after that, the newest fetched (``than`` itself when none came)."""
        self.current()
        with self._changed:
            self._changed.wait_for(lambda: self._latest is not None and self._latest.head.head_id != than, wait_s)
            return self._latest

    def reach(self, head_id: HeadId) -> FollowedHead | None:
        """Head ``head_id`` (unverified) with its tensors: the newest held when it is that one, else read
        from the edge and downloaded now; ``None`` when the edge has no such head or a newer one is held
        already (the head handed on never goes back)."""
        latest = self.current()
        if latest is not None and latest.head.head_id == head_id:
            return latest
        descriptor = self._edge.head(self._key, head_id)
        if descriptor is None:
            return None
        self._take(descriptor)
        latest = self.current()
        return latest if latest is not None and latest.head.head_id == head_id else None

    def close(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()

    def _follow(self) -> None:
        backoff = Backoff(initial_s=0.2, max_s=10.0)
        while not self._stop.is_set():
            known = self._latest.head.head_id if self._latest is not None else None
            try:
                head = self._edge.current_head(self._key, after=known, wait_s=LONG_POLL_S if known else 0.0)
                if head is not None:
                    self._take(head)
                else:
                    self._publish(None)
                backoff.reset()
            except Exception as exc:  # any failure is the caller's to see; the thread goes on
                if self._stop.is_set():
                    return
                self._publish(None, exc)
                delay_s = backoff.next_delay_s()
                log.warning("following %s: %s; retrying in %.1f s", self._key, exc, delay_s)
                self._stop.wait(delay_s)
                continue
            if head is None or self._latest is None or self._latest.head.head_id != head.head_id:
                self._stop.wait(NO_HEAD_POLL_S)  # no head yet, or an older one than held: asking at once would spin

    def _take(self, head: HeadDescriptor) -> None:
        """Make ``head`` the latest, its artifact downloaded, unless the latest is as new already."""
        with self._taking:  # one download of a head at a time: the thread's and a ``refresh``
            latest = self._latest
            if latest is not None and (latest.head.head_id == head.head_id or latest.head.window > head.window):
                self._publish(None)
                return
            followed = FollowedHead(head, self._download(head))
            if self._on_head is not None:
                self._on_head(head)
            self._publish(followed)

    def _publish(self, followed: FollowedHead | None, error: Exception | None = None) -> None:
        with self._changed:
            if followed is not None:
                self._latest = followed
            self._answered, self._error = True, error
            self._changed.notify_all()

    def _download(self, head: HeadDescriptor) -> dict[str, np.ndarray]:
        path = self._storage.head_path(head.head_id)
        data = self._from_delta(head)
        if data is None:
            data = self._edge.artifact(head.head_id, path)
        else:
            write_atomic(path, data)
        tensors, _ = decode_tensors(data)
        self._kept = [cid for cid in self._kept if cid != head.head_id] + [head.head_id]
        for old in self._kept[:-KEEP_HEADS]:
            self._storage.head_path(old).unlink(missing_ok=True)
        self._kept = self._kept[-KEEP_HEADS:]
        return tensors

    def _from_delta(self, head: HeadDescriptor) -> bytes | None:
        """``head``'s artifact rebuilt from its parent's, kept here, and the edge's delta; None when the
        parent is not kept, the edge serves no delta, or the delta does not rebuild the head."""
        if head.parent is None or head.parent not in self._kept:
            return None
        try:
            base = self._storage.head_path(head.parent).read_bytes()
        except OSError:
            return None
        delta = self._edge.head_delta(self._key, head.head_id, head.parent, max_bytes=len(base) + DELTA_SLACK_BYTES)
        if delta is None:
            return None
        try:
            data = apply_delta(base, head.parent, delta, head.head_id)
        except ProtocolError as exc:
            log.warning("head %s: its delta is unusable (%s); downloading the head", head.head_id, exc)
            return None
        self.delta_bytes += len(delta)
        return data
