"""Liveness under churn (issue #25 item 3): browser tabs that close mid-window and mid-upload, and what
the edge giving a leaver's undelivered leases back (decision 0048) saves the network.

Per run, a real network on this machine (``lab.stack``: edge, validator and ``--trainers`` native
continuous trainers, each its own process) on the bench network (4 shards of 1,000 examples a lease, up
to 16), and ``--tabs`` browser tabs, each a place a visitor's tab takes in turn, of a kind
(``--tab-kind``):

    peer       the page's own peer (``browser_peer.BrowserPeer``) in this process over
               ``lab.browser_host.NativeBridge`` (real relay, real HTTP, NumPy training; no Chromium)
    chromium   Debian's headless Chromium opening the edge's page with ``?contribute=1`` (Pyodide, the
               kernels and the peer as a visitor gets them, one worker), a fresh profile each visit

A tab stays for a visit drawn uniformly from ``--visit-s`` after it opened, then closes wherever it is
(the peer's task cancelled, or Chromium killed: its relay connection goes mid-training, mid-upload or
while it waits for a head): ``--away-s`` later a tab opens in its place, a new visitor's (a new
identity, empty storage) for a peer, the same visitor's returning browser for Chromium (its cached
runtime and identity kept). With ``--link home`` the tabs sit in network namespaces behind
``lab.links.HOME`` (20 Mbit/s down, 5 up, 60 ms, 1 % loss; the edge listens on the link's host end, the
native trainers reach it there from the root namespace): a Chromium visitor downloads Pyodide over it
first. Configurations, interleaved:

    given-back   the edge gives a leaver's undelivered leases back after ``lease_release_grace_s``
                 (its default)
    kept         ``lease_release_grace_s`` 3600: a leaver's leases live to their expiry (as before
                 decision 0048); a window holding one waits to its deadline

Measured for ``--seconds`` once every native trainer has published a window: heads a minute; the
native trainers' samples a second (examples trained, from their outcome logs, over the span); the
tabs' candidates stored in the span and their closes; and the longest gap between heads. Median and
spread (min–max) over ``--runs``; the ratio given-back / kept of the medians.

    python -m benchmarks.churn [--runs 3] [--seconds 60] [--trainers 1] [--tabs 2] [--visit-s 3 9]
        [--away-s 1] [--tab-kind peer|chromium] [--link loopback|home] [--out docs/results]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import itertools
import os
import random
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from browser_peer.peer import BrowserPeer, PeerConfig
from lab.browser_host import NativeBridge
from lab.demo import CHROMIUM, CHROMIUM_FLAGS, browser_problem
from lab.links import HOME, HomeLink, LinkProfile, link_unsupported, placed
from lab.stack import Fleet, LocalNetwork, free_port
from native_peer.edge_client import EdgeClient
from native_peer.storage import StorageConfig

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

CONFIGS = {"given-back": (), "kept": ("--lease-release-grace-s", "3600")}
LINKS: dict[str, LinkProfile | None] = {"loopback": None, "home": HOME}


@dataclass(frozen=True)
class Run:
    config: str
    heads_per_min: float
    trainer_samples_per_s: float
    tab_candidates: int
    tab_closes: int
    longest_gap_s: float


class Tab(threading.Thread):
    """A place for a tab, until ``stop``: a tab each visit, closed after it (``visit``)."""

    def __init__(self, url: str, visit_s: tuple[float, float], away_s: float, rng: random.Random):
        super().__init__(daemon=True)
        self.url, self.visit_s, self.away_s, self.rng = url, visit_s, away_s, rng
        self.closes = 0
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            self.visit(self.rng.uniform(*self.visit_s))
            self.closes += 1
            self._stopping.wait(self.away_s)

    def visit(self, seconds: float) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self._stopping.set()


class PeerTab(Tab):
    """Each visit a ``BrowserPeer`` over ``NativeBridge``, its task cancelled after the visit."""

    def visit(self, seconds: float) -> None:
        asyncio.run(self._visit(seconds))

    async def _visit(self, seconds: float) -> None:
        bridge = NativeBridge()
        seed = self.rng.randbytes(32)
        peer = BrowserPeer(bridge, PeerConfig(self.url, str(BENCH_EXPERIMENT), seed, reconnect_max_s=1.0))
        try:
            with contextlib.suppress(TimeoutError):  # the tab closes, wherever it is
                await asyncio.wait_for(peer.run(), seconds)
        finally:
            await bridge.aclose()


class ChromiumTab(Tab):
    """Each visit a headless Chromium (inside ``link``'s namespace when given) on the edge's
    contributing page, killed after the visit (no unload handler runs: the edge learns it left from its
    relay connection alone). A place is one visitor who comes back: its profile under ``root`` (the
    runtime its Service Worker cached, its identity) outlives each visit, as a returning contributor's
    browser keeps them; a first visit downloads the runtime over the link."""

    def __init__(self, *args: object, root: Path, link: HomeLink | None) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.root, self.link = root, link
        self.profile = Path(tempfile.mkdtemp(prefix="tab-", dir=root))

    def visit(self, seconds: float) -> None:
        argv = [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
                f"{self.url}/?contribute=1&experiment={BENCH_EXPERIMENT}"]  # fmt: skip
        with (self.root / "chromium.log").open("ab") as log:
            chromium = subprocess.Popen(
                self.link.argv(argv) if self.link else argv,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=_killed_with_parent,
            )
        try:
            self._stopping.wait(seconds)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(chromium.pid, signal.SIGKILL)
            chromium.wait()


def _killed_with_parent() -> None:
    """In a child before it runs its program: SIGKILL when this benchmark's process ends, however."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def run_once(local: LocalNetwork, root: Path, config: str, args: argparse.Namespace, seed: int) -> Run:
    with placed(LINKS[args.link], seed) as link:
        return _run(local, root, config, args, seed, link)


def _run(
    local: LocalNetwork, root: Path, config: str, args: argparse.Namespace, seed: int, link: HomeLink | None
) -> Run:
    port, host = free_port(), link.host if link else "127.0.0.1"
    url = f"http://{host}:{port}"
    edge = EdgeClient(url)
    names = [f"trainer-{i}" for i in range(args.trainers)]
    rng = random.Random(seed)
    visits = (url, tuple(args.visit_s), args.away_s)
    tabs = [
        ChromiumTab(*visits, random.Random(rng.random()), root=root, link=link)
        if args.tab_kind == "chromium"
        else PeerTab(*visits, random.Random(rng.random()))
        for _ in range(args.tabs)
    ]
    try:
        with Fleet(root) as fleet:
            fleet.start_edge_and_validator(local, port, *CONFIGS[config], host=host)
            for name in names:
                fleet.start(name, [*local.trainer_argv(url, root / name), "--experiment", str(BENCH_EXPERIMENT)])
            while not all(published(root / name) for name in names):  # compiled, through a window each
                fleet.check_alive()
                time.sleep(0.2)
            for tab in tabs:
                tab.start()
            time.sleep(max(args.visit_s))  # every tab through a visit
            before = [StorageConfig(root / name).outcomes()[-1] for name in names]
            closes0, since_ms = sum(t.closes for t in tabs), int(time.time() * 1000)
            rate = heads_per_minute(edge, fleet, config, args.seconds)
            after = [StorageConfig(root / name).outcomes()[-1] for name in names]
            closes = sum(t.closes for t in tabs) - closes0
            for tab in tabs:
                tab.stop()
            heads = [h for h in edge.heads(BENCH_EXPERIMENT) if h.created_at_ms >= since_ms]
            tab_candidates = sum(
                1 for c in edge.candidates(BENCH_EXPERIMENT) if c.peer_kind == "browser" and c.created_at_ms >= since_ms
            )
    finally:
        for tab in tabs:  # a Chromium tab is killed at once; a peer's visit ends within its length
            tab.stop()
        for tab in tabs:
            if tab.is_alive():
                tab.join(timeout=max(args.visit_s) + 10)
        edge.close()
    print()
    samples = sum(b["trained_samples"] for b in after) - sum(b["trained_samples"] for b in before)
    span_s = statistics.median(a["wall_s"] - b["wall_s"] for a, b in zip(after, before, strict=True))
    gaps = [(b.created_at_ms - a.created_at_ms) / 1000 for a, b in itertools.pairwise(heads)]
    return Run(
        config,
        heads_per_min=rate,
        trainer_samples_per_s=samples / max(span_s, 1e-9),
        tab_candidates=tab_candidates,
        tab_closes=closes,
        longest_gap_s=max(gaps, default=float("nan")),
    )


def main() -> None:
    parser = liveness_parser(__doc__, 60.0)
    parser.set_defaults(trainers=1)
    parser.add_argument("--tabs", type=int, default=2)
    parser.add_argument("--visit-s", type=float, nargs=2, default=(3.0, 9.0))
    parser.add_argument("--away-s", type=float, default=1.0)
    parser.add_argument("--tab-kind", choices=("peer", "chromium"), default="peer")
    parser.add_argument("--link", choices=tuple(LINKS), default="loopback")
    args = parser.parse_args()
    problem = (browser_problem() if args.tab_kind == "chromium" else None) or (
        link_unsupported() if LINKS[args.link] else None
    )
    if problem is not None:
        parser.exit(2, f"cannot run: {problem}\n")
    runs = interleaved(
        "churn",
        tuple(CONFIGS),
        args.runs,
        lambda root: lambda key: bench_network(key, 4, 16),
        lambda local, root, config, i: run_once(local, root, config, args, seed=i),
    )
    by = {c: [r for r in runs if r.config == c] for c in CONFIGS}

    def column(config: str, field: str) -> list[float]:
        return [float(getattr(r, field)) for r in by[config]]

    fields = ("heads_per_min", "trainer_samples_per_s", "tab_candidates", "tab_closes", "longest_gap_s")
    lines = [
        f"{args.trainers} native continuous trainer(s); {args.tabs} tabs ({args.tab_kind}, {args.link}), "
        "each closed after a visit of "
        f"{args.visit_s[0]:g}–{args.visit_s[1]:g} s and opened again {args.away_s:g} s later "
        f"({'the same visitor, returning' if args.tab_kind == 'chromium' else 'a new visitor'}); "
        f"{args.seconds:g} s measured per run, {args.runs} runs",
        "",
        "| edge | heads / min | native samples / s | tab candidates | tab closes | longest gap between heads, s |",
        "| --- | --- | --- | --- | --- | --- |",
        *(f"| {c} | " + " | ".join(spread(column(c, f)) for f in fields) + " |" for c in CONFIGS),
        "",
        *(
            f"given-back / kept, {f.replace('_', ' ')} (medians): "
            f"{statistics.median(column('given-back', f)) / max(statistics.median(column('kept', f)), 1e-9):.2f} x"
            for f in fields[:3]
        ),
    ]
    print("\n".join(lines))
    if args.out is not None:
        command = (
            f"python -m benchmarks.churn --runs {args.runs} --seconds {args.seconds:g} --trainers {args.trainers} "
            f"--tabs {args.tabs} --visit-s {args.visit_s[0]:g} {args.visit_s[1]:g} --away-s {args.away_s:g} "
            f"--tab-kind {args.tab_kind} --link {args.link}"
        )
        print(f"wrote {write_result(args.out, 'churn', 'Liveness under churn', command, lines)}")


if __name__ == "__main__":
    main()
