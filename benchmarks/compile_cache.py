"""A native peer's compile time with JAX's persistent compilation cache (``native_peer.compile_cache``).

A peer process builds a trainer's engine for two experiments of the MNIST MLP (learning rates 2e-3 and
2e-4, as the demo's baseline and low-lr experiments) and times each one's first window of 62 optimizer
steps at batch 64 (the demo's 4-shard lease; its scan lengths 32, 8 and 1 compiled), then the same
window once more (compiled). Each run starts one peer with the cache off (the baseline), then two
peers one after the other on a new, empty cache folder. Reported: seconds of each first window, and
its ratio to the baseline's first experiment, median and spread over ``--runs``.

    python -m benchmarks.compile_cache [--runs 3] [--out docs/results]

``python -m benchmarks.compile_cache --peer`` is one peer process: with the compile cache as
``native_peer.compile_cache.use_compile_cache`` sets it, it prints one JSON line (per experiment: the
first and second window's seconds, and JAX's cache hits and misses in the first).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import spread, write_result
from native_peer.compile_cache import CACHE_ENV

REPO = Path(__file__).resolve().parent.parent
LEARNING_RATES = (2e-3, 2e-4)
STEPS, BATCH = 62, 64


def peer() -> None:
    import jax
    import jax.monitoring
    import numpy as np

    from native_peer.compile_cache import use_compile_cache
    from native_peer.learner import TrainEngine, spec_learner
    from native_peer.models import builtin_model
    from protocol.ids import DatasetId, ExperimentKey
    from protocol.manifests import ExperimentSpec
    from protocol.shards import PIXEL_SCALE

    events: list[str] = []
    jax.monitoring.register_event_listener(lambda event, **_: events.append(event))
    folder = use_compile_cache()
    xb = np.random.default_rng(0).integers(0, 256, (STEPS, BATCH, 784), dtype=np.uint8)
    yb = np.random.default_rng(1).integers(0, 10, (STEPS, BATCH), dtype=np.int32)
    experiments = []
    for lr in LEARNING_RATES:
        spec = ExperimentSpec(
            ExperimentKey.parse("bench/mnist/rev-1"), DatasetId("mnist"), builtin_model("mnist-mlp"), lr, BATCH, 1, 4
        )
        learner = spec_learner(spec.model)
        engine = TrainEngine(learner, learner.make_optimizer(spec), feature_scale=PIXEL_SCALE)
        params = learner.init(jax.random.PRNGKey(0))
        state = engine.init_optimizer(params)
        events.clear()
        seconds = []
        for _ in range(2):
            started = time.perf_counter()
            jax.block_until_ready(engine.train_epoch(params, state, xb, yb))
            seconds.append(time.perf_counter() - started)
        hits, misses = (events.count(f"/jax/compilation_cache/cache_{k}") for k in ("hits", "misses"))
        experiments.append({"first_s": seconds[0], "second_s": seconds[1], "hits": hits, "misses": misses})
    print(json.dumps({"folder": str(folder), "experiments": experiments}))


def run_peer(env: dict[str, str]) -> dict[str, object]:
    """One ``--peer`` process with ``env``; what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.compile_cache", "--peer"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the table here as well (docs/results)")
    parser.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        return peer()
    columns: dict[str, list[float]] = {
        name: []
        for name in (
            "no cache",
            "no cache, second experiment",
            "empty cache",
            "second experiment",
            "new process",
            "its second experiment",
        )
    }
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="dtn-compile-cache-") as folder:
            env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")} | {CACHE_ENV: folder}
            off = run_peer(env | {"JAX_ENABLE_COMPILATION_CACHE": "false"})["experiments"]
            first, second = run_peer(env)["experiments"], run_peer(env)["experiments"]
        assert isinstance(off, list) and isinstance(first, list) and isinstance(second, list)
        for column, seconds in zip(columns, (*off, *first, *second), strict=True):
            columns[column].append(seconds["first_s"])
        print(f"  run {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in columns.items()))
    baseline = statistics.median(columns["no cache"])
    lines = [
        f"First window ({STEPS} steps at batch {BATCH}, MNIST MLP) of a native peer's engine, seconds, "
        f"median (min–max) of {args.runs} runs; the cache's peers start on an empty folder each run:",
        "",
        "| first window | seconds | × no cache |",
        "| --- | --- | --- |",
        *(f"| {k} | {spread(v)} | {statistics.median(v) / baseline:.2f} |" for k, v in columns.items()),
    ]
    print("\n".join(lines))
    if args.out is not None:
        command = f"python -m benchmarks.compile_cache --runs {args.runs}"
        print(f"wrote {write_result(args.out, 'compile-cache', 'Compiled programs cached', command, lines)}")


if __name__ == "__main__":
    main()
