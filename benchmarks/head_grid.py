"""What putting heads on their parent's int8 grid (``protocol.head_grid``, decision 0053) costs in
accuracy and saves in bytes, against exact heads, on the same lineage.

Each run trains two lineages of the MNIST MLP from the same initial parameters on the same batches:
each window the native learner (Adam 2e-3, batch 64, its state kept across windows as a continuing
trainer's) trains ``--steps`` steps from the head, and the next head is what it trained (``exact``) or
that moved onto the head's int8 grid (``int8``, ``protocol.head_grid.snap``, seeded per window as a
window's salt seeds it). Each window's head delta is what the edge would serve for it
(``protocol.head_delta.encode_delta``: exact deltas for ``exact``, the grid's for ``int8``), checked
by rebuilding the head. Printed per lineage, median (min–max) over ``--runs`` seeds: the median delta
over the head (first window excluded: from genesis), test loss and accuracy after the last window
(MNIST's test split), and int8 / exact of each in the same run.

    python -m benchmarks.head_grid [--runs 3] [--windows 20] [--steps 62]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import optax

from datasets import mnist
from datasets.layout import load_split, load_train
from native_peer.learner import Evaluator, TrainEngine
from native_peer.mnist import mlp_learner
from protocol.batches import make_batches
from protocol.codec import encode_tensors
from protocol.hashing import content_id
from protocol.head_delta import apply_delta, encode_delta
from protocol.head_grid import snap

REPO = Path(__file__).resolve().parent.parent
Step = Callable[[dict[str, np.ndarray], dict[str, np.ndarray], int], dict[str, np.ndarray]]
LINEAGES: dict[str, tuple[str, Step]] = {  # name -> (the edge's delta for it, the next head from a trained one)
    "exact": ("exact", lambda head, trained, window: trained),
    "int8": ("int8", lambda head, trained, window: snap(head, trained, f"window {window}".encode())),
}


def lineage(
    data: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], name: str, seed: int, windows: int, steps: int
) -> tuple[float, dict[str, float]]:
    """The median delta / head over windows 2.. of lineage ``name`` and its test metrics at the end."""
    x, y, test_x, test_y = data
    grid, step = LINEAGES[name]
    learner = mlp_learner()
    engine = TrainEngine(learner, optax.adam(2e-3))
    params = learner.init(jax.random.PRNGKey(seed))
    state = engine.init_optimizer(params)
    head = {k: np.asarray(v, np.float32) for k, v in learner.to_tensors(params).items()}
    artifact = encode_tensors(head, {"window": "0"})
    ratios = []
    for window in range(1, windows + 1):
        xb, yb = make_batches(x, y, 64, 1000 * seed + window)
        trained, state, _ = engine.train_epoch(learner.from_tensors(head), state, xb[:steps], yb[:steps])
        head = step(head, {k: np.asarray(v, np.float32) for k, v in learner.to_tensors(trained).items()}, window)
        child = encode_tensors(head, {"window": str(window)})
        delta = encode_delta(artifact, child, grid)
        assert apply_delta(artifact, content_id(artifact), delta, content_id(child)) == child
        if window > 1:
            ratios.append(len(delta) / len(child))
        artifact = child
    return statistics.median(ratios), Evaluator(learner)(learner.from_tensors(head), test_x, test_y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--steps", type=int, default=62, help="training steps a window (62: a 4-shard lease)")
    args = parser.parse_args()
    root = REPO / "var/datasets"
    mnist.prepare(root)
    data = (*load_train(root / "mnist"), *load_split(root / "mnist", "test"))
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in LINEAGES}
    for run in range(args.runs):
        for name in LINEAGES:
            ratio, metrics = lineage(data, name, run, args.windows, args.steps)
            rows[name].append((ratio, metrics["loss"], metrics["accuracy"]))
        print(f"run {run + 1}/{args.runs} done", flush=True)
    print(f"\n{args.runs} runs x {args.windows} windows of {args.steps} steps; median (min–max) over runs")
    print("| lineage | delta / head | test loss | test accuracy |")
    print("| --- | --- | --- | --- |")
    for name, values in rows.items():
        cells = [_spread([v[i] for v in values], form) for i, form in enumerate(("{:.3f}", "{:.4f}", "{:.4f}"))]
        print(f"| {name} | " + " | ".join(cells) + " |")
    pairs = list(zip(rows["int8"], rows["exact"], strict=True))
    ratios = [[g[i] / e[i] for g, e in pairs] for i in range(3)]
    print("| int8 / exact | " + " | ".join(_spread(r, "{:.3f}") for r in ratios) + " |")


def _spread(values: list[float], form: str) -> str:
    return f"{form.format(statistics.median(values))} ({form.format(min(values))}–{form.format(max(values))})"


if __name__ == "__main__":
    main()
