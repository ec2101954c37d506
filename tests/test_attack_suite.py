"""The attack suite, small: the balanced preset against every attack at every fraction, on real
MNIST updates, through the same judging code validators run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lab.attacks import ATTACKS, FRACTIONS, run_suite, scenario_seed, scorecard_table

MUST_STOP = ("nan_inf", "wrong_shape", "replay", "stale_base", "free_rider", "sign_flip")


@pytest.fixture(scope="module")
def scorecard(dataset_root: Path) -> dict[str, Any]:
    return run_suite(dataset_root, presets=("balanced",), windows=3, progress=lambda _: None)


def _row(scorecard: dict[str, Any], attack: str, fraction: float) -> dict[str, Any]:
    return next(r for r in scorecard["rows"] if r["attack"] == attack and r["fraction"] == fraction)


def test_every_attack_and_fraction_is_scored(scorecard: dict[str, Any]) -> None:
    assert {(r["attack"], r["fraction"]) for r in scorecard["rows"]} == {(a, f) for a in ATTACKS for f in FRACTIONS}
    table = scorecard_table(scorecard)
    assert table.count("\n| balanced |") == len(ATTACKS) * len(FRACTIONS)


@pytest.mark.parametrize("attack", MUST_STOP)
def test_balanced_preset_accepts_none_of(scorecard: dict[str, Any], attack: str) -> None:
    for fraction in FRACTIONS[1:]:
        row = _row(scorecard, attack, fraction)
        assert row["malicious_submissions"] > 0
        assert row["malicious_acceptance"] == 0.0, row


@pytest.mark.parametrize("attack", ["alie", "ipm"])
def test_subtle_attacks_cost_under_one_point(scorecard: dict[str, Any], attack: str) -> None:
    row = _row(scorecard, attack, 0.2)
    assert row["accuracy_vs_clean"] > -0.01, row


def test_benign_false_rejection_below_two_percent(scorecard: dict[str, Any]) -> None:
    benign = sum(r["benign_submissions"] for r in scorecard["rows"])
    rejected = sum(r["benign_false_rejection"] * r["benign_submissions"] for r in scorecard["rows"])
    assert benign > 500 and rejected / benign < 0.02


def test_flooding_peers_are_quarantined_precisely(scorecard: dict[str, Any]) -> None:
    row = _row(scorecard, "late_flood", 0.33)
    assert row["quarantine_recall"] == 1.0 and row["quarantine_precision"] == 1.0
    assert scorecard["clean_accuracy"]["balanced"] > 0.85


def test_scenario_seeds_do_not_depend_on_the_process() -> None:
    """The scorecard must be the same from run to run: no salted ``hash()`` in a seed."""
    code = "from lab.attacks import scenario_seed; print(scenario_seed('late_flood', 0.2, 'balanced'))"
    seeds = {
        subprocess.run(
            [sys.executable, "-c", code], env={"PYTHONHASHSEED": salt}, capture_output=True, text=True, check=True
        ).stdout.strip()
        for salt in ("1", "2")
    }
    assert seeds == {str(scenario_seed("late_flood", 0.2, "balanced"))}
