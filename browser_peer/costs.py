"""``Costs``: what contributing costs the person and what it yields, as the page shows it.

Time since the peer started is split three ways: training (wall seconds inside a window's training,
the person's CPU share and pauses between batches included: what they chose to give; with the examples
trained in them, the tab's rate over any span), paused
(waiting before a lease while the tab is hidden or on battery) and waiting (the rest: leases,
downloads, uploads and the validator's next head). Bytes are counted per published window: what
was downloaded and sent since the window before it was published. Pure bookkeeping: the peer
passes every time in, read from its clock.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Costs"]


@dataclass
class Costs:
    started_s: float  # the peer's clock when it started
    training_s: float = 0.0
    trained_examples: int = 0
    paused_s: float = 0.0
    window_downloaded_bytes: int = 0  # since the window before the last was published
    window_sent_bytes: int = 0
    _marks: tuple[int, int] = (0, 0)  # downloaded and sent byte totals at the last publish

    def trained(self, seconds: float, examples: int = 0) -> None:
        self.training_s += seconds
        self.trained_examples += examples

    def paused(self, seconds: float) -> None:
        self.paused_s += seconds

    def published(self, downloaded_bytes: int, sent_bytes: int) -> None:
        """A window was published with these byte totals since the start."""
        self.window_downloaded_bytes = downloaded_bytes - self._marks[0]
        self.window_sent_bytes = sent_bytes - self._marks[1]
        self._marks = (downloaded_bytes, sent_bytes)

    def status(self, now_s: float) -> dict[str, float | int]:
        """The status fields at ``now_s``: wall, training, paused and waiting seconds (waiting is what
        is neither, never below 0), the examples trained and the last window's bytes each way."""
        wall = max(0.0, now_s - self.started_s)
        return {
            "wall_s": wall,
            "training_s": self.training_s,
            "trained_examples": self.trained_examples,
            "paused_s": self.paused_s,
            "waiting_s": max(0.0, wall - self.training_s - self.paused_s),
            "window_downloaded_bytes": self.window_downloaded_bytes,
            "window_sent_bytes": self.window_sent_bytes,
        }
