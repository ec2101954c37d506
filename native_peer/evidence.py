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
HEADS_KEPT = 2  # heads whose losses are kept: the current one and its parent (a delayed update's base)


class LeaseEvidence:
    """The lease evidence z of candidates, a window at a time, measured in stages
    (``protocol.evidence.EVIDENCE_STAGES``: the first that decides). ``read`` gives a training shard's
    examples by id (``shard_ids``: the training split's); a window's control shards are read once.
    A head's losses on a whole shard are computed once: on the control shards a candidate's control
    needs, and ahead (``prepare``) on the shards of leases whose candidates have not arrived, so that
    measuring a candidate runs only the candidate's side there. Head ids name parameters (content ids)."""

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
        # head id -> training shard id -> the head's losses on the whole shard (the newest HEADS_KEPT heads)
        self._head_losses: OrderedDict[str, dict[str, np.ndarray]] = OrderedDict()
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
        known = self._known(head_id)

        def lease_gains(rows: np.ndarray) -> np.ndarray:
            x, y = _gather(parts, rows)
            held, missing = _lookup(known, () if leased is not None else lease_shards, parts, rows)
            if missing.all():
                held = self.evaluator.losses(before, x, y)
            elif missing.any():
                held[missing] = self.evaluator.losses(before, x[missing], y[missing])
            return held - self.evaluator.losses(after, x, y)

        def control_gains(rows: np.ndarray) -> np.ndarray:
            held = self._held(known, before, draw.control, control_parts, rows)
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

    def prepare(self, head_id: str, head: Callable[[], Mapping[str, np.ndarray]], shard_ids: Sequence[str]) -> int:
        """Compute the losses of head ``head_id`` (its parameters: ``head()``, asked only when needed) on
        each of ``shard_ids`` it has none on yet, a whole shard at a time: work a validator does while
        the candidates of those shards' leases train, so that measuring them takes only their own
        losses there. The number of shards computed."""
        known = self._known(head_id)
        todo = [s for s in dict.fromkeys(shard_ids) if s not in known]
        if todo:
            before = self.learner.from_tensors(dict(head()))
            for shard_id in todo:
                known[shard_id] = self.evaluator.losses(before, *self.read(shard_id))
        return len(todo)

    def _known(self, head_id: str) -> dict[str, np.ndarray]:
        """The head's losses computed so far, by shard; only the newest ``HEADS_KEPT`` heads' are kept."""
        known = self._head_losses.setdefault(head_id, {})
        self._head_losses.move_to_end(head_id)
        while len(self._head_losses) > HEADS_KEPT:
            self._head_losses.popitem(last=False)
        return known

    def _held(
        self,
        known: dict[str, np.ndarray],
        before: PyTree,
        control: Sequence[str],
        control_parts: Sequence[Examples],
        rows: np.ndarray,
    ) -> np.ndarray:
        """The head's losses on the control's sorted ``rows``, from its losses on the shards that hold
        them (``known``, filled here a whole shard at a time: the same figures whatever is asked first),
        computed only where a lease's control reaches (outside a large lease, a few shards)."""
        bounds = np.cumsum([0, *(len(y) for _, y in control_parts)])
        for i in np.unique(np.searchsorted(bounds, rows, side="right") - 1).tolist():
            if control[i] not in known:
                known[control[i]] = self.evaluator.losses(before, *control_parts[i])
        held, _ = _lookup(known, control, control_parts, rows)
        return held

    def _control(self, salt: bytes) -> tuple[EvidenceDraw, list[Examples]]:
        if self._window is None or self._window[0].salt != salt:
            draw = EvidenceDraw.of(salt, self.shard_ids)
            self._window = (draw, [self.read(s) for s in draw.control])
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


def _lookup(
    known: Mapping[str, np.ndarray], shard_ids: Sequence[str], parts: Sequence[Examples], rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Losses at the sorted ``rows`` of ``parts`` (the shards ``shard_ids``; none: examples of no shard)
    concatenated, from ``known``'s losses on whole shards, and the mask of the rows ``known`` lacks."""
    held, missing = np.zeros(len(rows), np.float64), np.ones(len(rows), bool)
    if not shard_ids:
        return held, missing
    bounds = np.cumsum([0, *(len(y) for _, y in parts)])
    owner = np.searchsorted(bounds, rows, side="right") - 1
    for i in np.unique(owner).tolist():
        losses = known.get(shard_ids[i])
        if losses is not None:
            mine = owner == i
            held[mine], missing[mine] = losses[rows[mine] - bounds[i]], False
    return held, missing


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
