"""The main job end to end: the mixed-fleet demo, every node its own process, Chromium included."""

from __future__ import annotations

import json
from pathlib import Path

from native_peer.demo import CHROMIUM, REPO, run_demo


def test_mixed_fleet_demo_proves_every_check(tmp_path: Path) -> None:
    summary = run_demo(tmp_path / "demo", max_minutes=8, browser=True, target_accuracy=0.95)
    assert summary == json.loads((tmp_path / "demo" / "summary.json").read_text())
    if CHROMIUM.exists() and (REPO / "var/pyodide/pyodide.js").exists():
        assert "browser_candidate_accepted" in summary["checks"]
    assert summary["all_checks_passed"], summary["checks"]
    assert summary["final_test_accuracy"]["study/mnist/rev-1"] >= 0.95
    assert (tmp_path / "demo" / "accuracy.svg").read_text().startswith("<svg")
    assert "all checks passed" in (tmp_path / "demo" / "summary.md").read_text()
