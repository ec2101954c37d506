"""A peer on a home connection (issue #25 item 3): what an emulated 20 Mbit/s down, 5 Mbit/s up, 60 ms
round trip, 1 % loss link (``lab.links.HOME``) costs it, against the same peer on loopback.

A real network per run (``lab.stack``: edge and validator as processes, pinned to core 0; one
experiment, ``BENCH_EXPERIMENT``, the demo's baseline re-keyed: int8 candidates, Nesterov 0.7 / 0.5,
leases of 4 shards of 1,000 examples sized up to 16 by a continuous peer), and one peer pinned to
core 1, alone on the network: a continuous native trainer, or a browser tab (Debian's headless
Chromium opening the edge's page with ``?contribute=1``, Pyodide and the peer as a visitor gets them,
one worker). Placed per configuration:

    loopback   in the root namespace, reaching the edge on 127.0.0.1
    direct     in a network namespace behind ``lab.links.DIRECT``: the same TUN devices and forwarder
               as ``home`` with no rate, delay or loss (what the emulation's machinery costs by itself)
    home       in a network namespace behind ``lab.links.HOME``

Per run, for ``--seconds`` after the peer's first candidate (a tab's Pyodide boot and download are not
in it): samples/s and utilization. A native trainer's from its outcome log: examples it trained on from
its first to its last window in that span over its wall seconds between them, and seconds in training
steps over wall (``lab.efficiency.utilization``). A tab's from its candidates on the edge (it keeps no
log here): examples of the candidates after its first over the time between their creation, and the
seconds they report training (examples / their ``samples_per_s``) over that time. Also heads the
validator promoted per minute, shards a native trainer downloaded (not served from its cache) per window,
and, behind a link, IP bytes (headers included, before loss) down and up per trained example.
Configurations interleaved, ``--runs`` times; median and spread (min–max); ratios of the medians to
loopback (and, for bytes, to direct), per peer kind, in the same run.

    python -m benchmarks.home_link [--runs 3] [--seconds 40] [--warmup-s 60] [--peers native browser]
        [--links loopback direct home] [--out docs/results]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from lab.demo import CHROMIUM, CHROMIUM_FLAGS, browser_problem
from lab.efficiency import utilization
from lab.links import DIRECT, HOME, LinkProfile, link_unsupported, placed
from lab.stack import Fleet, LocalNetwork, free_port, prepare_network
from native_peer.edge_client import EdgeClient
from native_peer.storage import StorageConfig
from protocol.manifests import NetworkManifest
from protocol.messages import Candidate
from tools.networks import BASELINE, mnist_network

from . import BENCH_EXPERIMENT, SERVICE_CORE, TRAINER_CORE, heads_per_minute, write_result

CONFIGS: dict[str, LinkProfile | None] = {"loopback": None, "direct": DIRECT, "home": HOME}
PEERS = ("native", "browser")
BOOT_TIMEOUT_S = 240.0  # to a peer's first candidate: a tab downloads Pyodide (35 MB) over the link first


@dataclass(frozen=True)
class Run:
    peer: str
    config: str
    samples_per_s: float
    utilization: float
    windows_per_min: float
    shards_per_window: float | None  # a native trainer's shard downloads (not from its cache) per window
    down_per_sample: float | None  # IP bytes, None on loopback (nothing counts them there)
    up_per_sample: float | None


def network(validator_key: bytes) -> NetworkManifest:
    """The demo's baseline experiment, alone on the network, as ``BENCH_EXPERIMENT``."""
    demo = mnist_network(validator_key, "bench")
    [spec] = [s for s in demo.experiments if s.key == BASELINE]
    return replace(demo, experiments=(replace(spec, key=BENCH_EXPERIMENT),))


def peer_argv(peer: str, local: LocalNetwork, url: str, root: Path) -> list[str]:
    pin = ["taskset", "-c", TRAINER_CORE]
    if peer == "native":
        return [*pin, *local.trainer_argv(url, root / "trainer"), "--experiment", str(BENCH_EXPERIMENT)]
    profile = root / "chromium-profile"
    return [*pin, str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
            f"{url}/?contribute=1&experiment={BENCH_EXPERIMENT}"]  # fmt: skip


def browser_candidates(edge: EdgeClient) -> list[Candidate]:
    found = [c for c in edge.candidates(BENCH_EXPERIMENT) if c.peer_kind != "native"]
    return sorted(found, key=lambda c: c.created_at_ms)


def run_once(
    local: LocalNetwork, root: Path, peer: str, config: str, seconds: float, warmup_s: float, seed: int
) -> Run:
    port, storage = free_port(), StorageConfig(root / "trainer")
    with placed(CONFIGS[config], seed) as link, Fleet(root) as fleet:
        host = link.host if link else "127.0.0.1"
        url = f"http://{host}:{port}"
        pin = ["taskset", "-c", SERVICE_CORE]
        fleet.start("edge", [*pin, *local.edge_argv(port, "--host", host)])
        fleet.wait_ready(f"{url}/healthz")
        fleet.start("validator", [*pin, *local.validator_argv(url)])
        argv = peer_argv(peer, local, url, root)
        fleet.start(peer, link.argv(argv) if link else argv)
        edge = EdgeClient(url)

        def published() -> bool:
            return bool(storage.outcomes()) if peer == "native" else bool(browser_candidates(edge))

        try:
            booted = time.monotonic()
            while not published():  # booted, compiled and through its first window
                fleet.check_alive()
                if time.monotonic() - booted > BOOT_TIMEOUT_S:
                    raise RuntimeError(f"{peer} published nothing in {BOOT_TIMEOUT_S:g} s; see {fleet.out}/logs")
                time.sleep(0.5)
            heads_per_minute(edge, fleet, f"{peer} {config} warming up", warmup_s)
            first, bytes0 = storage.outcomes()[-1:], link.counters() if link else (0, 0)
            since = browser_candidates(edge)[-1].created_at_ms if peer == "browser" else 0
            windows_per_min = heads_per_minute(edge, fleet, f"{peer} {config}", seconds)
            outcomes, bytes1 = storage.outcomes(), link.counters() if link else (0, 0)
            candidates = [c for c in browser_candidates(edge) if c.created_at_ms >= since]
        finally:
            edge.close()
            shutil.rmtree(root / "chromium-profile", ignore_errors=True)
    print()
    if peer == "native":
        last, mine = outcomes[-1], outcomes[outcomes.index(first[0]) :]
        samples = last["trained_samples"] - first[0]["trained_samples"]
        rate = samples / max(last["wall_s"] - first[0]["wall_s"], 1e-9)
        busy = utilization(mine) or 0.0  # under 3 windows: none measured
        shards = (last["shard_downloads"] - first[0]["shard_downloads"]) / max(len(mine) - 1, 1)
    else:  # the tab's candidates after its first one, over the time between their creation
        span_s = max((candidates[-1].created_at_ms - candidates[0].created_at_ms) / 1000, 1e-9)
        samples = sum(c.examples for c in candidates[1:])
        rate = samples / span_s
        busy = sum(c.examples / c.metrics["samples_per_s"] for c in candidates[1:]) / span_s
        shards = None
    return Run(
        peer,
        config,
        samples_per_s=rate,
        utilization=busy,
        windows_per_min=windows_per_min,
        shards_per_window=shards,
        down_per_sample=(bytes1[0] - bytes0[0]) / max(samples, 1) if link else None,
        up_per_sample=(bytes1[1] - bytes0[1]) / max(samples, 1) if link else None,
    )


def _spread(values: list[float], digits: int = 3) -> str:
    if not values:
        return "—"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def table(runs: list[Run]) -> list[str]:
    lines = [
        "| peer | link | samples/s | utilization | windows / min | shards downloaded / window | bytes down / sample"
        " | bytes up / sample |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ratios: list[str] = []
    for peer in dict.fromkeys(r.peer for r in runs):
        medians: dict[str, dict[str, float]] = {}
        for config in [c for c in CONFIGS if any(r.peer == peer and r.config == c for r in runs)]:
            mine = [r for r in runs if r.peer == peer and r.config == config]
            cells = [_spread([r.samples_per_s for r in mine], 0), _spread([r.utilization for r in mine]),
                     _spread([r.windows_per_min for r in mine], 1),
                     _spread([r.shards_per_window for r in mine if r.shards_per_window is not None], 2)]  # fmt: skip
            medians[config] = {"samples/s": statistics.median(r.samples_per_s for r in mine)}
            for name in ("down_per_sample", "up_per_sample"):
                values = [getattr(r, name) for r in mine if getattr(r, name) is not None]
                cells.append(_spread(values, 0))
                if values:
                    medians[config][name] = statistics.median(values)
            lines.append(f"| {peer} | {config} | {' | '.join(cells)} |")
        for over, under, names in (("home", "loopback", ["samples/s"]), ("direct", "loopback", ["samples/s"]),
                                   ("home", "direct", ["down_per_sample", "up_per_sample"])):  # fmt: skip
            if over in medians and under in medians:
                shown = ", ".join(f"{n} {medians[over][n] / medians[under][n]:.2f} x" for n in names)
                ratios.append(f"{peer}, {over} / {under} (medians): {shown}")
    return [
        *lines,
        "",
        *ratios,
        "",
        "Issue #25's goal: a browser behind the home link keeps >= 0.8 of its loopback samples/s.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--warmup-s", type=float, default=60.0, help="after the first candidate, not measured")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--links", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--out", type=Path, default=None, help="write a results file (markdown) into this folder")
    args = parser.parse_args()
    if reason := link_unsupported():
        raise SystemExit(reason)
    if "browser" in args.peers and (problem := browser_problem()):
        raise SystemExit(f"no browser peer: {problem}")
    base = Path(tempfile.mkdtemp(prefix="dtn-home-link-"))
    datasets = base / "datasets"
    runs: list[Run] = []
    for i in range(args.runs):
        for peer in args.peers:
            for config in args.links:  # interleaved, so drift in the machine hits each alike
                root = base / f"{peer}-{config}-{i}"
                local = prepare_network(root, datasets=datasets, network=network)
                runs.append(run_once(local, root, peer, config, args.seconds, args.warmup_s, seed=i))
                print(f"  {runs[-1]}")
    lines = table(runs)
    print("\n".join(lines))
    if args.out is not None:
        command = (
            f"python -m benchmarks.home_link --runs {args.runs} --seconds {args.seconds:g} --warmup-s {args.warmup_s:g}"
            f" --peers {' '.join(args.peers)} --links {' '.join(args.links)}"
        )
        setup = (
            f"Edge and validator on core {SERVICE_CORE}, the peer on core {TRAINER_CORE}, the link's forwarder"
            f" unpinned; home = {HOME}; {args.runs} runs per configuration, interleaved."
        )
        title = "A peer on an emulated home link"
        print(f"wrote {write_result(args.out, 'home-link', title, command, [setup, '', *lines])}")


if __name__ == "__main__":
    main()
