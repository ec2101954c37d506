"""The single-machine mixed-fleet MNIST sanity run.

One command starts a real network on this machine, each node its own process: the edge
(``python -m server``), a validator, three native trainers, a late joiner, a trainer that is
stopped and restarted on its storage, and a headless Chromium running the browser peer. Two
experiments share the network (a baseline and a low learning rate). A live status line shows
progress; at the end ``summary.json``, ``summary.md`` and ``accuracy.svg`` record what the run proved.
Without Chromium or the Pyodide runtime it stops with ``BrowserUnavailable`` unless it was asked to
run without the browser (``--no-browser``), which the summary then says.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from native_peer.edge_client import EdgeClient
from native_peer.storage import StorageConfig
from protocol.hashing import content_id
from protocol.ids import ExperimentKey
from protocol.judging import validator_examples
from protocol.manifests import ExperimentSpec, NetworkManifest
from protocol.messages import Candidate, HeadDescriptor, evaluated_metrics
from tools.networks import BASELINE, LOW_LR

from .charts import accuracy_svg
from .efficiency import fp32_bytes, samples_until, trained_samples_until, utilization, validator_samples
from .stack import PYODIDE_DIR, Fleet, LocalNetwork, free_port, prepare_network

__all__ = ["CHROMIUM", "BrowserUnavailable", "run_demo", "summary_markdown"]

_CHROMIUM_CONFIG = json.loads((Path(__file__).with_name("chromium.json")).read_text())  # shared with Playwright
CHROMIUM = Path(_CHROMIUM_CONFIG["executable"])
CHROMIUM_FLAGS = ("--headless=new", *_CHROMIUM_CONFIG["args"])
RESTART_AFTER_WINDOWS = 3
NATIVE_TRAINERS = ("trainer-1", "trainer-2", "trainer-3", "late-joiner")
LATE_JOIN_AT_WINDOW = 5


class BrowserUnavailable(RuntimeError):
    """The demo was asked for its browser trainer but cannot start one."""


def browser_problem() -> str | None:
    """Why a headless-browser trainer cannot run here, or None when it can."""
    if not CHROMIUM.exists():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    if not (PYODIDE_DIR / "pyodide.js").exists():
        return f"no Pyodide runtime in {PYODIDE_DIR} (python -m tools pyodide-runtime)"
    return None


def run_demo(out: Path, *, max_minutes: float, browser: bool, target_accuracy: float) -> dict[str, Any]:
    """Run the fleet until every scenario has happened (or ``max_minutes``) and write the summary.

    With ``browser`` (the default of ``python -m lab demo``) a missing Chromium or Pyodide runtime is
    an error (``BrowserUnavailable``), never a silently dropped check."""
    if browser and (problem := browser_problem()) is not None:
        raise BrowserUnavailable(f"the demo's browser trainer cannot start: {problem}; pass --no-browser to skip it")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    started = time.monotonic()
    local = prepare_network(out)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    chromium_profile = Path(tempfile.mkdtemp(prefix="dtn-chromium-"))
    try:
        with Fleet(out) as fleet:
            fleet.start_edge_and_validator(local, port)
            for i in (1, 2, 3):
                fleet.start(f"trainer-{i}", local.trainer_argv(url, out / f"trainer-{i}"))
            if browser:
                fleet.start(
                    "browser",
                    [
                        str(CHROMIUM),
                        *CHROMIUM_FLAGS,
                        f"--user-data-dir={chromium_profile}",
                        f"{url}/?contribute=1&experiment={BASELINE}",
                    ],
                )
            summary = _supervise(out, url, fleet, local, started, max_minutes, browser, target_accuracy)
    finally:
        shutil.rmtree(chromium_profile, ignore_errors=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    report = summary_markdown(summary)
    (out / "summary.md").write_text(report)
    print("\n" + report)
    print(f"written: {out / 'summary.json'}, {out / 'summary.md'}, {out / 'accuracy.svg'}")
    return summary


def _samples_until(
    reached: dict[str, Any],
    native: dict[str, list[dict[str, Any]]],
    candidates: list[Candidate],
    heads: list[HeadDescriptor],
    spec: ExperimentSpec,
    edge: EdgeClient,
) -> dict[str, int]:
    """Every example anyone trained on in ``spec``'s experiment before its head ``reached``: native
    trainers' (their outcome logs: work carried over or dropped too), browsers' (their candidates) and
    the validator's own updates (``lab.efficiency``)."""
    native_samples = sum(
        trained_samples_until([o for o in records if o["experiment"] == spec.key], reached["created_at_ms"])
        for records in native.values()
    )
    browser = [c for c in candidates if c.peer_kind != "native"]
    browser_samples = samples_until(browser, heads, reached["window"], spec.batch_size)
    per_anchor = validator_examples(spec, edge.fetch_manifest(spec.dataset_id))
    validator = validator_samples(heads, reached["window"], per_anchor, spec.anchor_every)
    return {
        "samples": native_samples + browser_samples + validator,
        "native_samples": native_samples,
        "browser_samples": browser_samples,
        "validator_samples": validator,
    }


def _decided_by_now(candidate: Candidate, heads: list[HeadDescriptor]) -> bool:
    """Whether ``candidate`` must have a verdict once ``heads`` (the lineage, oldest first) ends: it
    was trained on a head two or more before the last, or the last head merged it."""
    older = {head.head_id for head in heads[:-2]}
    return candidate.base_head in older or candidate.candidate_id in heads[-1].merged


def summary_markdown(summary: dict[str, Any]) -> str:
    """What the run proved, for people: checks, accuracy, verdicts."""
    lines = [
        f"# Mixed-fleet MNIST sanity run: {'all checks passed' if summary['all_checks_passed'] else 'CHECKS FAILED'}",
        "",
    ]
    browser = "included" if summary["browser"] else "SKIPPED (--no-browser): browser_candidate_accepted not checked"
    reached = summary.get("target_reached")
    target = (
        f"The baseline reached test accuracy {reached['test_accuracy']:.4f} (target {reached['target']}) at window "
        f"{reached['window']}, {reached['wall_s']:.0f} s after genesis, on "
        f"{reached['samples']:,} training samples, every example anyone trained on: native trainers "
        f"{reached['native_samples']:,} (work dropped or carried "
        f"included), browsers {reached['browser_samples']:,} (their candidates), the validator's own updates "
        f"{reached['validator_samples']:,}."
        if reached
        else "The baseline did not reach its target accuracy."
    )
    size = summary["candidate_bytes"]
    busy = ", ".join(f"{u:.2f}" for u in summary["trainer_utilization"].values() if u is not None) or "n/a"
    costs = (
        f"Baseline candidates: {size['codec']}, {size['mean']:,} bytes ({size['vs_fp32']:.3f} x fp32). "
        f"Native trainers' time in training steps / wall: {busy} (all peers share this machine's cores:"
        " see benchmarks/trainer_utilization.py for a trainer on a core of its own)."
        if size["mean"]
        else ""
    )
    lines += [
        f"Wall time {summary['wall_time_s']:.0f} s. Peers: {len(summary['peers'])}. Browser trainer: {browser}.",
        target,
        costs,
        "",
    ]
    lines += ["| check | result |", "| --- | --- |"]
    lines += [f"| {name} | {'PASS' if passed else 'FAIL'} |" for name, passed in summary["checks"].items()]
    lines += [
        "",
        "| experiment | windows | final test accuracy | accepted | rejected (reasons) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, accuracy in summary["final_test_accuracy"].items():
        verdicts = summary["verdicts"][key]
        reasons = ", ".join(verdicts["rejection_reasons"]) or "–"
        lines.append(
            f"| {key} | {summary['windows'][key]} | {accuracy:.4f} | {verdicts['accepted']} | {verdicts['rejected']} ({reasons}) |"
        )
    return "\n".join(lines) + "\n"


def _supervise(
    out: Path,
    url: str,
    fleet: Fleet,
    local: LocalNetwork,
    started: float,
    max_minutes: float,
    browser: bool,
    target_accuracy: float,
) -> dict[str, Any]:
    restart: dict[str, Any] = {}
    late_started = False
    deadline = started + max_minutes * 60
    edge = EdgeClient(url)
    snapshot: dict[str, Any] = {}
    try:
        while time.monotonic() < deadline:
            fleet.check_alive()
            snapshot = edge.portal_snapshot()
            experiments = {e["key"]: e for e in snapshot["experiments"]}
            baseline = experiments.get(BASELINE, {"head": None, "lineage": []})
            window = baseline["head"]["window"] if baseline["head"] else 0
            if not restart and len(StorageConfig(out / "trainer-2").outcomes()) >= RESTART_AFTER_WINDOWS:
                fleet.stop("trainer-2")
                before = StorageConfig(out / "trainer-2").outcomes()
                restart = {
                    "peer_id_before": before[-1]["peer_id"],
                    "outcomes_before": len(before),
                    "windows_before": {o["experiment"]: o["windows_done"] for o in before},
                }
                fleet.start("trainer-2", local.trainer_argv(url, out / "trainer-2"))
            if not late_started and window >= LATE_JOIN_AT_WINDOW:
                fleet.start("late-joiner", local.trainer_argv(url, out / "late-joiner"))
                late_started = True
            _print_status(started, snapshot)
            done = (
                any(h["metrics"].get("test_accuracy", 0.0) >= target_accuracy for h in baseline["lineage"])
                and late_started
                and restart
                and len(StorageConfig(out / "late-joiner").outcomes()) >= 2
                and len(StorageConfig(out / "trainer-2").outcomes()) > restart["outcomes_before"] + 1
                and (not browser or browser_accepted(edge, BASELINE) > 0)
            )
            if done:
                break
            time.sleep(1.0)
        wall_s = time.monotonic() - started
        fleet.stop_all(keep=("edge",))
        return _summarize(out, edge, local.network, restart, browser, wall_s, target_accuracy)
    finally:
        edge.close()


def browser_accepted(edge: EdgeClient, key: ExperimentKey) -> int:
    """How many candidates of browser peers the validators accepted in ``key``."""
    browsers = {p["peer_id"] for p in edge.peers()["known"] if p["kind"] == "browser"}
    return sum(v.accepted and v.peer_id in browsers for v in edge.verdicts(key))


def show_progress(line: str) -> None:
    """One line of live progress: rewritten in place on a terminal, appended to a log otherwise."""
    if sys.stdout.isatty():
        print("\r" + line[:200].ljust(200), end="", flush=True)
    else:
        print(line, flush=True)


def _print_status(started: float, snapshot: dict[str, Any]) -> None:
    parts = [f"{time.monotonic() - started:6.0f}s"]
    for experiment in snapshot["experiments"]:
        head = experiment["head"] or {"window": "-"}
        # the newest head measured on the test split so far (a head's evaluation follows it)
        accuracy = next(
            (h["metrics"]["test_accuracy"] for h in reversed(experiment["lineage"]) if "test_accuracy" in h["metrics"]),
            None,
        )
        name = experiment["key"].split("/")[1]
        parts.append(f"{name}: window {head['window']} test acc {accuracy if accuracy is None else f'{accuracy:.4f}'}")
        parts.append(f"({experiment['verdicts']['accepted']} ok/{experiment['verdicts']['rejected']} rej)")
    kinds = snapshot["peers"]["active_by_kind"]
    parts.append("peers " + ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())))
    show_progress(" | ".join(parts))


def _summarize(
    out: Path,
    edge: EdgeClient,
    network: NetworkManifest,
    restart: dict[str, Any],
    browser: bool,
    wall_s: float,
    target_accuracy: float,
) -> dict[str, Any]:
    validators = network.validator_key_set
    lineage: dict[str, list[dict[str, Any]]] = {}
    descriptors: dict[str, list[HeadDescriptor]] = {}
    lineage_ok = True
    distinct_ok = True
    for spec in network.experiments:
        heads = descriptors[spec.key] = edge.heads(spec.key)
        tests = evaluated_metrics(edge.evaluations(spec.key), validators)  # each head's test-split metrics
        previous = None
        for head in heads:
            head.verify_trusted(validators, network.quorum)
            data = edge.artifact(head.head_id, out / "verify" / head.head_id.removeprefix("sha256:"))
            lineage_ok &= content_id(data) == head.head_id
            lineage_ok &= head.parent == (None if previous is None else previous.head_id)
            lineage_ok &= head.window == (0 if previous is None else previous.window + 1)
            shard_sets = [set(lease.shard_ids) for lease in edge.window_leases(spec.key, head)]  # ahead ones too
            distinct_ok &= sum(len(s) for s in shard_sets) == len(set().union(*shard_sets)) if shard_sets else True
            previous = head
        lineage[spec.key] = [
            {
                "head_id": h.head_id,
                "parent": h.parent,
                "window": h.window,
                "merged": len(h.merged),
                "created_at_ms": h.created_at_ms,
                **h.metrics,
                **tests.get(h.head_id, {}),
            }
            for h in heads
        ]
    # the newest head measured on the test split (the newest head's evaluation may not have come yet)
    final = {
        key: measured[-1] for key, heads in lineage.items() if (measured := [h for h in heads if "test_accuracy" in h])
    }
    # the head that reached the target is the one judged, not whichever head came after it
    reached = next((h for h in lineage[BASELINE] if h.get("test_accuracy", 0.0) >= target_accuracy), None)
    verdicts = {spec.key: edge.verdicts(spec.key) for spec in network.experiments}
    candidates = {spec.key: edge.candidates(spec.key) for spec in network.experiments}
    # every candidate decided, with a reason that matches the decision (``Verdict`` refuses
    # accepted=True with a rejection reason and back), but those the open window is still to judge:
    # the ones on its head, and the ones on the head before it that came after their window closed
    # (delayed updates, decision 0011; the final head names the ones it merged)
    judged_ok = all(
        c.candidate_id in {v.candidate_id for v in verdicts[spec.key]}
        for spec in network.experiments
        for c in candidates[spec.key]
        if _decided_by_now(c, descriptors[spec.key])
    )
    accepted_peers = {v.peer_id for vs in verdicts.values() for v in vs if v.accepted}
    peers = edge.peers()["known"]
    kinds = {p["peer_id"]: p["kind"] for p in peers}
    late = StorageConfig(out / "late-joiner").outcomes()
    trainer2 = StorageConfig(out / "trainer-2").outcomes()
    native = {name: StorageConfig(out / name).outcomes() for name in NATIVE_TRAINERS}
    baseline = network.experiment(BASELINE)
    sizes = [o["candidate_bytes"] for records in native.values() for o in records if o["experiment"] == BASELINE]
    after_restart = trainer2[restart.get("outcomes_before", len(trainer2)) :]
    # the first window after the restart in an experiment it had trained before: counters and
    # optimizer state must continue from disk
    resumed = [o for o in after_restart if o["experiment"] in restart.get("windows_before", {})]
    checks = {
        "distinct_shard_assignments": distinct_ok,
        "late_joiner_synced": bool(late)
        and late[0]["window"] > 0
        and late[0]["peer_id"] in accepted_peers
        and any(late[0]["base_head_id"] == h["head_id"] for h in lineage[late[0]["experiment"]]),
        "restart_resumed": bool(resumed)
        and all(o["peer_id"] == restart["peer_id_before"] for o in after_restart)
        and resumed[0]["windows_done"] == restart["windows_before"][resumed[0]["experiment"]] + 1
        and resumed[0]["optimizer_restored"]
        and any(o["peer_id"] in accepted_peers for o in after_restart),
        "baseline_beat_low_lr": final[BASELINE]["test_accuracy"] > final[LOW_LR]["test_accuracy"],
        "baseline_reached_target": reached is not None,
        "head_lineage_valid": lineage_ok,
        "every_verdict_has_a_reason": judged_ok,
    }
    if browser:
        checks["browser_candidate_accepted"] = any(kinds.get(p) == "browser" for p in accepted_peers)
    (out / "accuracy.svg").write_text(accuracy_svg(lineage, target_accuracy))
    return {
        "wall_time_s": round(wall_s, 1),
        "browser": browser,
        "final_test_accuracy": {key: head["test_accuracy"] for key, head in final.items()},
        "windows": {key: len(heads) - 1 for key, heads in lineage.items()},
        "verdicts": {
            key: {
                "accepted": sum(v.accepted for v in vs),
                "rejected": sum(not v.accepted for v in vs),
                "rejection_reasons": sorted({str(v.reason) for v in vs if not v.accepted}),
            }
            for key, vs in verdicts.items()
        },
        "peers": [{"peer_id": p["peer_id"], "kind": p["kind"]} for p in peers],
        "restart": {
            **restart,
            "outcomes_after": len(after_restart),
            "shard_cache_hits_after_restart": after_restart[-1]["shard_cache_hits"] if after_restart else 0,
        },
        "late_joiner_first_window": late[0]["window"] if late else None,
        "target_reached": None
        if reached is None
        else {k: reached[k] for k in ("window", "head_id", "test_accuracy")}
        | {
            "target": target_accuracy,
            **_samples_until(reached, native, candidates[BASELINE], descriptors[BASELINE], baseline, edge),
            "wall_s": round((reached["created_at_ms"] - lineage[BASELINE][0]["created_at_ms"]) / 1000, 1),
        },
        "candidate_bytes": {
            "mean": round(float(np.mean(sizes))) if sizes else None,
            "vs_fp32": round(float(np.mean(sizes)) / fp32_bytes(baseline.model), 3) if sizes else None,
            "codec": baseline.codec,
        },
        "trainer_utilization": {name: utilization(records) for name, records in native.items()},
        "checks": checks,
        "all_checks_passed": all(checks.values()),
        "lineage": lineage,
    }
