"""``python -m lab workloads``: the models beyond the MLP, trained by a mixed fleet on one machine.

The network of ``networks/workloads.toml``: a LeNet-style CNN on MNIST (``mnist-cnn``) and a byte-level
transformer language model (``char-lm``) on the Python standard library's source (``datasets.pystdlib``,
context 64). One edge, one validator judging both, for each experiment a native JAX trainer and a
headless Chromium trainer (Pyodide + NumPy, the same layers), until the CNN reaches its target test
accuracy and the language model has trained as many windows, or the time is up. ``--workloads cnn``
(or ``lm``) runs one of the two alone: the network then holds that experiment only, and the validator's
time is not shared with the other (on 2 cores it is what paces the windows). The summary gives each
experiment's windows and metrics (test accuracy; validation bits per character), the browser's accepted
candidates, and a sample the final language model writes. Live progress on stdout.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from datasets import pystdlib
from native_peer.edge_client import EdgeClient
from protocol.codec import decode_tensors
from protocol.ids import ContentId, ExperimentKey
from protocol.manifests import NetworkManifest
from protocol.model import ModelSpec, forward
from protocol.screening import PRESETS
from tools.networks import read_experiments

from .charts import accuracy_svg
from .demo import CHROMIUM, CHROMIUM_FLAGS, BrowserUnavailable, browser_accepted, browser_problem, show_progress
from .stack import REPO, Fleet, LocalNetwork, free_port, prepare_network

__all__ = ["WORKLOADS", "WORKLOADS_NETWORK", "run_workloads", "sample_text"]

WORKLOADS_NETWORK = REPO / "networks" / "workloads.toml"
CNN = ExperimentKey.parse("study/mnist-cnn/rev-1")
LM = ExperimentKey.parse("study/pystdlib-lm/rev-1")
WORKLOADS = {"cnn": CNN, "lm": LM}
CORPUS_BYTES = 2_000_000  # the corpus's first bytes: ~30k sequences, enough for a run of minutes
SPLITS = {"holdout": 0.05, "reference": 0.05, "validation": 0.05, "test": 0.05}


def prepare_workloads(root: Path, keys: tuple[ExperimentKey, ...] = (CNN, LM)) -> LocalNetwork:
    """MNIST (and the standard-library corpus when the language model runs), a validator and the
    workloads network with the experiments ``keys``."""
    experiments = tuple(spec for spec in read_experiments(WORKLOADS_NETWORK) if spec.key in keys)
    local = prepare_network(root, network=lambda key: NetworkManifest("workloads", (key,), experiments))
    if LM in keys:
        context = next(spec.model for spec in experiments if spec.key == LM).input_shape[0]
        pystdlib.prepare(local.datasets, context=context, max_bytes=CORPUS_BYTES, fractions=SPLITS)
    return local


def sample_text(model: ModelSpec, params: dict[str, np.ndarray], prompt: bytes, length: int, seed: int = 0) -> str:
    """``length`` bytes the language model writes after ``prompt`` (sampled at temperature 0.8)."""
    context = model.input_shape[0]
    tokens = list(prompt)
    rng = np.random.default_rng(seed)
    for _ in range(length):
        window = tokens[-context:]
        x = np.zeros((1, context), np.float32)
        x[0, : len(window)] = window  # causal: what follows the window cannot change its last logits
        logits = forward(model, params, x)[0, len(window) - 1].astype(np.float64) / 0.8
        p = np.exp(logits - logits.max())
        tokens.append(int(rng.choice(len(p), p=p / p.sum())))
    return bytes(tokens).decode("utf-8", errors="replace")


def run_workloads(
    out: Path,
    *,
    max_minutes: float,
    target_accuracy: float,
    browser: bool,
    keys: tuple[ExperimentKey, ...] = (CNN, LM),
    keep_going: bool = False,
) -> dict[str, Any]:
    if browser and (problem := browser_problem()) is not None:
        raise BrowserUnavailable(f"the browser trainers cannot start: {problem}; pass --no-browser to skip them")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    local = prepare_workloads(out, keys)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    profiles = Path(tempfile.mkdtemp(prefix="dtn-chromium-"))
    started = time.monotonic()
    try:
        with Fleet(out) as fleet:
            fleet.start_edge_and_validator(local, port)
            for key in keys:
                name = key.parts[1]
                fleet.start(f"native-{name}", [*local.trainer_argv(url, out / f"native-{name}"), "--experiment", key])
                if browser:
                    page = f"{url}/?contribute=1&experiment={key}"
                    fleet.start(
                        f"browser-{name}", [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profiles / name}", page]
                    )
            summary = _supervise(url, fleet, started, max_minutes, target_accuracy, browser, keys, keep_going)
    finally:
        shutil.rmtree(profiles, ignore_errors=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(report := summary_markdown(summary))
    print("\n" + report)
    return summary


def _supervise(
    url: str,
    fleet: Fleet,
    started: float,
    max_minutes: float,
    target_accuracy: float,
    browser: bool,
    keys: tuple[ExperimentKey, ...],
    keep_going: bool,
) -> dict[str, Any]:
    """Live progress until every running workload is done (the CNN at its target accuracy; the language
    model, next to the CNN, as many windows; alone, until the time is up) or the time is up (always,
    with ``keep_going``: to see whether the network holds what it reached)."""
    edge = EdgeClient(url)
    try:
        while time.monotonic() < started + max_minutes * 60:
            fleet.check_alive()
            snapshot = {e["key"]: e for e in edge.portal_snapshot()["experiments"]}
            heads = {key: e["head"] or {"window": 0, "metrics": {}} for key, e in snapshot.items()}
            line = [f"{time.monotonic() - started:6.0f}s"]
            # the best test accuracy of the heads measured so far (a head's evaluation follows it)
            cnn_accuracy = max(
                (h["metrics"].get("test_accuracy", 0.0) for h in snapshot.get(CNN, {}).get("lineage", [])), default=0.0
            )
            if CNN in keys:
                line.append(f"cnn: window {heads[CNN]['window']} test acc {cnn_accuracy:.4f}")
            if LM in keys:
                lm = heads[LM]
                bits = lm["metrics"].get("val_bits_per_char", float("nan"))
                line.append(f"lm: window {lm['window']} val bits/char {bits:.3f}")
            show_progress(" | ".join(line))
            browsers_in = all(browser_accepted(edge, key) for key in keys) or not browser
            if (
                not keep_going
                and CNN in keys
                and cnn_accuracy >= target_accuracy
                and (LM not in keys or heads[LM]["window"] >= heads[CNN]["window"])
                and browsers_in
            ):
                break
            time.sleep(3.0)
        wall_s = time.monotonic() - started
        fleet.stop_all(keep=("edge",))
        return _summarize(edge, fleet.out, wall_s, target_accuracy, browser)
    finally:
        edge.close()


def _summarize(edge: EdgeClient, out: Path, wall_s: float, target: float, browser: bool) -> dict[str, Any]:
    network = edge.network()
    experiments: dict[str, Any] = {}
    lineage: dict[str, list[dict[str, Any]]] = {}
    for spec in network.experiments:
        heads = edge.heads(spec.key)
        tests = edge.evaluated(spec.key, network.validator_key_set)
        lineage[str(spec.key)] = [{"window": h.window, **h.metrics, **tests.get(h.head_id, {})} for h in heads]
        verdicts = edge.verdicts(spec.key)
        experiments[str(spec.key)] = {
            "model": spec.model.name,
            "params": spec.model.num_params,
            "windows": heads[-1].window,
            # the newest head measured on the test split (the newest head's evaluation may not have come yet)
            "final": next(
                (h for h in reversed(lineage[str(spec.key)]) if "test_loss" in h), lineage[str(spec.key)][-1]
            ),
            "accepted": sum(v.accepted for v in verdicts),
            "rejected": sum(not v.accepted for v in verdicts),
            "rejected_by_reason": dict(Counter(str(v.reason) for v in verdicts if not v.accepted).most_common()),
            # passed by the holdout although opposed to the reference (protocol.screening)
            "accepted_against_reference": sum(
                v.accepted and v.metrics.get("reference_cosine", 0.0) <= PRESETS[spec.screening].min_trust
                for v in verdicts
            ),
            "browser_accepted": browser_accepted(edge, spec.key),
        }
    checks: dict[str, bool] = {}
    sample = None
    if str(CNN) in experiments:
        reached = [h["window"] for h in lineage[str(CNN)] if h.get("test_accuracy", 0) >= target]
        experiments[str(CNN)]["first_window_at_target"] = reached[0] if reached else None
        experiments[str(CNN)]["best_test_accuracy"] = max(h.get("test_accuracy", 0) for h in lineage[str(CNN)])
        checks["cnn_reached_target"] = bool(reached)
        (out / "cnn-accuracy.svg").write_text(accuracy_svg({str(CNN): lineage[str(CNN)]}, target))
    if str(LM) in experiments:
        bits = [head.get("val_bits_per_char", np.nan) for head in lineage[str(LM)]]
        checks["lm_bits_per_char_fell"] = bool(bits[-1] < bits[0])
        final = edge.heads(LM)[-1]
        params, _ = decode_tensors(edge.artifact(ContentId(final.head_id), out / "lm-head.safetensors"))
        sample = sample_text(network.experiment(LM).model, params, b"def ", 240)
    checks["browser_candidates_accepted_in_each"] = (not browser) or all(
        e["browser_accepted"] > 0 for e in experiments.values()
    )
    return {
        "wall_time_s": wall_s,
        "target_accuracy": target,
        "browser": browser,
        "experiments": experiments,
        "lineage": lineage,
        "lm_sample": sample,
        "checks": checks,
        "all_checks_passed": all(checks.values()),
    }


def summary_markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"# Workloads beyond the MLP: {'all checks passed' if summary['all_checks_passed'] else 'CHECKS FAILED'}",
        "",
        f"Wall time {summary['wall_time_s']:.0f} s. Browser trainers: {'included' if summary['browser'] else 'SKIPPED'}.",
        "",
        "| experiment | model (parameters) | windows | final | accepted / rejected | rejections | from browsers |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, e in summary["experiments"].items():
        m = e["final"]
        final = (
            f"test accuracy {m.get('test_accuracy', float('nan')):.4f}"
            if "val_bits_per_char" not in m
            else f"val {m['val_bits_per_char']:.3f} / test {m.get('test_bits_per_char', float('nan')):.3f} bits per char"
        )
        if "best_test_accuracy" in e:
            first = e["first_window_at_target"]
            at_target = "never" if first is None else f"from window {first}"
            final += f" (best {e['best_test_accuracy']:.4f}; {summary['target_accuracy']} {at_target})"
        reasons = ", ".join(f"{n} {reason}" for reason, n in e["rejected_by_reason"].items()) or "none"
        lines.append(
            f"| {key} | {e['model']} ({e['params']:,}) | {e['windows']} | {final} | {e['accepted']} / {e['rejected']} "
            f"({e['accepted_against_reference']} accepted against the reference) | {reasons} | {e['browser_accepted']} |"
        )
    lines += ["", "| check | result |", "| --- | --- |"]
    lines += [f"| {name} | {'PASS' if ok else 'FAIL'} |" for name, ok in summary["checks"].items()]
    if summary["lm_sample"] is not None:
        lines += [
            "",
            "The final language model, prompted with `def ` (temperature 0.8):",
            "",
            "```",
            summary["lm_sample"],
            "```",
        ]
    return "\n".join([*lines, ""])
