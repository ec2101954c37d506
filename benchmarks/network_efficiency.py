"""Network efficiency: samples, trainer utilization, bytes and wall time to a target test accuracy,
the network against a centralized loop, in one run.

    centralized   the same MLP and optimizer (batch 64, Adam 2e-3) in one optax loop over the
                  trainers' pool of examples, test accuracy measured every 20 steps
    network       a real network on this machine per configuration: edge, validator and native
                  trainers, each its own process (``lab.stack``), one experiment, until a head's test
                  accuracy (measured by the validator) reaches the target or time runs out

Configurations ``<outer>-<trainers>-<codec>[-grid]``: outer ∈ ``fedavg`` | ``diloco`` (the outer Nesterov
step at DiLoCo's 0.7 / 0.9) | ``diloco:<lr>:<momentum>``; trainers ∈ ``idle`` (they wait while a
window is judged) | ``continuous`` (they train the next window's lease meanwhile, 4 shards a lease) |
``adaptive`` (continuous, sizing their leases up to ``ADAPTIVE_MAX_SHARDS``: ``protocol.lease_size``);
codec ∈ fp32 | fp16 | int8; ``-grid``: heads on their parent's int8 grid (``head_grid = "int8"``,
decision 0053), else exact. Defaults: ``fedavg-idle-fp32`` and ``diloco-continuous-int8``.

Reported per configuration, median and spread (min–max) over ``--runs``: samples trained on until the
target head — every example each trainer trained on before it (``trained_samples`` of its outcomes:
its windows, work carried over or dropped, rejected work too) plus the validator's own updates — and
their ratio to the centralized loop's samples; wall seconds from genesis to the target head; honest
work refused: the share of candidates not accepted (every trainer here is honest) and the count per
reason, and apart for candidates whose lease was trained wholly ahead of their head (from the trainer's
own last candidate, then moved onto the head: no step after it arrived) and the rest, each with its
median lease evidence z; the trainers' compute utilization (seconds in training steps / wall seconds, from each one's
first to last window); candidate bytes per window vs fp32.

    python -m benchmarks.network_efficiency [--trainers 3] [--target 0.97] [--max-s 300] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jax
import numpy as np

from datasets.layout import load_split, load_train
from lab.efficiency import fp32_bytes, samples_until, trained_samples_until, utilization, validator_samples
from lab.stack import Fleet, free_port, prepare_network
from native_peer.edge_client import EdgeClient
from native_peer.learner import Evaluator, TrainEngine
from native_peer.mnist import mlp_learner
from native_peer.models import builtin_model
from native_peer.storage import StorageConfig
from protocol.batches import make_batches
from protocol.judging import validator_examples
from protocol.manifests import NetworkManifest
from protocol.messages import HeadDescriptor

from . import BENCH_EXPERIMENT, bench_network

EVERY_STEPS = 20
BATCH = 64
LEARNING_RATE = 2e-3  # the demo baseline's
ADAPTIVE_MAX_SHARDS = 16  # the demo baseline's max_shards_per_lease


@dataclass(frozen=True)
class Config:
    name: str
    outer: str  # fedavg | nesterov
    continuous: bool
    codec: str
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    max_shards: int | None = None  # adaptive leases up to this many shards
    head_grid: str = "exact"

    @classmethod
    def parse(cls, name: str) -> Config:
        outer, trainers, codec, *grid = name.split("-")
        kind, *numbers = outer.split(":")
        if (
            kind not in ("fedavg", "diloco")
            or len(numbers) not in (0, 2)
            or trainers not in TRAINER_MODES
            or grid not in ([], ["grid"])
        ):
            raise SystemExit(
                f"unknown configuration {name!r}:"
                " <fedavg|diloco[:lr:momentum]>-<idle|continuous|adaptive>-<codec>[-grid]"
            )
        lr, momentum = (float(n) for n in numbers) if numbers else (0.7, 0.9)
        return cls(
            name,
            "nesterov" if kind == "diloco" else "fedavg",
            trainers != "idle",
            codec,
            lr,
            momentum,
            ADAPTIVE_MAX_SHARDS if trainers == "adaptive" else None,
            "int8" if grid else "exact",
        )


TRAINER_MODES = ("idle", "continuous", "adaptive")


def centralized_samples(datasets: Path, target: float, spec: Any, seed: int = 0) -> int | None:
    """Samples one optax loop (initialized and its batches shuffled from ``seed``) trains on before its
    test accuracy first reaches ``target``, evaluated every ``EVERY_STEPS`` batches of ``BATCH`` examples'
    worth of samples whatever ``spec.batch_size`` is."""
    root = datasets / "mnist"
    x, y = load_train(root)
    test_x, test_y = load_split(root, "test")
    learner = mlp_learner()
    engine = TrainEngine(learner, learner.make_optimizer(spec))
    evaluate = Evaluator(learner)
    params = learner.init(jax.random.PRNGKey(seed))
    opt_state = engine.init_optimizer(params)
    samples = 0
    every = max(1, round(EVERY_STEPS * BATCH / spec.batch_size))
    for epoch in range(10):
        xb, yb = make_batches(x, y, spec.batch_size, 100 * seed + epoch)
        for start in range(0, len(xb) - every + 1, every):
            chunk = slice(start, start + every)
            params, opt_state, _ = engine.train_epoch(params, opt_state, xb[chunk], yb[chunk])
            samples += every * spec.batch_size
            if evaluate(params, test_x, test_y)["accuracy"] >= target:
                return samples
    return None


def centralized_baseline(datasets: Path, target: float, spec: Any, seeds: int = 3) -> int | None:
    """The median over ``seeds`` seeds of ``centralized_samples`` (``None`` if most did not reach
    ``target``), printed with its spread; every ratio of a benchmark divides by it."""
    runs = [centralized_samples(datasets, target, spec, seed) for seed in range(seeds)]
    reached = sorted(r for r in runs if r is not None)
    if 2 * len(reached) <= seeds:
        return None
    baseline = int(statistics.median(reached))
    print(
        f"centralized optax loop (batch {spec.batch_size}, Adam {spec.learning_rate:g}): {baseline} samples to "
        f"{target} test accuracy, median of {seeds} seeds ({reached[0]}–{reached[-1]})",
        flush=True,
    )
    return baseline


def run_network(root: Path, datasets: Path, config: Config, trainers: int, target: float, max_s: float) -> dict:
    def network(key: bytes) -> NetworkManifest:
        manifest = bench_network(key, 4, config.max_shards)
        spec = replace(
            manifest.experiments[0],
            learning_rate=LEARNING_RATE,
            codec=config.codec,
            outer_optimizer=config.outer,
            outer_learning_rate=config.outer_lr,
            outer_momentum=config.outer_momentum,
            head_grid=config.head_grid,
        )
        return replace(manifest, experiments=(spec,))

    local = prepare_network(root, datasets=datasets, network=network)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    names = [f"trainer-{i}" for i in range(trainers)]
    edge = EdgeClient(url)
    heads: list[HeadDescriptor] = []
    try:
        with Fleet(root) as fleet:
            fleet.start_edge_and_validator(local, port)
            for name in names:
                argv = [
                    *local.trainer_argv(url, root / name),
                    *([] if config.continuous else ["--idle-between-windows"]),
                ]
                fleet.start(name, argv)
            started = time.monotonic()
            while time.monotonic() - started < max_s:
                fleet.check_alive()
                heads = edge.heads(BENCH_EXPERIMENT)
                # progress from the snapshot (evaluations the edge checked as it took them): their
                # signatures are checked once, after the run, not every second on the measured cores
                [lineage] = [
                    e["lineage"] for e in edge.portal_snapshot()["experiments"] if e["key"] == BENCH_EXPERIMENT
                ]
                accuracy = max((h["metrics"].get("test_accuracy", 0.0) for h in lineage), default=0.0)
                print(f"\r  {config.name}: {len(heads)} heads, test acc {accuracy:.4f}, "
                      f"{time.monotonic() - started:.0f} s ", end="", flush=True)  # fmt: skip
                if accuracy >= target:
                    break
                time.sleep(1.0)
            print()
            fleet.stop_all(keep=("edge",))
            tests = edge.evaluated(BENCH_EXPERIMENT, local.network.validator_key_set)
            candidates = edge.candidates(BENCH_EXPERIMENT)
            verdicts = edge.verdicts(BENCH_EXPERIMENT)
            spec = local.network.experiments[0]
            per_anchor = validator_examples(spec, edge.fetch_manifest(spec.dataset_id))
    finally:
        edge.close()
    accuracies = {h.head_id: tests[h.head_id]["test_accuracy"] for h in heads if h.head_id in tests}
    reached = next((h for h in heads if accuracies.get(h.head_id, 0.0) >= target), None)
    outcomes = [StorageConfig(root / name).outcomes() for name in names]
    sizes = [o["candidate_bytes"] for records in outcomes for o in records]
    until = reached or (heads[-1] if heads else None)
    window = until.window if until else 0
    trained = sum(trained_samples_until(records, until.created_at_ms) for records in outcomes) if until else 0
    refused: dict[str, int] = {}
    for verdict in verdicts:
        if not verdict.accepted:
            refused[str(verdict.reason)] = refused.get(str(verdict.reason), 0) + 1
    ahead = {o["candidate_id"] for records in outcomes for o in records if o.get("steps") == 0}
    by_origin = {
        origin: {
            "verdicts": len(mine),
            "refused": sum(not v.accepted for v in mine),
            "median_z": statistics.median(zs)
            if (zs := [v.metrics["lease_evidence_z"] for v in mine if "lease_evidence_z" in v.metrics])
            else None,
        }
        for origin, mine in (
            ("trained_ahead", [v for v in verdicts if v.candidate_id in ahead]),
            ("on_its_head", [v for v in verdicts if v.candidate_id not in ahead]),
        )
    }
    return {
        "config": config.name,
        "reached": reached is not None,
        "target_window": reached.window if reached else None,
        "best_test_accuracy": max(accuracies.values(), default=0.0),
        "samples": max(trained, samples_until(candidates, heads, window, BATCH))
        + validator_samples(heads, window, per_anchor, spec.anchor_every),
        "validator_samples": validator_samples(heads, window, per_anchor, spec.anchor_every),
        "wall_s": round((reached.created_at_ms - heads[0].created_at_ms) / 1000, 1) if reached else None,
        "utilization": [u for u in map(utilization, outcomes) if u is not None],
        "verdicts": len(verdicts),
        "refused": refused,
        "by_origin": by_origin,
        "bytes_vs_fp32": float(np.mean(sizes)) / fp32_bytes(builtin_model("mnist-mlp")) if sizes else None,
    }


def _by_origin(parts: list[dict[str, Any]]) -> str:
    """Refused of judged over runs, and the runs' median lease evidence z (their spread)."""
    zs = [p["median_z"] for p in parts if p["median_z"] is not None]
    judged, refused = sum(p["verdicts"] for p in parts), sum(p["refused"] for p in parts)
    return f"{refused} of {judged} (z {_spread(zs)})"


def _spread(values: list[float], form: str = "{:.2f}") -> str:
    if not values:
        return "n/a"
    return f"{form.format(statistics.median(values))} ({form.format(min(values))}–{form.format(max(values))})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--max-s", type=float, default=300.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--configs", nargs="+", default=["fedavg-idle-fp32", "diloco-continuous-int8"])
    args = parser.parse_args()
    configs = [Config.parse(name) for name in args.configs]
    root = Path(tempfile.mkdtemp(prefix="dtn-efficiency-"))
    datasets = root / "datasets"
    probe = prepare_network(root / "probe", datasets=datasets, network=lambda key: bench_network(key, 4))
    spec = replace(probe.network.experiments[0], learning_rate=LEARNING_RATE)
    baseline = centralized_baseline(datasets, args.target, spec)
    results = [
        run_network(root / f"{c.name}-{i}", datasets, c, args.trainers, args.target, args.max_s)
        for i in range(args.runs)
        for c in configs  # interleaved, so drift in the machine hits every configuration alike
    ]
    print(f"\n{args.trainers} native trainers, 1 epoch a window; validator: balanced preset; {args.runs} runs each")
    print(
        "| trainers | configuration | reached | samples × centralized | of which the validator's | wall s "
        "| honest refused | refused by reason | refused: trained ahead, on its head (median z) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in configs:
        mine = [r for r in results if r["config"] == c.name]
        ratios = [r["samples"] / baseline for r in mine if baseline and r["reached"]]
        own = [r["validator_samples"] / baseline for r in mine if baseline and r["reached"]]
        walls = [r["wall_s"] for r in mine if r["wall_s"] is not None]
        refused = [sum(r["refused"].values()) / max(r["verdicts"], 1) for r in mine]
        reasons: dict[str, int] = {}
        for r in mine:
            for reason, count in r["refused"].items():
                reasons[reason] = reasons.get(reason, 0) + count
        total = sum(r["verdicts"] for r in mine)
        by_reason = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "none"
        origins = "; ".join(_by_origin([r["by_origin"][o] for r in mine]) for o in ("trained_ahead", "on_its_head"))
        print(
            f"| {args.trainers} | {c.name} | {sum(r['reached'] for r in mine)}/{len(mine)} | {_spread(ratios)} "
            f"| {_spread(own)} | {_spread(walls, '{:.1f}')} | {_spread(refused, '{:.3f}')} | {by_reason} (of {total}) "
            f"| {origins} |"
        )
    print(json.dumps({"centralized_samples": baseline, "runs": results}))


if __name__ == "__main__":
    main()
