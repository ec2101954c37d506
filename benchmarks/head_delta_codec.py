"""The edge's time to deflate a head delta (``protocol.head_delta``), by zlib level and strategy.

The edge makes a head's delta when the first peer asks for it, which is the moment the head is
promoted: its time is on every window's critical path. Heads here are what a lineage of the MNIST
MLP looks like window to window: the native learner (Adam 2e-3, batch 64) trains ``--steps`` steps a
window on MNIST's training split and each window's parameters are written as a validator writes a
head (``protocol.codec.encode_tensors``). Each consecutive pair's delta is made with each setting;
printed per setting, median (min–max) over ``--runs`` seeds of each run's median: milliseconds to
make a delta, its bytes over the head's, and the time over the first setting's in the same run.

    python -m benchmarks.head_delta_codec [--runs 3] [--windows 12] [--steps 62]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
import zlib
from pathlib import Path

import jax
import numpy as np
import optax

from datasets import mnist
from datasets.layout import load_train
from native_peer.learner import TrainEngine
from native_peer.mnist import mlp_learner
from protocol import head_delta
from protocol.batches import make_batches
from protocol.codec import encode_tensors
from protocol.hashing import content_id

REPO = Path(__file__).resolve().parent.parent
SETTINGS = {  # name -> (level, strategy)
    "level 6 (zlib's default)": (6, zlib.Z_DEFAULT_STRATEGY),
    "level 1": (1, zlib.Z_DEFAULT_STRATEGY),
    "level 1, run-length only (committed)": (1, zlib.Z_RLE),
    "Huffman only": (1, zlib.Z_HUFFMAN_ONLY),
}
REPEATS = 5  # deltas made per pair and setting; the median is kept


def heads(x: np.ndarray, y: np.ndarray, seed: int, windows: int, steps: int) -> list[bytes]:
    """``windows`` + 1 head artifacts of one lineage trained on ``x``, ``y``: genesis, then one a window."""
    learner = mlp_learner()
    engine = TrainEngine(learner, optax.adam(2e-3))
    params = learner.init(jax.random.PRNGKey(seed))
    state = engine.init_optimizer(params)
    out = [encode_tensors(learner.to_tensors(params), {"window": "0"})]
    for window in range(windows):
        xb, yb = make_batches(x, y, 64, 1000 * seed + window)
        params, state, _ = engine.train_epoch(params, state, xb[:steps], yb[:steps])
        out.append(encode_tensors(learner.to_tensors(params), {"window": str(window + 1)}))
    return out


def timed(base: bytes, target: bytes) -> tuple[float, int]:
    """Milliseconds to make the delta with the module's setting (median of ``REPEATS``), and its bytes."""
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        delta = head_delta.encode_delta(base, target)
        times.append(1000 * (time.perf_counter() - started))
    assert head_delta.apply_delta(base, content_id(base), delta, content_id(target)) == target
    return statistics.median(times), len(delta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--steps", type=int, default=62, help="training steps a window (62: a 4-shard lease)")
    args = parser.parse_args()
    mnist.prepare(REPO / "var/datasets")
    x, y = load_train(REPO / "var/datasets/mnist")
    committed = (head_delta._LEVEL, head_delta._STRATEGY)
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in SETTINGS}
    try:
        for run in range(args.runs):
            lineage = heads(x, y, run, args.windows, args.steps)
            per_setting: dict[str, tuple[float, float]] = {}
            for name, (level, strategy) in SETTINGS.items():
                head_delta._LEVEL, head_delta._STRATEGY = level, strategy
                pairs = [(*timed(a, b), len(b)) for a, b in itertools.pairwise(lineage[1:])]  # not genesis's first step
                per_setting[name] = (
                    statistics.median(ms for ms, _, _ in pairs),
                    statistics.median(size / head for _, size, head in pairs),
                )
            first = per_setting[next(iter(SETTINGS))][0]
            for name, (ms, ratio) in per_setting.items():
                results[name].append((ms, ratio, ms / first))
            print(f"run {run + 1}/{args.runs} done", flush=True)
    finally:
        head_delta._LEVEL, head_delta._STRATEGY = committed
    print(
        f"\n{args.runs} runs x {args.windows - 1} deltas, {args.steps} steps a window; median (min–max) of run medians"
    )
    print("| setting | ms a delta | delta / head | time / level 6 |")
    print("| --- | --- | --- | --- |")
    for name, values in results.items():
        cells = [_spread([v[i] for v in values], form) for i, form in enumerate(("{:.1f}", "{:.3f}", "{:.2f}"))]
        print(f"| {name} | " + " | ".join(cells) + " |")


def _spread(values: list[float], form: str) -> str:
    return f"{form.format(statistics.median(values))} ({form.format(min(values))}–{form.format(max(values))})"


if __name__ == "__main__":
    main()
