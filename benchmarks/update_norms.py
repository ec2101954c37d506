"""How an update's norm grows with its optimizer steps: what a validator's clip radius must allow a
trainer that leases more shards than its reference window takes.

A centralized loop (the MNIST MLP, Adam 2e-3, batch 64) trains to three stages (early, mid, late);
at each, from the same parameters, updates of k = 62, 125, 250 and 500 steps are trained two ways: as a
trainer trains (its Adam state carried over, batch 64) and as the validator trains its reference
(a fresh Adam, batch 128, ``protocol.judging.REFERENCE_BATCH_FACTOR``). Printed per stage: the median
norm over ``--runs`` batch orders (min–max), its ratio to the 62-step update's, and the exponent a
in ‖Δ‖ ∝ kᵃ fitted between 62 and 500 steps (a = 1: steps add up; a = ½: they add as noise).

    python -m benchmarks.update_norms [--runs 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np

from datasets import mnist
from datasets.layout import load_train
from native_peer.learner import TrainEngine
from native_peer.mnist import mlp_learner
from protocol.batches import make_batches
from protocol.judging import REFERENCE_BATCH_FACTOR

from . import bench_network

STAGES = {"early": 60, "mid": 1500, "late": 4000}  # steps of the centralized loop before measuring
STEPS = (62, 125, 250, 500)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dtn-norms-")) / "datasets"
    mnist.prepare(root)
    x, y = load_train(root / "mnist")
    spec = replace(bench_network(b"\0" * 32, 4).experiments[0], learning_rate=2e-3)
    learner = mlp_learner()
    engine = TrainEngine(learner, learner.make_optimizer(spec))
    params = learner.init(jax.random.PRNGKey(0))
    state = engine.init_optimizer(params)

    def flat(tensors: dict[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([np.asarray(v, np.float64).ravel() for v in tensors.values()])

    done = 0
    print("stage   kind       " + "  ".join(f"{k:>4} steps (x62)" for k in STEPS) + "   exponent")
    for stage, target in STAGES.items():
        while done < target:
            xb, yb = make_batches(x, y, spec.batch_size, done)
            n = min(len(xb), target - done)
            params, state, _ = engine.train_epoch(params, state, xb[:n], yb[:n])
            done += n
        base_tensors = learner.to_tensors(params)
        base = flat(base_tensors)
        norms: dict[str, dict[int, list[float]]] = {"trainer": {}, "reference": {}}
        for run in range(args.runs):
            for k in STEPS:
                xb, yb = make_batches(x, y, spec.batch_size, 1000 * run + k)
                trained, _, _ = engine.train_epoch(params, state, xb[:k], yb[:k])
                norms["trainer"].setdefault(k, []).append(
                    float(np.linalg.norm(flat(learner.to_tensors(trained)) - base))
                )
                xr, yr = make_batches(x, y, REFERENCE_BATCH_FACTOR * spec.batch_size, 5000 + 1000 * run + k)
                fresh = engine.fresh_window(base_tensors, xr[:k], yr[:k])
                norms["reference"].setdefault(k, []).append(float(np.linalg.norm(flat(fresh) - base)))
        for kind, by_steps in norms.items():
            medians = {k: statistics.median(v) for k, v in by_steps.items()}
            cells = [
                f"{medians[k]:5.2f} ({min(v):.2f}-{max(v):.2f}) {medians[k] / medians[STEPS[0]]:.2f}"
                for k, v in by_steps.items()
            ]
            exponent = math.log(medians[STEPS[-1]] / medians[STEPS[0]]) / math.log(STEPS[-1] / STEPS[0])
            print(f"{stage:<7} {kind:<10} " + "  ".join(cells) + f"   {exponent:.2f}", flush=True)


if __name__ == "__main__":
    main()
