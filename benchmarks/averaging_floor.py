"""The averaging floor: samples to a target test accuracy when N trainers' updates from one head are
averaged and stepped by the outer optimizer, against a centralized loop, in one process, no network.

What it isolates: how many samples synchronous local SGD (every trainer starts each window from the
same head, keeps its own Adam state, trains ``--steps`` batches of 64 on examples nobody else gets
that window; the window's updates are averaged with equal weight and stepped by ``protocol.outer``)
needs before a head reaches the target, with no staleness, codec, screening, validator or machine
contention: the best a network of N such trainers can do with that outer step. The baseline is the
centralized optax loop of ``benchmarks.network_efficiency`` (same model, optimizer, pool and target).
The gap between this floor and ``network_efficiency``'s ratios is what the network itself costs.

Per (trainers, outer step), median and spread over ``--runs`` seeds: samples × centralized, and the
windows it took. Samples count every example a trainer trained on until the first head at the
target (a window's granularity: up to one window past the exact point).

With ``--inner-lr-scalings sqrt``, every trainer's Adam learning rate is the centralized loop's × √N
(``linear``: × N; ``1``: unscaled), the large-batch scaling rule for Adam (Malladi et al. 2022, "On the
SDEs and Scaling Rules for Adaptive Gradient Algorithms"): the mean of N updates has 1/N of one
update's gradient noise, as one batch N times larger would.

    python -m benchmarks.averaging_floor [--trainers 1 3 8] [--steps 140] [--runs 3]
        [--outers fedavg diloco:0.7:0.5 diloco:0.7:0.9] [--inner-lr-scalings 1 sqrt linear]
        [--centralized-lr-scales 1.5 3] [--large-batch-lr-scales 1 2 4 8]

With ``--large-batch-lr-scales``, also the centralized loop at batch 64 × N for each N of ``--trainers``
at each of those multiples of its learning rate (``large_batch_bound``): N trainers that merged after
every step, with nothing lost to drift between merges, would train that loop; local SGD with more steps
a window is not expected to need fewer samples than it at its best learning rate.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np

from datasets.layout import load_split, load_train
from lab.stack import prepare_network
from native_peer.learner import Evaluator, TrainEngine
from native_peer.mnist import mlp_learner
from protocol.aggregation import flatten, unflatten
from protocol.batches import make_batches
from protocol.manifests import ExperimentSpec
from protocol.outer import OuterOptimizer

from . import bench_network
from .network_efficiency import BATCH, LEARNING_RATE, centralized_baseline


def parse_outer(name: str) -> OuterOptimizer:
    """``fedavg`` or ``diloco:<lr>:<momentum>`` (DiLoCo's outer Nesterov step)."""
    kind, *numbers = name.split(":")
    if kind == "fedavg" and not numbers:
        return OuterOptimizer()
    if kind == "diloco" and len(numbers) == 2:
        return OuterOptimizer("nesterov", float(numbers[0]), float(numbers[1]))
    raise SystemExit(f"unknown outer step {name!r}: fedavg | diloco:<lr>:<momentum>")


INNER_LR_SCALINGS = {"1": lambda n: 1.0, "sqrt": lambda n: n**0.5, "linear": lambda n: float(n)}


def averaged_samples(
    x: np.ndarray,
    y: np.ndarray,
    test: tuple[np.ndarray, np.ndarray],
    spec: ExperimentSpec,
    trainers: int,
    steps: int,
    outer: OuterOptimizer,
    target: float,
    seed: int,
    most: int,
) -> tuple[int | None, int]:
    """(samples until a head reached ``target`` or ``None`` past ``most``, windows run)."""
    learner = mlp_learner()
    engine = TrainEngine(learner, learner.make_optimizer(spec))
    evaluate = Evaluator(learner)
    params = learner.init(jax.random.PRNGKey(seed))
    model = learner.model
    head = flatten(model, learner.to_tensors(params))
    states = [engine.init_optimizer(params) for _ in range(trainers)]
    momentum = None
    order: Iterator[int] = iter(())  # a stream of batch indices over shuffled epochs of the pool
    epoch, samples, windows = 0, 0, 0
    xb: np.ndarray = np.empty(0)
    yb: np.ndarray = np.empty(0)
    while samples < most:
        updates = []
        start = learner.from_tensors(unflatten(model, head))
        for i in range(trainers):
            picks: list[int] = []
            while len(picks) < steps:
                nxt = next(order, None)
                if nxt is None:
                    xb, yb = make_batches(x, y, BATCH, 1000 * seed + epoch)
                    order, epoch = iter(range(len(xb))), epoch + 1
                    continue
                picks.append(nxt)
            trained, states[i], _ = engine.train_epoch(start, states[i], xb[picks], yb[picks])
            updates.append(flatten(model, learner.to_tensors(trained)) - head)
        samples, windows = samples + trainers * steps * BATCH, windows + 1
        head, momentum = outer.step(head, np.mean(updates, axis=0), momentum)
        if evaluate(learner.from_tensors(unflatten(model, head)), *test)["accuracy"] >= target:
            return samples, windows
    return None, windows


def _spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def large_batch_bound(
    datasets: Path, target: float, spec: ExperimentSpec, baseline: int, cohorts: list[int], lr_scales: list[float]
) -> None:
    """The centralized loop at batch ``BATCH`` × N for each cohort N, at each Adam learning rate
    ``LEARNING_RATE`` × scale: what N trainers that merged after every step (one step a window, no
    drift between them) would need at their best learning rate. Each is the median of the baseline's
    seeds, over ``baseline`` (the loop at ``BATCH``, ``LEARNING_RATE``)."""
    print("\n| batch | Adam lr | samples × centralized |")
    print("| --- | --- | --- |")
    for trainers in cohorts:
        for scale in lr_scales:
            large = replace(spec, batch_size=BATCH * trainers, learning_rate=LEARNING_RATE * scale)
            samples = centralized_baseline(datasets, target, large)
            cell = f"{samples / baseline:.2f}" if samples else "not reached"
            print(f"| {large.batch_size} | {large.learning_rate:.4g} | {cell} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", type=int, nargs="+", default=[1, 3, 8])
    parser.add_argument("--steps", type=int, default=140, help="optimizer steps a trainer takes a window")
    parser.add_argument("--outers", nargs="*", default=["fedavg", "diloco:0.7:0.5", "diloco:0.7:0.9"])
    parser.add_argument("--inner-lr-scalings", nargs="+", default=["1"], choices=sorted(INNER_LR_SCALINGS))
    parser.add_argument("--centralized-lr-scales", type=float, nargs="*", default=[])
    parser.add_argument("--large-batch-lr-scales", type=float, nargs="*", default=[])
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dtn-floor-"))
    probe = prepare_network(root / "probe", datasets=root / "datasets", network=lambda key: bench_network(key, 4))
    spec = replace(probe.network.experiments[0], learning_rate=LEARNING_RATE)
    baseline = centralized_baseline(root / "datasets", args.target, spec)
    if baseline is None:
        raise SystemExit("the centralized loop did not reach the target")
    x, y = load_train(root / "datasets" / "mnist")
    test = load_split(root / "datasets" / "mnist", "test")
    for scale in args.centralized_lr_scales:  # how far the baseline's own learning rate is from its best
        lr = LEARNING_RATE * scale
        other = centralized_baseline(root / "datasets", args.target, replace(spec, learning_rate=lr))
        print(f"  the same loop at Adam {lr:.4g}: " + (f"{other / baseline:.2f} ×" if other else "not reached"))
    if args.large_batch_lr_scales:
        large_batch_bound(root / "datasets", args.target, spec, baseline, args.trainers, args.large_batch_lr_scales)
    if not args.outers:  # --outers with none: the centralized loops only
        return
    print(f"\n{args.steps} steps a trainer a window, {args.runs} seeds each")
    print("| trainers | inner lr | outer step | reached | samples × centralized | windows |")
    print("| --- | --- | --- | --- | --- | --- |")
    for trainers in args.trainers:
        for scaling in args.inner_lr_scalings:
            inner = replace(spec, learning_rate=LEARNING_RATE * INNER_LR_SCALINGS[scaling](trainers))
            for name in args.outers:
                runs = [
                    averaged_samples(
                        x, y, test, inner, trainers, args.steps, parse_outer(name), args.target, seed, 20 * baseline
                    )
                    for seed in range(args.runs)
                ]
                ratios = [s / baseline for s, _ in runs if s is not None]
                windows = [float(w) for s, w in runs if s is not None]
                print(
                    f"| {trainers} | {inner.learning_rate:.4g} | {name} | {len(ratios)}/{len(runs)} "
                    f"| {_spread(ratios)} | {_spread(windows)} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
