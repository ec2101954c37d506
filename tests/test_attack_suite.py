"""The attack suite in CI: the default (``balanced``) preset, judged with the validator's reference
update, against every planned scenario for 4 windows, on real MNIST updates, through the same
judging code validators run. Each test asserts one line of the scorecard in docs/robustness.md; the
controls show that each measure can fail (the same attack under FedAvg, or without the reference)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lab.attacks import (
    ATTACKS,
    FRACTIONS,
    PLAN,
    SETTINGS,
    TRIGGER_PIXELS,
    Suite,
    load_data,
    run_suite,
    scenario_seed,
    scorecard_table,
)
from protocol.near_duplicates import DUPLICATE_COSINE

# the whole planned scorecard: ~5 minutes of real MNIST training on 2 cores, all in the module's
# fixture, which pytest-timeout counts against the first test
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WINDOWS = 4
# attack classes the default preset must never accept, at any fraction and in any setting
HARD_REJECT = (
    "nan_inf", "wrong_shape", "replay", "stale_base", "free_rider", "sign_flip", "scale_up", "ipm", "backdoor_boosted",
)  # fmt: skip


@pytest.fixture(scope="module")
def suite(dataset_root: Path) -> Suite:
    return Suite(load_data(dataset_root), 10, WINDOWS)


@pytest.fixture(scope="module")
def scorecard(dataset_root: Path, suite: Suite) -> dict[str, Any]:
    return run_suite(dataset_root, presets=("balanced",), windows=WINDOWS, suite=suite, progress=lambda _: None)


def _row(scorecard: dict[str, Any], attack: str, fraction: float, setting: str = "iid") -> dict[str, Any]:
    return next(
        r for r in scorecard["rows"] if (r["setting"], r["attack"], r["fraction"]) == (setting, attack, fraction)
    )


def test_every_planned_scenario_is_scored(scorecard: dict[str, Any]) -> None:
    planned = {(s, "clean", 0.0) for s in SETTINGS} | {(s, a, f) for s in SETTINGS for a, fs in PLAN[s] for f in fs}
    assert {(r["setting"], r["attack"], r["fraction"]) for r in scorecard["rows"]} == planned
    assert set(ATTACKS) == {a for s in SETTINGS for a, _ in PLAN[s]}
    assert scorecard_table(scorecard).count("\n| balanced |") == len(planned)
    assert {r["peers"] for r in scorecard["rows"] if r["setting"].startswith("cohort")} == {2, 3}


@pytest.mark.parametrize("attack", HARD_REJECT)
def test_the_default_preset_accepts_none_of(scorecard: dict[str, Any], attack: str) -> None:
    rows = [r for r in scorecard["rows"] if r["attack"] == attack]
    assert rows and all(r["malicious_submissions"] > 0 for r in rows)
    assert [r["malicious_acceptance"] for r in rows] == [0.0] * len(rows)


@pytest.mark.parametrize(
    ("setting", "fraction"),
    [("iid", 0.2), ("cohort_2", 0.5), ("cohort_3", 0.33)],
    ids=["0.2 of 10", "1 of 2", "1 of 3"],
)
@pytest.mark.parametrize("attack", ["backdoor", "backdoor_boosted"])
def test_trigger_backdoor_success_stays_within_two_points_of_clean(
    scorecard: dict[str, Any], attack: str, setting: str, fraction: float
) -> None:
    row = _row(scorecard, attack, fraction, setting)
    assert row["attackers"] >= 1 and row["malicious_submissions"] == row["attackers"] * WINDOWS
    assert row["attack_success_vs_clean"] <= 0.02, row


def test_the_backdoor_control_under_fedavg(suite: Suite) -> None:
    """The same attacks against the ``minimal`` preset (FedAvg): the trigger takes hold."""
    wide = suite.run("backdoor", 0.2, "minimal", "iid")
    small = suite.run("backdoor", 0.5, "minimal", "cohort_2")
    clean = suite.run("clean", 0.0, "minimal", "cohort_2")
    assert wide["malicious_acceptance"] == 1.0 and wide["attack_success"] > 0.03
    assert small["attack_success"] - clean["attack_success"] > 0.2


def test_honest_peers_are_never_quarantined_under_a_sybil_majority(scorecard: dict[str, Any]) -> None:
    rows = [r for r in scorecard["rows"] if r["fraction"] >= 0.5 and r["setting"] == "iid"]
    assert {r["attack"] for r in rows} == {"sybil_scaled", "alie", "colluding_cluster"}
    for row in rows:
        assert row["attackers"] >= row["peers"] / 2
        assert row["honest_quarantined"] == 0, row
        assert row["benign_false_rejection"] == 0.0, row
        assert row["accuracy_vs_clean"] > -0.03, row


def test_the_sybil_control_without_a_reference(suite: Suite) -> None:
    """The cohort rules alone (no reference, no lease evidence and no refusal of copies, each of which
    refuses the copies): scaled-down Sybil copies drag the median norm down and the honest updates are
    rejected as too large (and their peers quarantined)."""
    row = suite.run("sybil_scaled", 0.6, "balanced", "iid", use_reference=False, use_evidence=False, use_copies=False)
    assert row["benign_false_rejection"] > 0.5 and row["honest_quarantined"] > 0


def test_label_skewed_benign_peers_are_rarely_rejected(scorecard: dict[str, Any]) -> None:
    row = _row(scorecard, "clean", 0.0, "label_skew")
    assert row["benign_submissions"] == 10 * WINDOWS
    assert row["benign_false_rejection"] <= 0.05, row
    assert row["honest_quarantined"] == 0 and row["windows_promoted"] == WINDOWS


@pytest.mark.parametrize("setting", ["label_skew_1", "label_skew"])
def test_peers_holding_one_to_three_classes_are_rarely_refused_over_24_windows(
    dataset_root: Path, setting: str
) -> None:
    """Honest peers holding 1–2 (2–3) classes each, 24 windows: each window takes the share of its
    merged step of lowest holdout loss (decision 0028), so a whole step that overshoots does not block
    the window and the next one with it. With the whole step only, 38–50 % of their candidates were
    refused (docs/results/2026-12-attack-suite.md)."""
    row = Suite(load_data(dataset_root), 10, 24).run("clean", 0.0, "balanced", setting)
    assert row["benign_submissions"] == 10 * 24
    assert row["benign_false_rejection"] <= 0.1, row
    assert row["honest_quarantined"] == 0 and row["windows_promoted"] >= 22, row


def test_benign_false_rejection_in_the_ten_peer_setting_is_zero(scorecard: dict[str, Any]) -> None:
    rows = [r for r in scorecard["rows"] if r["setting"] == "iid"]
    benign = sum(r["benign_submissions"] for r in rows)
    assert benign > 1000 and all(r["benign_false_rejection"] == 0.0 for r in rows)


@pytest.mark.parametrize("attack", ["alie", "ipm", "colluding_cluster"])
def test_subtle_attacks_cost_under_one_point(scorecard: dict[str, Any], attack: str) -> None:
    row = _row(scorecard, attack, 0.2)
    assert row["accuracy_vs_clean"] > -0.01, row


def test_flooding_peers_are_quarantined_precisely(scorecard: dict[str, Any]) -> None:
    row = _row(scorecard, "late_flood", 0.33)
    assert row["quarantine_recall"] == 1.0 and row["quarantine_precision"] == 1.0
    assert scorecard["clean_accuracy"]["balanced"] > 0.9 > scorecard["warm_accuracy"]


@pytest.mark.parametrize("attack", ["noise_step", "repeat_step", "copy_jitter"])
def test_free_riders_earn_no_credit(scorecard: dict[str, Any], attack: str) -> None:
    """Credit for work, not for claims: a candidate that did not train on its lease (noise of the
    lineage's step, the lineage's last step again, another peer's update jittered) shows no evidence
    it did. It is never credited, and accepted at most for 10 % of its submissions over the fractions
    (evidence z ≥ 2 by chance), while no honest update is refused."""
    rows = [r for r in scorecard["rows"] if r["attack"] == attack]
    assert rows and all(r["malicious_submissions"] > 0 for r in rows)
    assert all(r["malicious_examples_credited"] == 0 for r in rows), rows
    accepted = sum(r["malicious_acceptance"] * r["malicious_submissions"] for r in rows)
    assert accepted <= 0.1 * sum(r["malicious_submissions"] for r in rows), rows
    assert all(r["benign_false_rejection"] == 0.0 and r["benign_credit_withheld"] == 0.0 for r in rows), rows


def test_honest_updates_are_nobodys_copy(scorecard: dict[str, Any]) -> None:
    """Two honest updates of one window, whatever their peers hold, stay far from the cosine at which
    ``protocol.near_duplicates`` takes one for a copy of the other (0.99)."""
    measured = [r["benign_max_pair_cosine"] for r in scorecard["rows"] if r["benign_max_pair_cosine"] is not None]
    assert measured and max(measured) < 0.9 < DUPLICATE_COSINE, max(measured)


def test_the_free_rider_control_without_lease_evidence(suite: Suite) -> None:
    """Without the evidence and the refusal of copies, the same free riders pass every screen and are
    credited as honest peers. (Without the evidence, the refusal of copies cannot tell a copy from its
    original: it judges one of the two.)"""
    for attack in ("noise_step", "repeat_step", "copy_jitter"):
        row = suite.run(attack, 0.2, "balanced", "iid", use_evidence=False, use_copies=False)
        assert row["malicious_acceptance"] == 1.0 and row["malicious_examples_credited"] > 0, row


def test_the_trigger_is_never_lit_by_training_data(suite: Suite, scorecard: dict[str, Any]) -> None:
    assert len(TRIGGER_PIXELS) == 12
    assert all(not np.any(x[:, list(TRIGGER_PIXELS)]) for x, _ in suite.data.shards)
    assert not np.any(suite.data.reference[0][:, list(TRIGGER_PIXELS)])  # nor the validator's reference data
    assert scorecard["warm_attack_success"] < 0.03  # the trigger means nothing to a clean model


def test_a_scenario_gives_the_same_row_run_to_run(suite: Suite, scorecard: dict[str, Any]) -> None:
    again = suite.run("backdoor", 0.5, "balanced", "cohort_2")
    assert again == {k: v for k, v in _row(scorecard, "backdoor", 0.5, "cohort_2").items() if k in again}


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
    assert FRACTIONS == (0.1, 0.2, 0.33)
