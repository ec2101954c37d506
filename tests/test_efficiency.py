"""The sample accounting the demo summary and the benchmarks report (``lab.efficiency``)."""

from __future__ import annotations

from lab.efficiency import trained_samples_until, validator_samples
from protocol.ids import ExperimentKey, HeadId
from protocol.messages import HeadDescriptor


def test_trained_samples_count_every_example_up_to_a_moment_across_restarts() -> None:
    outcomes = [
        {"at_ms": 100, "trained_samples": 4000},
        {"at_ms": 200, "trained_samples": 12000},  # a window and the next one's lease trained ahead
        {"at_ms": 300, "trained_samples": 3000},  # restarted: its counter began again
        {"at_ms": 400, "trained_samples": 7000},
    ]
    assert trained_samples_until(outcomes, 50) == 0
    assert trained_samples_until(outcomes, 250) == 12000
    assert trained_samples_until(outcomes, 350) == 15000
    assert trained_samples_until(outcomes, 10**6) == 19000


def test_validator_samples_count_its_update_for_every_anchor_head_before_the_window() -> None:
    key = ExperimentKey.parse("study/mnist/rev-1")
    heads = [HeadDescriptor(key, HeadId(f"sha256:{i:064x}"), None, i, 0, (), bytes(32), 0) for i in range(9)]
    assert validator_samples(heads, 3, 7936, 1) == 3 * 7936
    assert validator_samples(heads, 0, 7936, 1) == 0
    assert validator_samples(heads, 4, 7936, 4) == 7936  # the anchor of window 0 serves windows 0-3
    assert validator_samples(heads, 5, 7936, 4) == 2 * 7936
    assert validator_samples(heads, 9, 7936, 4) == 3 * 7936
