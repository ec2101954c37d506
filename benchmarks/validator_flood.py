"""Liveness under a rogue validator key: how much one key of a 2-of-3 quorum that floods proposals,
mints and erases credit slows an experiment (issue #27's goal: at most 20 %).

Per run, a real network on this machine (``lab.stack``: edge, two honest validators of a 2-of-3
quorum, ``--trainers`` native continuous trainers, each its own process; the third key's validator
never runs, in either configuration) on the bench network (``window_timeout_s`` 10 s: a window in the
silent key's turn waits one deadline), measured for ``--seconds`` once every trainer has published a
window and ``WARM_HEADS`` heads exist:

    clean      the honest network alone
    flooded    the same, with ``lab.rogue.Rogue`` in this process under the third key: on each new
               head ``--proposals`` proposals of its own (each attested as judged from the window, so
               the honest validators judge them), 3 accepted verdicts for a peer that never uploaded
               and a rejection of every candidate of the experiment
    unbudgeted flooded, on an edge whose validator budgets are off (``--validator-proposals-per-window``
               1000): what the budget is worth

Reported per configuration, median and spread (min–max) over ``--runs`` (interleaved): heads promoted
a minute; for the rogue its proposals taken and refused a window; and the leaderboard's peers that
are not trainers of the run. The ratio flooded / clean of the medians is the slowdown.

    python -m benchmarks.validator_flood [--runs 3] [--seconds 30] [--trainers 2] [--proposals 8]
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from lab.rogue import Rogue
from lab.stack import Fleet, LocalNetwork, free_port
from native_peer.edge_client import EdgeClient, EdgeRequestError
from native_peer.identity import NodeIdentity
from native_peer.storage import StorageConfig
from protocol.manifests import NetworkManifest

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

HONEST = ("validator-1", "validator-2")  # the rogue holds the key under root/validator
WINDOW_TIMEOUT_S = 10.0
WARM_HEADS = 4  # measured once this many heads exist: the deadlines follow a history by then
UNBUDGETED = ("--validator-proposals-per-window", "1000", "--validator-window-bytes", str(1 << 40))
CONFIGS = ("clean", "flooded", "unbudgeted")


@dataclass(frozen=True)
class Run:
    config: str
    heads_per_min: float
    taken_per_window: float  # the rogue's proposals the edge took, a window
    refused_per_window: float
    strangers: int  # peers on the leaderboard that are not trainers of the run


class Flooder(threading.Thread):
    """``Rogue.round`` on every new head, until closed."""

    def __init__(self, url: str, rogue: Rogue) -> None:
        super().__init__(daemon=True)
        self.rogue, self.edge = rogue, EdgeClient(url, retries=0)
        self.stop = threading.Event()
        self.statuses: Counter[int] = Counter()
        self.windows = 0

    def run(self) -> None:
        seen = None
        while not self.stop.is_set():
            try:  # a long poll: the flooder spends no core of this machine while it waits
                head = self.edge.current_head(BENCH_EXPERIMENT, after=seen, wait_s=1.0)
                if head is None or head.head_id == seen:
                    continue
                seen, self.windows = head.head_id, self.windows + 1
                self.statuses.update(a.status_code for a in self.rogue.round(head)["flood"])
            except (EdgeRequestError, httpx.TransportError):
                continue

    def close(self) -> None:
        self.stop.set()
        self.join(timeout=30)
        self.edge.close()
        self.rogue.close()


def _quorum(root: Path) -> Callable[[bytes], NetworkManifest]:
    """The bench network with the key under ``root/validator`` (the rogue's) and the honest ones, k = 2."""

    def network(rogue_key: bytes) -> NetworkManifest:
        honest = tuple(NodeIdentity.load_or_create(StorageConfig(root / n).identity_path).public_key for n in HONEST)
        bench = bench_network(rogue_key, 4, 16)
        # a window waits for a silent key's turn one deadline, at most window_timeout_s: short, as in a busy network
        specs = tuple(replace(spec, window_timeout_s=WINDOW_TIMEOUT_S) for spec in bench.experiments)
        return replace(bench, validator_keys=(rogue_key, *honest), quorum=2, experiments=specs)

    return network


def run_once(local: LocalNetwork, root: Path, config: str, seconds: float, trainers: int, proposals: int) -> Run:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    edge = EdgeClient(url)
    flooder = None
    names = [f"trainer-{i}" for i in range(trainers)]
    try:
        with Fleet(root) as fleet:
            fleet.start("edge", local.edge_argv(port, *(UNBUDGETED if config == "unbudgeted" else ())))
            fleet.wait_ready(f"{url}/healthz")
            for name in HONEST:
                argv = local.validator_argv(url)
                argv[argv.index("--storage") + 1] = str(root / name)
                fleet.start(name, argv)
            for name in names:
                fleet.start(name, [*local.trainer_argv(url, root / name), "--experiment", str(BENCH_EXPERIMENT)])
            while not all(published(root / name) for name in names) or len(edge.heads(BENCH_EXPERIMENT)) < WARM_HEADS:
                fleet.check_alive()  # compiled, through a window each, and a few heads in
                time.sleep(0.2)
            if config != "clean":
                key = NodeIdentity.load_or_create(local.validator_storage.identity_path)
                rogue = Rogue(url, key, local.network.experiment(BENCH_EXPERIMENT), proposals=proposals)
                flooder = Flooder(url, rogue)
                flooder.start()
            rate = heads_per_minute(edge, fleet, config, seconds)
            if flooder is not None:
                flooder.close()
            board = edge._request("GET", f"/v1/experiments/{BENCH_EXPERIMENT}/credit", params={"limit": 100}).json()
            trainer_ids = {NodeIdentity.load_or_create(StorageConfig(root / n).identity_path).peer_id for n in names}
    finally:
        edge.close()
    print()
    windows = max(flooder.windows, 1) if flooder is not None else 1
    statuses = flooder.statuses if flooder is not None else Counter()
    return Run(
        config,
        heads_per_min=rate,
        taken_per_window=statuses[202] / windows,
        refused_per_window=statuses[429] / windows,
        strangers=sum(1 for s in board if s["peer_id"] not in trainer_ids),
    )


def main() -> None:
    parser = liveness_parser(__doc__, 30.0)
    parser.add_argument("--proposals", type=int, default=8)
    args = parser.parse_args()
    runs = interleaved(
        "validator-flood",
        CONFIGS,
        args.runs,
        _quorum,
        lambda local, root, config, _: run_once(local, root, config, args.seconds, args.trainers, args.proposals),
    )
    heads = {c: [r.heads_per_min for r in runs if r.config == c] for c in CONFIGS}

    def row(config: str) -> str:
        mine = [r for r in runs if r.config == config]
        if config == "clean":
            return f"| clean | {spread(heads[config])} | | | {max(r.strangers for r in mine)} |"
        taken, refused = spread([r.taken_per_window for r in mine]), spread([r.refused_per_window for r in mine])
        return f"| {config} | {spread(heads[config])} | {taken} | {refused} | {max(r.strangers for r in mine)} |"

    lines = [
        f"{args.trainers} honest continuous trainers, two honest validators of a 2-of-3 quorum (the third key's "
        f"validator never runs); flooded: the third key proposes {args.proposals} heads on each new head, mints "
        "and erases credit (`lab.rogue`)",
        "",
        "| network | heads / min | rogue proposals taken / window | refused (429) / window | strangers on the leaderboard |",
        "| --- | --- | --- | --- | --- |",
        *(row(config) for config in CONFIGS),
        "",
        *(
            f"{config} / clean heads a minute (medians): "
            f"{statistics.median(heads[config]) / statistics.median(heads['clean']):.2f} x"
            for config in CONFIGS[1:]
        ),
    ]
    print("\n".join(lines))
    if args.out is not None:
        command = f"python -m benchmarks.validator_flood --runs {args.runs} --seconds {args.seconds:g}"
        print(
            f"wrote {write_result(args.out, 'validator-flood', 'Liveness under a rogue validator key', command, lines)}"
        )


if __name__ == "__main__":
    main()
