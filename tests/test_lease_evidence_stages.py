"""Lease evidence measured in stages (``protocol.evidence.EVIDENCE_STAGES``) by ``native_peer.evidence``:
the whole draw is read only where the first stage does not decide, each row measured once, with stub
evaluators that record the rows they were asked for and a z that follows the rows compared."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest

import native_peer.evidence
from native_peer.evidence import LeaseEvidence
from protocol.evidence import EvidenceDraw


class _CountingEvaluator:
    """Losses of 0 everywhere, recording how many rows each ``losses`` call was asked for."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def losses(self, params: object, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        self.asked.append(len(y))
        return np.zeros(len(y))


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[int], float]], list[tuple[int, int]]]:
    """Make z a function of the lease rows compared; the (lease, control) row counts of each stage."""

    def install(z_at: Callable[[int], float]) -> list[tuple[int, int]]:
        stages: list[tuple[int, int]] = []

        def z(lease_gains: np.ndarray, control_gains: np.ndarray) -> float:
            stages.append((len(lease_gains), len(control_gains)))
            return z_at(len(lease_gains))

        monkeypatch.setattr(native_peer.evidence, "lease_evidence_z", z)
        return stages

    return install


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
    compared: Callable[[Callable[[int], float]], list[tuple[int, int]]],
    lease_shards: int,
    z_at: Callable[[int], float],
    stages: list[int],
) -> None:
    shard_ids = [f"train-{i:05d}" for i in range(40)]
    evaluator = _CountingEvaluator()
    measured = compared(z_at)
    learner = SimpleNamespace(from_tensors=lambda tensors: tensors)
    evidence = LeaseEvidence(learner, evaluator, shard_ids, lambda shard: (np.zeros((1000, 1)), np.zeros(1000)))  # type: ignore[arg-type]
    lease = [s for s in shard_ids if s not in EvidenceDraw.of(b"salt", shard_ids).control][:lease_shards]
    z = evidence.z(b"salt", "head", {}, {}, "lease-1", lease)
    assert [lease_rows for lease_rows, _ in measured] == stages and z == z_at(stages[-1])
    assert all(control_rows == lease_rows for lease_rows, control_rows in measured)  # as many control rows
    # each row measured once: a later stage only its new rows (the lease's through the head and the
    # candidate, the control's through the candidate), the head on each control shard once (1,000 rows)
    new_rows = [b - a for a, b in zip([0, *stages[:-1]], stages, strict=True)]
    assert sorted(n for n in evaluator.asked if n != 1000) == sorted(n for n in new_rows for _ in range(3))
    assert evaluator.asked.count(1000) <= 16


def test_a_validator_decodes_each_training_shard_once_while_its_cache_holds_it() -> None:
    shard_ids = [f"train-{i:05d}" for i in range(40)]
    learner = SimpleNamespace(from_tensors=lambda tensors: tensors)

    used = {s for w in range(3) for s in shard_ids[w * 2 : w * 2 + 10]} | {
        s for w in range(3) for s in EvidenceDraw.of(f"salt-{w}".encode(), shard_ids).control
    }

    def measured(cache_bytes: int) -> int:
        evidence = LeaseEvidence(
            learner,  # type: ignore[arg-type]
            _CountingEvaluator(),  # type: ignore[arg-type]
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


class _RowEvaluator(_CountingEvaluator):
    """The head's loss on an example is its one feature (which names its row), a candidate's 0."""

    def losses(self, params: object, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        zeros = super().losses(params, x, y)
        return x[:, 0].astype(np.float64) if isinstance(params, dict) and "head" in params else zeros


def test_the_head_is_measured_only_on_the_control_shards_outside_a_lease_once_a_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shard_ids = [f"train-{i:05d}" for i in range(40)]
    evaluator = _RowEvaluator()
    control_gains: list[np.ndarray] = []  # each measurement's: the head's losses there, less the candidate's 0
    monkeypatch.setattr(
        native_peer.evidence, "lease_evidence_z", lambda lease, control: control_gains.append(control) or 6.0
    )
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
    head, trained = {"head": np.zeros(1)}, {"trained": np.zeros(1)}
    evidence.z(b"salt", "head", head, trained, "lease-1", lease)
    assert evaluator.asked.count(1000) == 3  # the head on the 3 shards outside it, not all 16 of the control
    evidence.z(b"salt", "head", head, trained, "lease-2", lease)
    assert evaluator.asked.count(1000) == 3  # once a head
    evidence.z(b"salt", "next-head", head, trained, "lease-3", lease)
    assert evaluator.asked.count(1000) == 6
    assert len(control_gains) == 3
    for gains in control_gains:  # the head's losses taken are those of the control rows compared
        rows = np.sort(gains)
        assert len(rows) == 3000 and len(np.unique(rows)) == 3000
        assert {f"train-{int(r) // 1000:05d}" for r in rows} == outside
