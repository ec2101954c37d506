"""Bytes a contributor downloads per window (issue #25: "a contributor downloads each byte once").

One browser peer (its Python, the code Pyodide runs, under CPython: ``lab.browser_host``) contributes
alone to the demo network's ``BASELINE`` experiment (MNIST MLP, int8 updates, 4 shards of 1,000
examples a lease), against a real edge and validator in this process, for ``--windows`` windows. A
fresh network per configuration and run, the configurations interleaved:

    before   every leased shard downloaded and every head whole, as tabs did before
             (``PeerConfig(shard_cache_bytes=0, head_deltas=False)``)
    exact    shards kept by content, heads as exact deltas from the head trained on (the network's
             heads off the grid: ``head_grid = "exact"``, decision 0019)
    after    shards kept, heads on their parent's int8 grid and their deltas a byte a weight (the
             defaults, the demo network's ``head_grid = "int8"``, decision 0053)

Counted in the peer's host: every HTTP answer's body over the run, a shard's bytes as new the first time
it comes and as again after that. Reported per configuration, median and spread (min–max) over
``--runs``, in MB a window: every byte, head bytes (whole or deltas), shards new, shards again; head
bytes a window over one whole head; and after / before, of every byte and of what is not new data (heads
and shards downloaded again: what the issue measured), and after / exact. The first head comes whole in all. A lone
peer's home is every shard, so ``after`` goes on downloading shards it never held, once each, until it
holds all 37 (about 40 windows at 4 a lease): "shards new" falls towards zero with more windows.

    python -m benchmarks.download_bytes [--runs 3] [--windows 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from browser_peer.peer import BrowserPeer, PeerConfig
from lab.browser_host import NativeBridge
from lab.stack import prepare_network, validating
from protocol.manifests import NetworkManifest
from server.serve import BackgroundEdge
from tools.networks import BASELINE, mnist_network

CONFIGS = {  # name -> (the peer's options, the network's head grid)
    "before": ({"shard_cache_bytes": 0, "head_deltas": False}, "int8"),
    "exact": ({}, "exact"),
    "after": ({}, "int8"),
}


@dataclass(frozen=True)
class Run:
    config: str
    windows: int
    total: int  # every answer's bytes
    heads: int  # head artifacts and head deltas
    new_shards: int  # shards the peer downloaded for the first time
    shards_again: int  # shards it had downloaded before
    head_bytes: int  # one whole head

    def per_window(self, part: int) -> float:
        return part / self.windows


def one_run(config: str, windows_wanted: int, datasets: Path) -> Run:
    with tempfile.TemporaryDirectory(prefix="dtn-bytes-") as tmp:
        options, grid = CONFIGS[config]

        def network(key: bytes) -> NetworkManifest:
            demo = mnist_network(key)
            return replace(demo, experiments=tuple(replace(spec, head_grid=grid) for spec in demo.experiments))

        stack = prepare_network(Path(tmp), datasets=datasets, network=network)
        spec = stack.network.experiment(BASELINE)
        settings = stack.edge_settings(pyodide_dir=stack.root / "no-pyodide")
        with BackgroundEdge(settings) as edge, validating(stack, edge.url, [spec]):
            bridge = NativeBridge()
            peer = BrowserPeer(
                bridge, PeerConfig(edge.url, BASELINE, b"\x49" * 32, max_windows=windows_wanted, **options)
            )

            async def contribute() -> None:
                await asyncio.wait_for(peer.run(), 600)
                await bridge.aclose()

            asyncio.run(contribute())
    seen: set[str] = set()
    new = again = 0
    for url, size in bridge.received:
        if "/shards/" in url:
            shard = url.split("?")[0]
            new, again = (new, again + size) if shard in seen else (new + size, again)
            seen.add(shard)
    heads = [size for url, size in bridge.received if "/v1/artifacts/" in url or "/delta?from=" in url]
    whole = next(size for url, size in bridge.received if "/v1/artifacts/" in url)
    total = sum(size for _, size in bridge.received)
    return Run(config, peer.status["windows_done"], total, sum(heads), new, again, whole)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values) / 1e6:.3f} ({min(values) / 1e6:.3f}–{max(values) / 1e6:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--windows", type=int, default=40)
    parser.add_argument("--datasets", type=Path, default=Path("var/datasets"))
    args = parser.parse_args()
    runs = [one_run(config, args.windows, args.datasets) for _ in range(args.runs) for config in CONFIGS]
    by = {config: [run for run in runs if run.config == config] for config in CONFIGS}
    print(f"one browser peer alone, {args.windows} windows a run, {args.runs} runs; MB a window, median (min–max)")
    columns = ("all", "heads", "shards new", "shards again")
    print(f"{'':8}" + "".join(f"{name:>24}" for name in columns) + f"{'heads / whole head':>20}")
    for config, done in by.items():
        parts = [
            [r.per_window(r.total) for r in done],
            [r.per_window(r.heads) for r in done],
            [r.per_window(r.new_shards) for r in done],
            [r.per_window(r.shards_again) for r in done],
        ]
        ratio = statistics.median(r.per_window(r.heads) / r.head_bytes for r in done)
        print(f"{config:8}" + "".join(f"{_spread(p):>24}" for p in parts) + f"{ratio:>20.3f}")
    for baseline, name, measure in (
        ("before", "every byte", lambda r: r.total),
        ("before", "heads and shards downloaded again", lambda r: r.heads + r.shards_again),
        ("exact", "every byte", lambda r: r.total),
        ("exact", "heads", lambda r: r.heads),
    ):
        ratios = [measure(a) / measure(b) for a, b in zip(by["after"], by[baseline], strict=True)]
        print(f"after / {baseline}, {name}: {statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f})")


if __name__ == "__main__":
    main()
