"""Lease evidence measured in stages (``protocol.evidence.EVIDENCE_STAGES``) by ``native_peer.evidence``:
the whole draw is read only where the first stage does not decide, with a stub evaluator that records
the rows of each stage it measured."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest

from native_peer.evidence import LeaseEvidence
from protocol.evidence import EvidenceDraw


class _StagedEvaluator:
    """An evaluator whose evidence is ``z_at(rows)``, recording the rows of each stage it measured."""

    def __init__(self, z_at: Callable[[int], float]) -> None:
        self.z_at, self.stages = z_at, []

    def losses(self, params: object, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.zeros(len(y))

    def lease_evidence(self, before: object, after: object, lease: tuple, control: tuple, held: object) -> float:
        assert len(lease[1]) == len(control[1])  # as many control rows as lease rows
        self.stages.append(len(lease[1]))
        return self.z_at(len(lease[1]))


@pytest.mark.parametrize(
    ("lease_shards", "z_at", "stages"),
    [
        (20, lambda rows: 3.0 * (rows / 1000) ** 0.5, [4000]),  # honest: z 6 on the first stage decides
        (20, lambda rows: 1.0, [4000, 16_000]),  # near the bounds: measured on the whole draw
        (20, lambda rows: 3.0 if rows < 16_000 else 1.5, [4000, 16_000]),  # 3 < 4: read on
        (2, lambda rows: 0.5, [2000]),  # a lease smaller than the first stage: all of it, once
        (10, lambda rows: 1.0, [4000, 10_000]),  # the second stage reads the whole lease
    ],
)
def test_lease_evidence_reads_the_whole_draw_only_where_the_first_stage_does_not_decide(
    lease_shards: int, z_at: Callable[[int], float], stages: list[int]
) -> None:
    shard_ids = [f"train-{i:05d}" for i in range(40)]
    evaluator = _StagedEvaluator(z_at)
    learner = SimpleNamespace(from_tensors=lambda tensors: tensors)
    evidence = LeaseEvidence(learner, evaluator, shard_ids, lambda shard: (np.zeros((1000, 1)), np.zeros(1000)))  # type: ignore[arg-type]
    lease = [s for s in shard_ids if s not in EvidenceDraw.of(b"salt", shard_ids).control][:lease_shards]
    z = evidence.z(b"salt", "head", {}, {}, "lease-1", lease)
    assert evaluator.stages == stages and z == z_at(stages[-1])


def test_a_validator_decodes_each_training_shard_once_while_its_cache_holds_it() -> None:
    shard_ids = [f"train-{i:05d}" for i in range(40)]
    learner = SimpleNamespace(from_tensors=lambda tensors: tensors)

    used = {s for w in range(3) for s in shard_ids[w * 2 : w * 2 + 10]} | {
        s for w in range(3) for s in EvidenceDraw.of(f"salt-{w}".encode(), shard_ids).control
    }

    def measured(cache_bytes: int) -> int:
        evidence = LeaseEvidence(
            learner,  # type: ignore[arg-type]
            _StagedEvaluator(lambda rows: 6.0),  # type: ignore[arg-type]
            shard_ids,
            lambda shard: (np.zeros((1000, 1)), np.zeros(1000)),
            cache_bytes=cache_bytes,
        )
        for window in range(3):  # the same trainer's leases overlap from window to window
            lease = shard_ids[window * 2 : window * 2 + 10]
            evidence.z(f"salt-{window}".encode(), f"head-{window}", {}, {}, f"lease-{window}", lease)
        return evidence.reads

    assert measured(1 << 30) == len(used)  # each shard decoded once: the leases' and the windows' controls
    assert measured(1) > len(used)  # no room: every use reads and decodes again


class _RowEvaluator:
    """Losses that name their rows (each example's one feature), recording the row counts asked of
    ``losses`` and the head's losses each measurement was given."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.held: list[tuple[np.ndarray, np.ndarray]] = []  # (the control's features, the head's losses there)

    def losses(self, params: object, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        self.asked.append(len(y))
        return x[:, 0].astype(np.float64)

    def lease_evidence(self, before: object, after: object, lease: tuple, control: tuple, held: np.ndarray) -> float:
        self.held.append((control[0][:, 0], held))
        return 6.0


def test_the_head_is_measured_only_on_the_control_shards_outside_a_lease_once_a_head() -> None:
    shard_ids = [f"train-{i:05d}" for i in range(40)]
    evaluator = _RowEvaluator()
    learner = SimpleNamespace(from_tensors=lambda tensors: tensors)
    evidence = LeaseEvidence(
        learner,  # type: ignore[arg-type]
        evaluator,  # type: ignore[arg-type]
        shard_ids,
        lambda shard: (1000.0 * int(shard[-5:]) + np.arange(1000.0)[:, None], np.zeros(1000)),  # feature: its row
    )
    control = EvidenceDraw.of(b"salt", shard_ids).control
    outside = set(control[:3])  # a lease of every other training shard: its control is 3 shards
    lease = [s for s in shard_ids if s not in outside]
    evidence.z(b"salt", "head", {}, {}, "lease-1", lease)
    assert evaluator.asked.count(1000) == 3  # the head on the 3 shards outside it, not all 16 of the control
    evidence.z(b"salt", "head", {}, {}, "lease-2", lease)
    assert evaluator.asked.count(1000) == 3  # once a head
    evidence.z(b"salt", "next-head", {}, {}, "lease-3", lease)
    assert evaluator.asked.count(1000) == 6
    for features, held in evaluator.held:  # the head's losses are those of the control rows compared
        assert len(features) == 3000 and np.array_equal(features, held)
        assert {f"train-{int(f) // 1000:05d}" for f in features} == outside
