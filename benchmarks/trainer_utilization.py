"""Trainer utilization on its own core: how much of a pinned trainer's core becomes training.

The reference set-up: the edge and the validator pinned to core 0, one native trainer pinned to core 1
(``taskset``), each its own process (``lab.stack``), one experiment (``BENCH_EXPERIMENT``, 4 shards a
lease). Per run, for ``--seconds`` after the trainer's first window:

    utilization   examples the trainer trained on (every one: its windows, the next window's lease
                  trained ahead, work carried or dropped) / wall seconds, divided by the samples/s
                  the same trainer code reaches alone on that core (``standalone``, measured first,
                  in this run, on the same lease-sized data, float32 or stored uint8, whichever is
                  faster: uncontended compute)
    in steps      seconds the trainer spent in its training steps / wall seconds: the share of its
                  time not spent waiting (for a head, a lease), whatever the steps' speed
    waiting       seconds it waited for a newer head, and for a lease it asked for ahead, / wall
                  seconds (the rest of the wall outside the steps is its own work: shuffling a
                  lease's examples, packaging and signing candidates)
    cpu           the trainer process's CPU seconds (all its threads) / wall seconds
    windows/min   heads the validator promoted per minute

Configurations: ``idle`` (the trainer waits for each window to be judged: the baseline),
``continuous`` (it leases and trains the next window at once, 4 shards a lease) and ``adaptive``
(continuous, sizing its leases to the window period: ``protocol.lease_size``, up to
``ADAPTIVE_MAX_SHARDS``). Each runs ``--runs`` times; the table gives the median and the spread
(min–max), and each configuration's ratio to idle of the medians (``--configs``: idle and some of
the others).

    python -m benchmarks.trainer_utilization [--runs 3] [--seconds 30] [--configs idle adaptive] [--out docs/results]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from lab.stack import REPO, Fleet, LocalNetwork, free_port, prepare_network
from native_peer.edge_client import EdgeClient
from native_peer.storage import StorageConfig

from . import BENCH_EXPERIMENT, SERVICE_CORE, TRAINER_CORE, bench_network, cpu_seconds, write_result

CONFIGS = ("idle", "continuous", "adaptive")
ADAPTIVE_MAX_SHARDS = 40  # of the bench dataset's 1,000-example shards (the edge keeps the least free for a newcomer)


@dataclass(frozen=True)
class Run:
    config: str
    utilization: float
    in_steps: float
    head_wait: float
    lease_wait: float
    cpu: float
    windows_per_min: float
    samples: int
    seconds: float


def standalone_rate(datasets: Path, seconds: float = 5.0) -> float:
    """Samples/s of the trainer's own training step alone on ``TRAINER_CORE`` (a child process)."""
    argv = [sys.executable, "-m", "benchmarks.trainer_utilization", "--standalone", str(datasets), str(seconds)]
    out = subprocess.run(["taskset", "-c", TRAINER_CORE, *argv], capture_output=True, text=True, check=True, cwd=REPO)
    return float(out.stdout.strip().splitlines()[-1])


def _standalone(datasets: Path, seconds: float) -> None:
    """Print the samples/s of ``TrainEngine.train_epoch`` over one lease's worth of MNIST (4 shards):
    the better of its two inputs, float32 examples and the stored uint8 ones the trainer keeps (scaled
    inside the step), each timed for ``seconds``."""
    import jax
    import numpy as np

    from datasets.layout import load_train
    from native_peer.learner import TrainEngine
    from native_peer.mnist import mlp_learner
    from protocol.batches import make_batches
    from protocol.shards import PIXEL_SCALE

    x, y = load_train(datasets / "mnist")
    x, y = x[:4000], y[:4000]
    stored = ((x / np.float32(PIXEL_SCALE)).astype(np.uint8), y.astype(np.uint8))
    learner = mlp_learner()
    spec = bench_network(b"\0" * 32, 4).experiments[0]
    rates = []
    for (xs, ys), scale in (((x, y), 1.0), (stored, PIXEL_SCALE)):
        engine = TrainEngine(learner, learner.make_optimizer(spec), feature_scale=scale)
        params = learner.init(jax.random.PRNGKey(0))
        opt_state = engine.init_optimizer(params)
        xb, yb = make_batches(xs, ys, spec.batch_size, 0)
        params, opt_state, _ = engine.train_epoch(params, opt_state, xb, yb)  # compile
        samples, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            params, opt_state, _ = engine.train_epoch(params, opt_state, xb, yb)
            samples += xb.shape[0] * xb.shape[1]
        rates.append(samples / (time.perf_counter() - started))
    print(max(rates))


def run_once(local: LocalNetwork, root: Path, config: str, seconds: float, rate: float) -> Run:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    pin = ["taskset", "-c", SERVICE_CORE]
    trainer_argv = [*local.trainer_argv(url, root / "trainer"), "--experiment", str(BENCH_EXPERIMENT)]
    storage = StorageConfig(root / "trainer")
    edge = EdgeClient(url)
    try:
        with Fleet(root) as fleet:
            fleet.start("edge", [*pin, *local.edge_argv(port)])
            fleet.wait_ready(f"{url}/healthz")
            fleet.start("validator", [*pin, *local.validator_argv(url)])
            idle = ["--idle-between-windows"] if config == "idle" else []  # adaptive: the network's bound
            fleet.start("trainer", ["taskset", "-c", TRAINER_CORE, *trainer_argv, *idle])
            pid = fleet.processes["trainer"].pid
            while not storage.outcomes():  # compiled and through its first window
                fleet.check_alive()
                time.sleep(0.2)
            first, cpu0, heads0, started = storage.outcomes()[-1], cpu_seconds(pid), None, time.monotonic()
            heads0 = len(edge.heads(BENCH_EXPERIMENT))
            while time.monotonic() - started < seconds:
                fleet.check_alive()
                time.sleep(0.5)
                print(f"\r  {config}: {time.monotonic() - started:4.0f} s", end="", flush=True)
            last, cpu1, wall = storage.outcomes()[-1], cpu_seconds(pid), time.monotonic() - started
            heads1 = len(edge.heads(BENCH_EXPERIMENT))
    finally:
        edge.close()
    print()
    span = last["wall_s"] - first["wall_s"]  # the trainer's own clock, first to last window
    samples = last["trained_samples"] - first["trained_samples"]
    return Run(
        config,
        utilization=samples / max(span, 1e-9) / rate,
        in_steps=(last["compute_s"] - first["compute_s"]) / max(span, 1e-9),
        head_wait=(last["head_wait_s"] - first["head_wait_s"]) / max(span, 1e-9),
        lease_wait=(last["lease_wait_s"] - first["lease_wait_s"]) / max(span, 1e-9),
        cpu=(cpu1 - cpu0) / wall,
        windows_per_min=(heads1 - heads0) * 60 / wall,
        samples=samples,
        seconds=span,
    )


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--standalone":
        _standalone(Path(sys.argv[2]), float(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=None, help="write a results file (markdown) into this folder")
    args = parser.parse_args()
    configs = tuple(c for c in CONFIGS if c == "idle" or c in args.configs)  # idle: the baseline of the ratios
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("this benchmark pins the trainer and the services to two different cores")
    base = Path(tempfile.mkdtemp(prefix="dtn-utilization-"))
    datasets = base / "datasets"
    prepare_network(base / "probe", datasets=datasets, network=lambda key: bench_network(key, 4))
    runs: list[Run] = []
    rates: list[float] = []
    for i in range(args.runs):
        for config in configs:  # interleaved, so drift in the machine hits both alike
            rates.append(standalone_rate(datasets))
            root = base / f"{config}-{i}"
            most = ADAPTIVE_MAX_SHARDS if config == "adaptive" else None
            local = prepare_network(root, datasets=datasets, network=lambda key, most=most: bench_network(key, 4, most))
            runs.append(run_once(local, root, config, args.seconds, rates[-1]))
            print(f"  {runs[-1]}")
    lines = [
        f"standalone trainer on core {TRAINER_CORE}: {_spread(rates)} samples/s (median, min–max of {len(rates)})",
        "",
        "| trainer | utilization | in steps / wall | waiting for a head / wall | for a lease / wall "
        "| process CPU / wall | windows / min |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    medians = {}
    for config in configs:
        mine = [r for r in runs if r.config == config]
        medians[config] = statistics.median(r.utilization for r in mine)
        lines.append(
            f"| {config} | {_spread([r.utilization for r in mine])} | {_spread([r.in_steps for r in mine])} "
            f"| {_spread([r.head_wait for r in mine])} | {_spread([r.lease_wait for r in mine])} "
            f"| {_spread([r.cpu for r in mine])} "
            f"| {_spread([r.windows_per_min for r in mine])} |"
        )
    lines += [""] + [
        f"{config} / idle utilization (medians): {medians[config] / medians['idle']:.2f} x" for config in configs[1:]
    ]
    print("\n".join(lines))
    if args.out is not None:
        command = f"python -m benchmarks.trainer_utilization --runs {args.runs} --seconds {args.seconds:g}"
        command += "" if configs == CONFIGS else f" --configs {' '.join(configs)}"
        setup = (
            f"Edge and validator on core {SERVICE_CORE}, the trainer on core {TRAINER_CORE}; {args.runs} runs per"
            " configuration, interleaved."
        )
        title = "Trainer utilization on its own core"
        print(f"wrote {write_result(args.out, 'trainer-utilization', title, command, [setup, '', *lines])}")


if __name__ == "__main__":
    main()
