"""The simulated-fleet harness (``lab.simulated``, ``benchmarks.simulated_fleet``) at a tiny size: a
real trainer's update recorded, then simulated trainers whose windows the real validator promotes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks import BENCH_EXPERIMENT
from benchmarks.simulated_fleet import SHARD_SIZE, measure, sim_network, stack, tables
from datasets import mnist
from lab.simulated import UpdateBank, record_bank
from lab.stack import prepare_network
from protocol.near_duplicates import DUPLICATE_COSINE, Sketcher, copies


@pytest.mark.slow
def test_simulated_trainers_windows_are_promoted_and_measured(tmp_path: Path) -> None:
    mnist.prepare(tmp_path / "datasets", shard_size=SHARD_SIZE)  # the benchmark's fine shards
    local = prepare_network(tmp_path, network=sim_network)
    with stack(local, 5) as node:
        bank = record_bank(local, node.fleet, node.url, BENCH_EXPERIMENT, trainers=1, windows=1)
        # one measured window: the one recorded update, replayed on head after head, compounds with the
        # outer momentum until the holdout rightly refuses it as a regression (from the third window on)
        windows = measure(node, bank, 5, 1)
    assert len(bank.deltas) == 1 and all(np.abs(d).max() > 0 for d in bank.deltas[0].values())
    bank.save(tmp_path / "bank.safetensors")
    assert UpdateBank.load(tmp_path / "bank.safetensors").deltas[0].keys() == bank.deltas[0].keys()
    assert [w.candidates for w in windows] == [5]
    for w in windows:
        assert w.accepted > 0, w  # the validator merged simulated work: it took it as honest
        assert min(w.validator_s, w.validator_cpu_s, w.edge_cpu_s, w.cycle_s, w.upload_s) > 0, w
        assert w.validator_s < w.cycle_s
    assert len(tables(windows)) == 7


def test_draws_from_one_recorded_update_are_not_copies_of_one_another() -> None:
    """What the fleet sends must pass as distinct work: ``protocol.near_duplicates`` refuses copies."""
    rng = np.random.default_rng(0)
    bank = UpdateBank(({"w": rng.standard_normal((100, 50)).astype(np.float32), "b": np.ones(50, np.float32)},))
    draws = [np.concatenate([d["w"].ravel(), d["b"]]).astype(np.float64) for d in (bank.draw(rng) for _ in range(20))]
    unit = np.stack([d / np.linalg.norm(d) for d in draws])
    cosines = (unit @ unit.T)[np.triu_indices(20, 1)]
    assert cosines.max() < DUPLICATE_COSINE and cosines.min() > 0.6  # apart, yet in the recorded direction
    assert copies(Sketcher.of(b"w", len(draws[0])), draws, list(range(20))) == {}
