"""Network efficiency: samples, trainer utilization, bytes and wall time to a target test accuracy,
the network against a centralized loop, in one run.

    centralized   the same MLP and optimizer (batch 64, Adam 2e-3) in one optax loop over the
                  trainers' pool of examples, test accuracy measured every 20 steps
    network       a real network on this machine per configuration: edge, validator and native
                  trainers, each its own process (``lab.stack``), one experiment, until a head's test
                  accuracy (measured by the validator) reaches the target or time runs out

Configurations: ``fedavg-idle-fp32`` (what the network did before: FedAvg, trainers wait while a
window is judged, fp32 candidates) and ``diloco-continuous-int8`` (the outer Nesterov step, continuous
trainers, int8 candidates); ``--configs`` picks others (outer ∈ fedavg|diloco, trainers ∈
idle|continuous, codec ∈ fp32|fp16|int8).

Reported per configuration: samples trained on until the target head (the trainers' candidates'
examples, rejected ones too, plus the steps they carried, and the validator's own updates) and its
ratio to the centralized loop's samples; the trainers'
compute utilization (seconds in training steps / wall seconds, from each one's first to last
window); candidate bytes per window vs fp32; wall seconds from genesis to the target head.

    python -m benchmarks.network_efficiency [--trainers 3] [--target 0.97] [--max-s 300]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jax
import numpy as np

from datasets.layout import load_split, load_train
from lab.efficiency import fp32_bytes, samples_until, utilization, validator_samples
from lab.stack import Fleet, free_port, prepare_network
from native_peer.edge_client import EdgeClient
from native_peer.learner import Evaluator, TrainEngine
from native_peer.mnist import mlp_learner
from native_peer.storage import StorageConfig
from protocol.batches import make_batches
from protocol.judging import validator_examples
from protocol.manifests import NetworkManifest
from protocol.messages import HeadDescriptor
from protocol.model import MODELS
from protocol.screening import PRESETS

from . import BENCH_EXPERIMENT, bench_network

EVERY_STEPS = 20
BATCH = 64
LEARNING_RATE = 2e-3  # the demo baseline's


@dataclass(frozen=True)
class Config:
    name: str
    outer: str  # fedavg | nesterov
    continuous: bool
    codec: str

    @classmethod
    def parse(cls, name: str) -> Config:
        outer, trainers, codec = name.split("-")
        if outer not in ("fedavg", "diloco") or trainers not in ("idle", "continuous"):
            raise SystemExit(f"unknown configuration {name!r}: <fedavg|diloco>-<idle|continuous>-<codec>")
        return cls(name, "nesterov" if outer == "diloco" else "fedavg", trainers == "continuous", codec)


def centralized_samples(datasets: Path, target: float, spec: Any) -> int | None:
    """Samples one optax loop trains on before its test accuracy first reaches ``target``."""
    root = datasets / "mnist"
    x, y = load_train(root)
    test_x, test_y = load_split(root, "test")
    learner = mlp_learner()
    engine = TrainEngine(learner, learner.make_optimizer(spec))
    evaluate = Evaluator(learner)
    params = learner.init(jax.random.PRNGKey(0))
    opt_state = engine.init_optimizer(params)
    samples = 0
    for epoch in range(10):
        xb, yb = make_batches(x, y, spec.batch_size, epoch)
        for start in range(0, len(xb) - EVERY_STEPS + 1, EVERY_STEPS):
            chunk = slice(start, start + EVERY_STEPS)
            params, opt_state, _ = engine.train_epoch(params, opt_state, xb[chunk], yb[chunk])
            samples += EVERY_STEPS * spec.batch_size
            if evaluate(params, test_x, test_y)["accuracy"] >= target:
                return samples
    return None


def _outcomes(storage: Path) -> list[dict[str, Any]]:
    path = StorageConfig(storage).outcomes_path
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_network(root: Path, datasets: Path, config: Config, trainers: int, target: float, max_s: float) -> dict:
    def network(key: bytes) -> NetworkManifest:
        manifest = bench_network(key, 4)
        spec = replace(
            manifest.experiments[0], learning_rate=LEARNING_RATE, codec=config.codec, outer_optimizer=config.outer
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
            fleet.start("edge", local.edge_argv(port))
            fleet.wait_ready(f"{url}/healthz")
            fleet.start("validator", local.validator_argv(url))
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
                accuracy = heads[-1].metrics["test_accuracy"] if heads else 0.0
                print(f"\r  {config.name}: {len(heads)} heads, test acc {accuracy:.4f}, "
                      f"{time.monotonic() - started:.0f} s ", end="", flush=True)  # fmt: skip
                if accuracy >= target:
                    break
                time.sleep(1.0)
            print()
            fleet.stop_all(keep=("edge",))
            candidates = edge.candidates(BENCH_EXPERIMENT)
            verdicts = edge.verdicts(BENCH_EXPERIMENT)
            spec = local.network.experiments[0]
            anchored = PRESETS[spec.screening].anchored
            per_window = validator_examples(spec, edge.fetch_manifest(spec.dataset_id)) if anchored else 0
    finally:
        edge.close()
    reached = next((h for h in heads if h.metrics["test_accuracy"] >= target), None)
    outcomes = [_outcomes(root / name) for name in names]
    sizes = [o["candidate_bytes"] for records in outcomes for o in records]
    return {
        "config": config.name,
        "reached": reached is not None,
        "target_window": reached.window if reached else None,
        "best_test_accuracy": max((h.metrics["test_accuracy"] for h in heads), default=0.0),
        "samples": samples_until(candidates, heads, reached.window if reached else len(heads), BATCH)
        + validator_samples(heads, reached.window if reached else len(heads), per_window),
        "wall_s": round((reached.created_at_ms - heads[0].created_at_ms) / 1000, 1) if reached else None,
        "utilization": [u for u in map(utilization, outcomes) if u is not None],
        "accepted": f"{sum(v.accepted for v in verdicts)}/{len(verdicts)}",
        "bytes_vs_fp32": float(np.mean(sizes)) / fp32_bytes(MODELS["mnist-mlp"]) if sizes else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--max-s", type=float, default=300.0)
    parser.add_argument("--configs", nargs="+", default=["fedavg-idle-fp32", "diloco-continuous-int8"])
    args = parser.parse_args()
    configs = [Config.parse(name) for name in args.configs]
    root = Path(tempfile.mkdtemp(prefix="dtn-efficiency-"))
    datasets = root / "datasets"
    probe = prepare_network(root / "probe", datasets=datasets, network=lambda key: bench_network(key, 4))
    spec = replace(probe.network.experiments[0], learning_rate=LEARNING_RATE)
    baseline = centralized_samples(datasets, args.target, spec)
    print(f"centralized optax loop (batch 64, Adam 2e-3): {baseline} samples to {args.target} test accuracy")
    results = [run_network(root / c.name, datasets, c, args.trainers, args.target, args.max_s) for c in configs]
    print(f"\n{args.trainers} native trainers, 4 shards a lease, 1 epoch a window; validator: balanced preset")
    for r in results:
        ratio = f"{r['samples'] / baseline:.2f}x" if baseline and r["reached"] else "n/a"
        util = ", ".join(f"{u:.2f}" for u in r["utilization"]) or "n/a"
        print(
            f"  {r['config']:<26} reached {args.target}: {'yes' if r['reached'] else 'no'}"
            f" (window {r['target_window']}, best {r['best_test_accuracy']:.4f})\n"
            f"      samples {r['samples']:,} = {ratio} centralized; wall {r['wall_s']} s;"
            f" utilization {util}; candidate bytes {r['bytes_vs_fp32']:.3f} x fp32; accepted {r['accepted']}"
        )
    print(json.dumps({"centralized_samples": baseline, "runs": results}))


if __name__ == "__main__":
    main()
