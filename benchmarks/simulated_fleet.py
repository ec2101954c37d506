"""Scale by simulation: one validator's time per window at 10, 100 and 1,000 candidates a window.

Per run and window size a fresh stack (``lab.stack``: the edge and the validator as processes, their
real code and default settings but two: the window's storage quota is raised to hold that many
candidates, and the access log is off) and a ``lab.simulated.SimulatedFleet`` of that many trainers:
real identities and protocol over HTTP, updates drawn from a bank of updates real native trainers
published on the same network (recorded once per invocation, or read from ``--bank``). The network:
one experiment on MNIST in 32-example shards (1,156 of them, so 1,000 one-shard leases fit in a window),
batch 32, 2 local epochs, the default screening preset (``balanced``), ``--codec`` (default fp32), a
window timeout of 300 s (windows close when every lease has delivered, long before).

Each window, every simulated trainer leases, then builds its candidate, then uploads it (no training
time: what is measured is the validator, the edge and this fleet at their own pace). Measured per window:

    validator s      from the last upload answered to the next head seen (a long poll): the validator's
                     reading, prechecks and downloads of the candidates it had not read yet, judging,
                     signing and publishing the head
    ms / candidate   validator s / candidates uploaded
    validator CPU    the validator process's CPU seconds from head to next head (its reference updates
                     and polls while the candidates arrive included)
    windows / min    60 / seconds from head to next head
    accepted         candidates the next head merged

A warm-up window of the same size comes first (the validator's compilations; and its deadline, three
times the recent windows' length, must fit a window of that size), then ``--windows`` measured windows.
Runs are interleaved (each run goes through every size), so drift in the machine hits every size alike.
Tables: median and min–max over every measured window of every run, and the per-candidate time as a
ratio to the smallest size's (flat is O(n)).

A window judges at most ``protocol.messages.MAX_WINDOW_CANDIDATES`` candidates, what one head can name;
the validator judges the rest in the next window.

    python -m benchmarks.simulated_fleet [--sizes 10 100 1000] [--runs 3] [--windows 3] [--bank FILE]
                                         [--profile DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from datasets import mnist
from lab.simulated import SimulatedFleet, UpdateBank, record_bank
from lab.stack import REPO, Fleet, LocalNetwork, free_port, prepare_network
from native_peer.models import builtin_model
from protocol.ids import DatasetId
from protocol.manifests import ExperimentSpec, NetworkManifest
from protocol.messages import HeadDescriptor
from server.settings import Settings

from . import BENCH_EXPERIMENT, cpu_seconds

SHARD_SIZE = 32
HEAD_TIMEOUT_S = 600.0


def sim_network(validator_key: bytes, codec: str = "fp32") -> NetworkManifest:
    """One experiment for one-shard leases of ``SHARD_SIZE`` examples: batch 32, 2 local epochs."""
    spec = ExperimentSpec(
        BENCH_EXPERIMENT,
        DatasetId("mnist"),
        builtin_model("mnist-mlp"),
        1e-3,
        32,
        2,
        1,
        window_timeout_s=300.0,
        codec=codec,
    )
    return NetworkManifest("simulated", (validator_key,), (spec,))


@dataclass(frozen=True)
class Window:
    """One measured window (see the module)."""

    size: int
    run: int
    candidates: int
    accepted: int
    validator_s: float
    validator_cpu_s: float
    edge_cpu_s: float
    cycle_s: float
    lease_s: float
    build_s: float
    upload_s: float


@dataclass
class Stack:
    local: LocalNetwork
    fleet: Fleet
    url: str

    def cpu_s(self, name: str) -> float:
        return cpu_seconds(self.fleet.processes[name].pid)

    def next_head(self, peers: SimulatedFleet, after: HeadDescriptor | None) -> tuple[HeadDescriptor, float]:
        """``peers.head(after)``, failing as soon as a node of the stack exits."""
        deadline = time.monotonic() + HEAD_TIMEOUT_S
        while True:
            self.fleet.check_alive()
            try:
                return peers.head(after, timeout_s=min(30.0, deadline - time.monotonic()))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise


@contextmanager
def stack(local: LocalNetwork, size: int, *, profile: Path | None = None) -> Iterator[Stack]:
    """The edge (its window quota raised to ``size`` candidates, access log off) and the validator as
    processes in a ``Fleet`` under ``local.root``; ``profile``: the validator runs under cProfile,
    its profile written there when it stops."""
    spec = local.network.experiments[0]
    quota = max(Settings.window_quota_bytes, 2 * size * spec.model.max_artifact_bytes)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with Fleet(local.root) as fleet:
        fleet.start("edge", local.edge_argv(port, "--window-quota-bytes", str(quota), "--no-access-log"))
        fleet.wait_ready(f"{url}/healthz")
        argv = local.validator_argv(url)
        if profile is not None:
            argv = [argv[0], "-m", "cProfile", "-o", str(profile), *argv[1:]]
        fleet.start("validator", argv)
        yield Stack(local, fleet, url)
        if profile is not None:
            fleet.stop("validator", timeout_s=120.0)  # cProfile writes the profile as it exits


def measure(
    node: Stack, bank: UpdateBank, size: int, windows: int, *, run: int = 0, addresses: int = 16
) -> list[Window]:
    """A warm-up window, then ``windows`` windows of ``size`` simulated trainers on the running stack
    ``node``; one ``Window`` each."""
    key = node.local.network.experiments[0].key
    peers = SimulatedFleet(
        node.url, node.local.network, key, bank, size, addresses=addresses, seed=run, workdir=node.local.root / "sim"
    )
    measured = []
    try:
        head, _ = node.next_head(peers, None)
        peers.deliver(head)
        head, seen_at = node.next_head(peers, head)
        for _ in range(windows):
            validator_cpu, edge_cpu = node.cpu_s("validator"), node.cpu_s("edge")
            sent = peers.deliver(head)
            following, following_at = node.next_head(peers, head)
            measured.append(
                Window(
                    size=size,
                    run=run,
                    candidates=sent.uploaded,
                    accepted=len(following.merged),
                    validator_s=following_at - sent.delivered_at,
                    validator_cpu_s=node.cpu_s("validator") - validator_cpu,
                    edge_cpu_s=node.cpu_s("edge") - edge_cpu,
                    cycle_s=following_at - seen_at,
                    lease_s=sent.lease_s,
                    build_s=sent.build_s,
                    upload_s=sent.upload_s,
                )
            )
            head, seen_at = following, following_at
    finally:
        peers.close()
    return measured


def recorded_bank(base: Path, datasets: Path, codec: str, trainers: int = 4, windows: int = 2) -> UpdateBank:
    """``trainers`` real native trainers, ``windows`` windows each, on a stack of the benchmark's network
    whose edge keeps every candidate (``candidate_retention_windows`` 0): their updates."""
    local = prepare_network(base, datasets=datasets, network=lambda key: sim_network(key, codec))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with Fleet(base) as fleet:
        fleet.start_edge_and_validator(local, port, "--candidate-retention-windows", "0")
        return record_bank(local, fleet, url, BENCH_EXPERIMENT, trainers=trainers, windows=windows)


def _spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def tables(measured: list[Window]) -> list[str]:
    """The two markdown tables: the validator per size, and where the rest of each window went."""
    sizes = sorted({w.size for w in measured})
    per = {n: [w for w in measured if w.size == n] for n in sizes}
    smallest = statistics.median(w.validator_s / w.candidates for w in per[sizes[0]])
    lines = [
        "| candidates / window | validator s / window | validator ms / candidate | per candidate vs "
        f"{sizes[0]} | validator CPU s / window | windows / min | accepted / uploaded |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n, mine in per.items():
        ms = [1000 * w.validator_s / w.candidates for w in mine]
        accepted = sum(w.accepted for w in mine)
        lines.append(
            f"| {n} | {_spread([w.validator_s for w in mine])} | {_spread(ms, 1)} "
            f"| {statistics.median(ms) / 1000 / smallest:.2f} x | {_spread([w.validator_cpu_s for w in mine])} "
            f"| {_spread([60 / w.cycle_s for w in mine])} | {accepted} / {sum(w.candidates for w in mine)} |"
        )
    lines += [
        "",
        "| candidates / window | leasing s | building s | uploading s | edge CPU s / window | head to head s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for n, mine in per.items():
        lines.append(
            f"| {n} | {_spread([w.lease_s for w in mine])} | {_spread([w.build_s for w in mine])} "
            f"| {_spread([w.upload_s for w in mine])} | {_spread([w.edge_cpu_s for w in mine])} "
            f"| {_spread([w.cycle_s for w in mine])} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--windows", type=int, default=3, help="measured windows per run and size")
    parser.add_argument("--addresses", type=int, default=16, help="loopback source addresses the fleet uses")
    parser.add_argument("--codec", default="fp32", help="the experiment's update codec (protocol.updates)")
    parser.add_argument("--bank", type=Path, default=None, help="recorded updates: read if there, else saved there")
    parser.add_argument("--profile", type=Path, default=None, help="write the validator's cProfile per run here")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="dtn-simulated-"))
    datasets = base / "datasets"
    shards = len(mnist.prepare(datasets, shard_size=SHARD_SIZE).shards)
    if max(args.sizes) > shards:
        raise SystemExit(f"{max(args.sizes)} one-shard leases do not fit in {shards} shards")
    if args.bank is not None and args.bank.exists():
        bank = UpdateBank.load(args.bank)
    else:
        print("recording updates of real trainers ...", flush=True)
        bank = recorded_bank(base / "recording", datasets, args.codec)
        bank.save(args.bank or base / "bank.safetensors")
    print(f"bank: {len(bank.deltas)} recorded updates", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    measured: list[Window] = []
    for run in range(args.runs):
        for size in args.sizes:
            root = base / f"{size}-{run}"
            local = prepare_network(root, datasets=datasets, network=lambda key: sim_network(key, args.codec))
            profile = None
            if args.profile is not None:
                args.profile.mkdir(parents=True, exist_ok=True)
                profile = args.profile / f"validator-{size}-{run}.prof"
            with stack(local, size, profile=profile) as node:
                windows = measure(node, bank, size, args.windows, run=run, addresses=args.addresses)
            measured += windows
            for w in windows:
                print(f"  run {run} size {size}: {w}", flush=True)
            shutil.rmtree(root)  # the validator keeps every candidate it downloaded
    print(
        f"\npython -m benchmarks.simulated_fleet {' '.join(sys.argv[1:])} at {commit.stdout.strip()}; "
        f"{len(bank.deltas)} recorded updates, {args.addresses} source addresses\n"
    )
    print("\n".join(tables(measured)))


if __name__ == "__main__":
    main()
