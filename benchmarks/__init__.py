"""Benchmarks: each prints ratios against a baseline measured in the same run (``make bench``).

Their networks come from ``lab.stack`` with one experiment, ``BENCH_EXPERIMENT`` (``bench_network``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from lab.stack import Fleet, LocalNetwork, prepare_network
from native_peer.edge_client import EdgeClient
from native_peer.models import builtin_model
from native_peer.storage import StorageConfig
from protocol.ids import DatasetId, ExperimentKey
from protocol.manifests import ExperimentSpec, NetworkManifest

R = TypeVar("R")  # what one run of a benchmark measures

BENCH_EXPERIMENT = ExperimentKey.parse("bench/mnist/rev-1")
# the pinned set-up: the trainer alone on one core, the edge and the validator on the other
TRAINER_CORE, SERVICE_CORE = "1", "0"


def bench_network(
    validator_key: bytes, shards_per_lease: int, max_shards_per_lease: int | None = None
) -> NetworkManifest:
    spec = ExperimentSpec(
        BENCH_EXPERIMENT,
        DatasetId("mnist"),
        builtin_model("mnist-mlp"),
        1e-3,
        64,
        1,
        shards_per_lease,
        max_shards_per_lease=max_shards_per_lease,
    )
    return NetworkManifest("bench", (validator_key,), (spec,))


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def commit() -> str:
    """The short id of the commit the benchmark runs at."""
    root = Path(__file__).resolve().parent.parent
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root
    ).stdout.strip()


def write_result(out: Path, slug: str, title: str, command: str, lines: Sequence[str]) -> Path:
    """``lines`` (markdown) as ``<out>/<date>-<slug>.md`` under ``title``, with the command, the commit
    and the machine that produced them."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{time.strftime('%Y-%m-%d')}-{slug}.md"
    header = [f"# {title}", "", f"Command: `{command}` at commit {commit()}; {os.cpu_count()} cores, no GPU.", ""]
    path.write_text("\n".join([*header, *lines, ""]))
    return path


def spread(values: Sequence[float]) -> str:
    """Median and (min–max) of ``values``, one decimal."""
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def published(storage: Path) -> bool:
    """Whether the trainer storing under ``storage`` has published a window (its outcomes file)."""
    path = StorageConfig(storage).outcomes_path
    return path.exists() and path.stat().st_size > 0


def heads_per_minute(edge: EdgeClient, fleet: Fleet, label: str, seconds: float) -> float:
    """Heads a minute of the bench experiment over ``seconds`` from now, the fleet checked alive and the
    elapsed time shown on one line as it goes (the liveness benchmarks' measured span)."""
    heads0, started = len(edge.heads(BENCH_EXPERIMENT)), time.monotonic()
    while time.monotonic() - started < seconds:
        fleet.check_alive()
        time.sleep(0.5)
        print(f"\r  {label}: {time.monotonic() - started:4.0f} s", end="", flush=True)
    return (len(edge.heads(BENCH_EXPERIMENT)) - heads0) * 60 / (time.monotonic() - started)


def interleaved(
    slug: str,
    configs: Sequence[str],
    runs: int,
    network: Callable[[Path], Callable[[bytes], NetworkManifest]],
    run: Callable[[LocalNetwork, Path, str, int], R],
) -> list[R]:
    """``runs`` rounds of every one of ``configs``, interleaved so that drift in the machine hits each
    alike, each on a fresh network under a temporary directory (``network(root)`` makes its manifest
    from the validator key; MNIST prepared once): ``run(local, root, config, round)``, each result
    printed as it comes."""
    base = Path(tempfile.mkdtemp(prefix=f"dtn-{slug}-"))
    results: list[R] = []
    for i in range(runs):
        for config in configs:
            root = base / f"{config}-{i}"
            local = prepare_network(root, datasets=base / "datasets", network=network(root))
            results.append(run(local, root, config, i))
            print(f"  {results[-1]}")
    return results


def liveness_parser(doc: str | None, seconds: float) -> argparse.ArgumentParser:
    """The liveness benchmarks' arguments: ``--runs`` of each configuration, ``--seconds`` measured,
    honest ``--trainers``, and ``--out`` (a docs/results file the table is written to as well)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=seconds)
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the table here as well (docs/results)")
    return parser
