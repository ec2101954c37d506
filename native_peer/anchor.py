"""The validator's own update, the anchor that screens a window's candidates (decisions 0002, 0003, 0017).

An ``Anchor`` trains from the head of an anchor window (``protocol.judging.anchor_window``: every
``ExperimentSpec.anchor_every``-th window) on the validator's reference split, and keeps that update
Δ_ref = θ_ref − θ_anchor for the windows up to the next anchor: the reference a window is judged
against is its own base + Δ_ref. In the anchor window itself that is θ_ref bit for bit (a float64
difference of two float32 arrays is exact, and adding it back rounds to the same float32). Validators,
the attack suite and the benchmarks use this one class, so what the suite scores is what validators do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from protocol.judging import reference_batches

from .learner import TrainEngine

__all__ = ["Anchor"]


class Anchor:
    """Δ_ref of one experiment's lineage, trained once per anchor head.

    ``x``, ``y``: the reference split (examples no trainer is leased); ``steps`` optimizer steps at
    ``batch_size`` (``protocol.judging.reference_steps``, ``REFERENCE_BATCH_FACTOR`` × the trainers'
    batch), batches drawn by ``reference_batches`` from the anchor head's id, a fresh optimizer: the
    same bytes at every validator holding the same prepared dataset."""

    def __init__(self, engine: TrainEngine, x: np.ndarray, y: np.ndarray, steps: int, batch_size: int) -> None:
        self.engine, self.x, self.y = engine, x, y
        self.steps, self.batch_size = steps, batch_size
        self._held: tuple[str, dict[str, np.ndarray]] | None = None  # (anchor head id, Δ_ref in float64)
        self.trained = 0  # anchor updates trained so far (each ``examples`` examples)

    @property
    def examples(self) -> int:
        """Examples one anchor update trains on."""
        return self.steps * self.batch_size

    def prepare(
        self,
        anchor_head: str,
        anchor_params: Callable[[], Mapping[str, np.ndarray]],
        learning_rate: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Δ_ref of ``anchor_head`` (float64), trained from ``anchor_params()`` at ``learning_rate``
        (the optimizer's own when ``None``) unless this anchor holds it already."""
        if self._held is None or self._held[0] != anchor_head:
            start = anchor_params()
            index = reference_batches(anchor_head, len(self.x), self.steps, self.batch_size)
            trained = self.engine.fresh_window(start, self.x[index], self.y[index], learning_rate)
            delta = {k: trained[k].astype(np.float64) - np.asarray(start[k], np.float64) for k in trained}
            self._held = (anchor_head, delta)
            self.trained += 1
        return self._held[1]

    def reference(
        self,
        base: Mapping[str, np.ndarray],
        anchor_head: str,
        anchor_params: Callable[[], Mapping[str, np.ndarray]],
        learning_rate: float | None = None,
    ) -> dict[str, np.ndarray]:
        """θ_ref for the window on ``base``: ``base`` + Δ_ref of ``anchor_head`` (``prepare``)."""
        delta = self.prepare(anchor_head, anchor_params, learning_rate)
        return {k: (np.asarray(base[k], np.float64) + delta[k]).astype(np.float32) for k in delta}
