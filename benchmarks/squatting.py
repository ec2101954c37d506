"""Liveness under lease squatting: how much a client that leases under fresh identities every window,
and never delivers, slows an experiment (issue #27's goal: 10 such identities a window, at most 20 %).

Per run, a real network on this machine (``lab.stack``: edge, validator and ``--trainers`` native
continuous trainers, each its own process) on the bench network (4 shards of 1,000 examples a lease,
up to 16), measured for ``--seconds`` once every trainer has published a window:

    clean      the honest network alone
    squatted   the same, with a squatter in this process: whenever a new head appears it asks for
               ``--identities`` leases in its window, each under a fresh identity, spread over 4
               loopback source addresses, and never delivers

Reported per configuration, median and spread (min–max) over ``--runs`` (interleaved): heads promoted
a minute, and for the squatter the leases it was granted a window; the ratio squatted / clean of the
medians is the slowdown.

    python -m benchmarks.squatting [--runs 3] [--seconds 20] [--trainers 2] [--identities 10]
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from lab.hostile import SOURCES, Squatter
from lab.stack import Fleet, LocalNetwork, free_port
from native_peer.edge_client import EdgeClient

from . import (
    BENCH_EXPERIMENT,
    bench_network,
    heads_per_minute,
    interleaved,
    liveness_parser,
    published,
    spread,
    write_result,
)


@dataclass(frozen=True)
class Run:
    config: str
    heads_per_min: float
    squatted_per_window: float  # leases the squatter was granted, a window


def run_once(local: LocalNetwork, root: Path, config: str, seconds: float, trainers: int, identities: int) -> Run:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    edge = EdgeClient(url)
    squatter = None
    try:
        with Fleet(root) as fleet:
            fleet.start_edge_and_validator(local, port)
            names = [f"trainer-{i}" for i in range(trainers)]
            for name in names:
                fleet.start(name, [*local.trainer_argv(url, root / name), "--experiment", str(BENCH_EXPERIMENT)])
            while not all(published(root / name) for name in names):  # compiled, through a window each
                fleet.check_alive()
                time.sleep(0.2)
            if config == "squatted":
                squatter = Squatter(url, BENCH_EXPERIMENT, identities)
                squatter.start()
            rate = heads_per_minute(edge, fleet, config, seconds)
            if squatter is not None:
                squatter.close()
    finally:
        edge.close()
    print()
    per_window = squatter.granted / max(squatter.windows, 1) if squatter is not None else 0.0
    return Run(config, heads_per_min=rate, squatted_per_window=per_window)


def main() -> None:
    parser = liveness_parser(__doc__, 20.0)
    parser.add_argument("--identities", type=int, default=10)
    args = parser.parse_args()
    runs = interleaved(
        "squatting",
        ("clean", "squatted"),
        args.runs,
        lambda root: lambda key: bench_network(key, 4, 16),
        lambda local, root, config, _: run_once(local, root, config, args.seconds, args.trainers, args.identities),
    )
    heads = {c: [r.heads_per_min for r in runs if r.config == c] for c in ("clean", "squatted")}
    squats = [r.squatted_per_window for r in runs if r.config == "squatted"]
    lines = [
        f"{args.trainers} honest continuous trainers; the squatter asks for {args.identities} leases a window, "
        f"each under a fresh identity, from {len(SOURCES)} addresses",
        "",
        "| network | heads / min | squatter's leases granted / window |",
        "| --- | --- | --- |",
        f"| clean | {spread(heads['clean'])} | |",
        f"| squatted | {spread(heads['squatted'])} | {spread(squats)} |",
        "",
        f"squatted / clean heads a minute (medians): "
        f"{statistics.median(heads['squatted']) / statistics.median(heads['clean']):.2f} x",
    ]
    print("\n".join(lines))
    if args.out is not None:
        command = f"python -m benchmarks.squatting --runs {args.runs} --seconds {args.seconds:g}"
        print(f"wrote {write_result(args.out, 'squatting', 'Liveness under lease squatting', command, lines)}")


if __name__ == "__main__":
    main()
