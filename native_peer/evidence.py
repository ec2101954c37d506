"""Lease evidence (``protocol.evidence``) measured with a compiled ``Evaluator``: what validators run on
each candidate, and the attack suite as they do."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from protocol.evidence import EVIDENCE_EXAMPLES, EVIDENCE_STAGES, EvidenceDraw, evidence_decided, lease_evidence_z

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

        def lease_gains(rows: np.ndarray) -> np.ndarray:
            x, y = _gather(parts, rows)
            return self.evaluator.losses(before, x, y) - self.evaluator.losses(after, x, y)

        def control_gains(rows: np.ndarray) -> np.ndarray:
            held = self._held(head_id, before, control_parts, rows)
            return held - self.evaluator.losses(after, *_gather(control_parts, rows))

        available = min(examples, EVIDENCE_EXAMPLES)
        lease, control = _Gains.none(), _Gains.none()
        for stage in EVIDENCE_STAGES:  # the first stage that decides (``protocol.evidence``)
            lease = lease.extended(draw.lease_rows(lease_id, examples, stage), lease_gains)
            control = control.extended(draw.control_rows(lease_id, lease_shards, sizes, len(lease.rows)), control_gains)
            z = lease_evidence_z(lease.gains, control.gains)
            if evidence_decided(z, len(lease.rows), available):
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


@dataclass(frozen=True)
class _Gains:
    """Loss gains measured on sorted ``rows``: a stage's rows include the stage's before it
    (``EvidenceDraw``), whose gains are kept, so each row is measured once."""

    rows: np.ndarray
    gains: np.ndarray

    @classmethod
    def none(cls) -> _Gains:
        return cls(np.zeros(0, np.int64), np.zeros(0))

    def extended(self, rows: np.ndarray, measure: Callable[[np.ndarray], np.ndarray]) -> _Gains:
        """The gains on ``rows`` (a superset of these), measuring (``measure``) only the rows new here."""
        new = np.setdiff1d(rows, self.rows, assume_unique=True)
        if len(rows) - len(new) != len(self.rows):
            raise ValueError("a stage's rows must include the stage's before it")
        gains = np.empty(len(rows), np.float64)
        gains[np.searchsorted(rows, self.rows)] = self.gains
        if len(new):
            gains[np.searchsorted(rows, new)] = measure(new)
        return _Gains(rows, gains)


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
