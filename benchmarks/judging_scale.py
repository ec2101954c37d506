"""Judging at scale: a validator's time per candidate as a window grows from 10 to 1,000 candidates.

``protocol.judging.judge_window`` with the default preset (``balanced``: anchored screening, leave-one-out
on the holdout, the robust merge) on the MNIST MLP, in this process. The candidates are honest-looking
updates drawn from real ones: the validator's own reference update (trained on real MNIST from the
genesis head) with per-candidate noise of half its norm (two candidates at cosine ≈ 0.8: no copies of one
another, ``protocol.near_duplicates``), so that screening, the holdout checks and the merge run their
full course (every candidate is accepted). The reference is passed in, as a
validator computes it once per head before the window's candidates arrive.

Reported per window size: seconds for the whole decision (median of ``--runs``, with min–max) and per
candidate, and the per-candidate time as a ratio to the smallest window's (flat is O(n) judging).

    python -m benchmarks.judging_scale [--sizes 10 100 1000] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from datasets import mnist
from datasets.layout import load_split
from native_peer.learner import Evaluator, TrainEngine
from native_peer.mnist import mlp_learner
from protocol.judging import Submission, judge_window, reference_batches
from protocol.screening import ACCEPT, PRESETS

from . import bench_network


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dtn-judging-")) / "datasets"
    mnist.prepare(root)
    learner = mlp_learner()
    spec = bench_network(b"\0" * 32, 4).experiments[0]
    engine = TrainEngine(learner, learner.make_optimizer(spec))
    evaluator = Evaluator(learner)
    hx, hy = load_split(root / "mnist", "holdout")
    rx, ry = load_split(root / "mnist", "reference")
    base = learner.to_tensors(learner.init(jax.random.PRNGKey(0)))
    head = "sha256:" + "0" * 64

    index = reference_batches(head, len(rx), 62, 2 * spec.batch_size)
    anchor = engine.fresh_window(base, rx[index], ry[index])

    def evaluate(params: object) -> dict[str, float]:
        return evaluator(learner.from_tensors(params), hx, hy)

    base_metrics = evaluate(base)
    rng = np.random.default_rng(0)
    delta = {k: anchor[k] - base[k] for k in base}
    scale = 0.5 * float(np.sqrt(sum(float((d.astype(np.float64) ** 2).sum()) for d in delta.values())))
    policy = PRESETS["balanced"]
    rows: list[tuple[int, float, float, float]] = []
    for n in args.sizes:
        subs = []
        for i in range(n):
            noise = {k: rng.standard_normal(v.shape) for k, v in base.items()}
            norm = float(np.sqrt(sum(float((z**2).sum()) for z in noise.values())))
            params = {k: (base[k] + delta[k] + scale * noise[k] / norm).astype(np.float32) for k in base}
            subs.append(Submission(f"sha256:{i:064x}", f"peer-{i}", "native", 4000.0, params, ACCEPT))
        times = []
        for _ in range(args.runs):
            started = time.perf_counter()
            decision = judge_window(
                learner.model, base, base_metrics, subs, policy, evaluate,
                reference=anchor, salt=b"bench",
            )  # fmt: skip
            times.append(time.perf_counter() - started)
        accepted = len(decision.accepted)
        rows.append((n, statistics.median(times), min(times), max(times)))
        print(f"  {n:5d} candidates: {statistics.median(times):7.2f} s, {accepted} accepted", flush=True)
    first = rows[0][1] / rows[0][0]
    print("\n| candidates | seconds (median, min–max) | ms per candidate | per candidate vs smallest |")
    print("| --- | --- | --- | --- |")
    for n, median, low, high in rows:
        print(f"| {n} | {median:.2f} ({low:.2f}–{high:.2f}) | {1000 * median / n:.1f} | {median / n / first:.2f} x |")


if __name__ == "__main__":
    main()
