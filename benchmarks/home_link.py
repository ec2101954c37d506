"""A native trainer on a home connection (issue #25 item 3): what an emulated 20 Mbit/s down, 5 Mbit/s
up, 60 ms round trip, 1 % loss link (``lab.links.HOME``) costs it, against the same trainer on loopback.

A real network per run (``lab.stack``: edge and validator as processes, pinned to core 0; one
experiment, ``BENCH_EXPERIMENT``, fp32 candidates, 4 shards of 1,000 examples a lease), one continuous
native trainer pinned to core 1, placed per configuration:

    loopback   in the root namespace, reaching the edge on 127.0.0.1
    direct     in a network namespace behind ``lab.links.DIRECT``: the same TUN devices and forwarder
               as ``home`` with no rate, delay or loss (what the emulation's machinery costs by itself)
    home       in a network namespace behind ``lab.links.HOME``

Per run, for ``--seconds`` after the trainer's first window: samples/s (examples it trained on, from its
first to its last window in that span, over the trainer's own wall seconds between them), utilization
(``lab.efficiency.utilization``: seconds in training steps / wall seconds), heads the validator promoted
per minute, shards it downloaded (not served from its cache) per window it published, and, behind a link, IP bytes (headers included, before loss) down and up per trained
example. Configurations interleaved, ``--runs`` times; median and spread (min–max); ratios of the
medians to loopback (and, for bytes, to direct), in the same run.

    python -m benchmarks.home_link [--runs 3] [--seconds 40] [--out docs/results]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lab.efficiency import utilization
from lab.links import DIRECT, HOME, HomeLink, LinkProfile, link_unsupported
from lab.stack import Fleet, LocalNetwork, free_port, prepare_network
from native_peer.edge_client import EdgeClient
from native_peer.storage import StorageConfig

from . import BENCH_EXPERIMENT, SERVICE_CORE, TRAINER_CORE, bench_network, heads_per_minute, write_result

CONFIGS: dict[str, LinkProfile | None] = {"loopback": None, "direct": DIRECT, "home": HOME}


@dataclass(frozen=True)
class Run:
    config: str
    samples_per_s: float
    utilization: float
    windows_per_min: float
    shards_per_window: float  # shards the trainer downloaded (not served from its cache) per window it published
    down_per_sample: float | None  # IP bytes, None on loopback (nothing counts them there)
    up_per_sample: float | None


@contextlib.contextmanager
def placed(profile: LinkProfile | None, seed: int) -> Iterator[HomeLink | None]:
    if profile is None:
        yield None
        return
    with HomeLink(profile, seed=seed) as link:
        yield link


def run_once(local: LocalNetwork, root: Path, config: str, seconds: float, seed: int) -> Run:
    port, storage = free_port(), StorageConfig(root / "trainer")
    with placed(CONFIGS[config], seed) as link, Fleet(root) as fleet:
        host = link.host if link else "127.0.0.1"
        url = f"http://{host}:{port}"
        pin = ["taskset", "-c", SERVICE_CORE]
        fleet.start("edge", [*pin, *local.edge_argv(port, "--host", host)])
        fleet.wait_ready(f"{url}/healthz")
        fleet.start("validator", [*pin, *local.validator_argv(url)])
        trainer = ["taskset", "-c", TRAINER_CORE, *local.trainer_argv(url, root / "trainer"),
                   "--experiment", str(BENCH_EXPERIMENT)]  # fmt: skip
        fleet.start("trainer", link.argv(trainer) if link else trainer)
        edge = EdgeClient(url)
        try:
            while not storage.outcomes():  # compiled and through its first window
                fleet.check_alive()
                time.sleep(0.2)
            first, bytes0 = storage.outcomes()[-1], link.counters() if link else (0, 0)
            windows_per_min = heads_per_minute(edge, fleet, config, seconds)
            outcomes, bytes1 = storage.outcomes(), link.counters() if link else (0, 0)
        finally:
            edge.close()
    print()
    last = outcomes[-1]
    samples = last["trained_samples"] - first["trained_samples"]
    mine = outcomes[outcomes.index(first) :]
    return Run(
        config,
        samples_per_s=samples / max(last["wall_s"] - first["wall_s"], 1e-9),
        utilization=utilization(mine) or 0.0,  # under 3 windows: none measured
        windows_per_min=windows_per_min,
        shards_per_window=(last["shard_downloads"] - first["shard_downloads"]) / max(len(mine) - 1, 1),
        down_per_sample=(bytes1[0] - bytes0[0]) / max(samples, 1) if link else None,
        up_per_sample=(bytes1[1] - bytes0[1]) / max(samples, 1) if link else None,
    )


def _spread(values: list[float], digits: int = 3) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def table(runs: list[Run]) -> list[str]:
    lines = [
        "| trainer | samples/s | utilization | windows / min | shards downloaded / window | bytes down / sample"
        " | bytes up / sample |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    medians: dict[str, dict[str, float]] = {}
    for config in CONFIGS:
        mine = [r for r in runs if r.config == config]
        cells = [_spread([r.samples_per_s for r in mine], 0), _spread([r.utilization for r in mine]),
                 _spread([r.windows_per_min for r in mine], 1), _spread([r.shards_per_window for r in mine], 2)]  # fmt: skip
        medians[config] = {"rate": statistics.median(r.samples_per_s for r in mine)}
        for name in ("down_per_sample", "up_per_sample"):
            values = [getattr(r, name) for r in mine if getattr(r, name) is not None]
            cells.append(_spread(values, 0) if values else "—")
            if values:
                medians[config][name] = statistics.median(values)
        lines.append(f"| {config} | {' | '.join(cells)} |")
    lines += [
        "",
        f"home / loopback samples/s (medians): {medians['home']['rate'] / medians['loopback']['rate']:.2f} x "
        "(issue #25's goal for a browser: >= 0.8)",
        f"direct / loopback samples/s (medians): {medians['direct']['rate'] / medians['loopback']['rate']:.2f} x",
        f"home / direct bytes per sample (medians): down "
        f"{medians['home']['down_per_sample'] / medians['direct']['down_per_sample']:.2f} x, up "
        f"{medians['home']['up_per_sample'] / medians['direct']['up_per_sample']:.2f} x",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--out", type=Path, default=None, help="write a results file (markdown) into this folder")
    args = parser.parse_args()
    if reason := link_unsupported():
        raise SystemExit(reason)
    base = Path(tempfile.mkdtemp(prefix="dtn-home-link-"))
    datasets = base / "datasets"
    runs: list[Run] = []
    for i in range(args.runs):
        for config in CONFIGS:  # interleaved, so drift in the machine hits each alike
            root = base / f"{config}-{i}"
            local = prepare_network(root, datasets=datasets, network=lambda key: bench_network(key, 4))
            runs.append(run_once(local, root, config, args.seconds, seed=i))
            print(f"  {runs[-1]}")
    lines = table(runs)
    print("\n".join(lines))
    if args.out is not None:
        command = f"python -m benchmarks.home_link --runs {args.runs} --seconds {args.seconds:g}"
        setup = (
            f"Edge and validator on core {SERVICE_CORE}, the trainer on core {TRAINER_CORE}, the link's forwarder"
            f" unpinned; home = {HOME}; {args.runs} runs per configuration, interleaved."
        )
        title = "A native trainer on an emulated home link"
        print(f"wrote {write_result(args.out, 'home-link', title, command, [setup, '', *lines])}")


if __name__ == "__main__":
    main()
