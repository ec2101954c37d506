"""The main job end to end: the mixed-fleet demo, every node its own process, Chromium included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lab.demo
from lab.demo import BrowserUnavailable, browser_problem, run_demo, summary_markdown


@pytest.mark.slow
def test_mixed_fleet_demo_proves_every_check(tmp_path: Path) -> None:
    summary = run_demo(tmp_path / "demo", max_minutes=8, browser=True, target_accuracy=0.95)
    assert summary == json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert summary["browser"] and "browser_candidate_accepted" in summary["checks"]
    assert summary["all_checks_passed"], summary["checks"]
    reached = summary["target_reached"]
    assert reached["test_accuracy"] >= 0.95 and reached["window"] >= 1
    assert f"at window {reached['window']}" in (tmp_path / "demo" / "summary.md").read_text()
    # what it took: samples trained on heads before the target head, candidate bytes, trainers' utilization
    assert reached["samples"] >= reached["window"] * 1000 and reached["wall_s"] > 0
    # every example anyone trained on: native trainers' (dropped work too), the browser's, the validator's
    parts = ("native_samples", "browser_samples", "validator_samples")
    assert reached["samples"] == sum(reached[part] for part in parts) and reached["native_samples"] > 0
    # the validator's own updates count too: the same examples for every anchor head before the target
    assert reached["validator_samples"] > 0
    assert summary["candidate_bytes"]["mean"] > 0 and summary["candidate_bytes"]["vs_fp32"] > 0
    assert any(0 < (u or 0) <= 1 for u in summary["trainer_utilization"].values())
    assert (tmp_path / "demo" / "accuracy.svg").read_text().startswith("<svg")
    assert "all checks passed" in (tmp_path / "demo" / "summary.md").read_text()


def test_demo_without_chromium_fails_unless_told_to_skip_the_browser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lab.demo, "CHROMIUM", tmp_path / "no-chromium")
    assert "no Chromium" in (browser_problem() or "")
    with pytest.raises(BrowserUnavailable, match="--no-browser"):
        run_demo(tmp_path / "demo", max_minutes=1, browser=True, target_accuracy=0.95)
    assert not (tmp_path / "demo").exists()  # refused before starting anything


def test_summary_says_when_the_browser_was_skipped() -> None:
    summary = {
        "all_checks_passed": True,
        "wall_time_s": 1.0,
        "peers": [],
        "browser": False,
        "checks": {"baseline_reached_target": True},
        "final_test_accuracy": {},
        "windows": {},
        "verdicts": {},
        "candidate_bytes": {"mean": None, "vs_fp32": None, "codec": "fp32"},
        "trainer_utilization": {},
    }
    assert "SKIPPED (--no-browser)" in summary_markdown(summary)
