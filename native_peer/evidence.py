"""Lease evidence (``protocol.evidence``) measured with a compiled ``Evaluator``: what validators run on
each candidate, and the attack suite as they do."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from protocol.evidence import EVIDENCE_EXAMPLES, EVIDENCE_STAGES, EvidenceDraw, evidence_decided

from .learner import Evaluator, JaxLearner, PyTree

__all__ = ["LeaseEvidence"]

Examples = tuple[np.ndarray, np.ndarray]
SHARD_CACHE_BYTES = 256 << 20  # decoded training shards a validator keeps for lease evidence


class LeaseEvidence:
    """The lease evidence z of candidates, a window at a time, measured in stages
    (``protocol.evidence.EVIDENCE_STAGES``: the first that decides). ``read`` gives a training shard's
    examples by id (``shard_ids``: the training split's); a window's control shards are read once,
    and a head's losses on each of them computed once, where a candidate's control needs them."""

    def __init__(
        self,
        learner: JaxLearner,
        evaluator: Evaluator,
        shard_ids: Sequence[str],
        read: Callable[[str], Examples],
        *,
        cache_bytes: int = SHARD_CACHE_BYTES,
    ) -> None:
        self.learner, self.evaluator, self.shard_ids, self._read = learner, evaluator, tuple(shard_ids), read
        self.cache_bytes = cache_bytes
        self._window: tuple[EvidenceDraw, list[Examples]] | None = None  # a window's draw and control shards
        self._head_losses: dict[str, dict[int, np.ndarray]] = {}  # head id -> control shard -> its losses there
        self._shards: OrderedDict[str, Examples] = OrderedDict()  # decoded shards, least recently used first
        self.reads = 0  # shards read and decoded (not from the cache)

    def read(self, shard_id: str) -> Examples:
        """A training shard's examples: decoded once while they fit in ``cache_bytes`` with the shards
        used since (a trainer's next lease holds many of its last one's shards, a window's control
        returns in later windows)."""
        cached = self._shards.get(shard_id)
        if cached is not None:
            self._shards.move_to_end(shard_id)
            return cached
        examples = self._read(shard_id)
        self.reads += 1
        self._shards[shard_id] = examples
        while sum(x.nbytes + y.nbytes for x, y in self._shards.values()) > self.cache_bytes and len(self._shards) > 1:
            self._shards.popitem(last=False)
        return examples

    def z(
        self,
        salt: bytes,
        head_id: str,
        head: Mapping[str, np.ndarray],
        trained: Mapping[str, np.ndarray],
        lease_id: str,
        lease_shards: Sequence[str],
        leased: Examples | None = None,
    ) -> float:
        """The evidence that ``trained`` (from ``head``, the head ``head_id`` it trained on) trained on
        lease ``lease_id`` of ``lease_shards``, in a window of tie-break ``salt``. ``leased``: the
        lease's examples when they are not its shards' (the attack suite's label-skewed peers).
        ``ValueError`` (from ``protocol.evidence``) when it cannot be measured."""
        draw, control_parts = self._control(salt)
        parts = [leased] if leased is not None else [self.read(s) for s in lease_shards]
        examples = sum(len(y) for _, y in parts)
        sizes = [len(y) for _, y in control_parts]
        before = self.learner.from_tensors(dict(head))
        after = self.learner.from_tensors({k: np.asarray(v, np.float32) for k, v in trained.items()})
        available = min(examples, EVIDENCE_EXAMPLES)
        for stage in EVIDENCE_STAGES:  # the first stage that decides (``protocol.evidence``)
            rows = draw.lease_rows(lease_id, examples, stage)
            control = draw.control_rows(lease_id, lease_shards, sizes, len(rows))
            held = self._held(head_id, before, control_parts, control)
            z = self.evaluator.lease_evidence(
                before, after, _gather(parts, rows), _gather(control_parts, control), held
            )
            if evidence_decided(z, len(rows), available):
                break
        return z

    def _held(self, head_id: str, before: PyTree, control_parts: Sequence[Examples], rows: np.ndarray) -> np.ndarray:
        """The head's losses on the control's sorted ``rows``, from its losses on the shards that hold
        them: each computed once per head and a whole shard at a time (the same figures whatever is
        asked first), and only where a lease's control reaches (outside a large lease, a few shards)."""
        bounds = np.cumsum([0, *(len(y) for _, y in control_parts)])
        shards = np.searchsorted(bounds, rows, side="right") - 1
        losses = self._head_losses.setdefault(head_id, {})
        held = np.empty(len(rows), np.float64)
        for i in np.unique(shards).tolist():
            if i not in losses:
                losses[i] = self.evaluator.losses(before, *control_parts[i])
            mine = shards == i
            held[mine] = losses[i][rows[mine] - bounds[i]]
        return held

    def _control(self, salt: bytes) -> tuple[EvidenceDraw, list[Examples]]:
        if self._window is None or self._window[0].salt != salt:
            draw = EvidenceDraw.of(salt, self.shard_ids)
            self._window = (draw, [self.read(s) for s in draw.control])
            self._head_losses = {}
        return self._window


def _gather(parts: Sequence[Examples], rows: np.ndarray) -> Examples:
    """The examples at sorted indices ``rows`` of ``parts`` concatenated, without concatenating them."""
    bounds = np.cumsum([0, *(len(y) for _, y in parts)])
    picked = []
    for (x, y), start, stop in zip(parts, bounds[:-1], bounds[1:], strict=True):
        mine = rows[np.searchsorted(rows, start) : np.searchsorted(rows, stop)] - start
        if len(mine):
            picked.append((x[mine], y[mine]))
    if not picked:
        return parts[0][0][:0], parts[0][1][:0]
    return np.concatenate([x for x, _ in picked]), np.concatenate([y for _, y in picked])
