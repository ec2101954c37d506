"""Benchmarks: each prints ratios against a baseline measured in the same run (``make bench``).

Their networks come from ``lab.stack`` with one experiment, ``BENCH_EXPERIMENT`` (``bench_network``).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from native_peer.models import builtin_model
from native_peer.storage import StorageConfig
from protocol.ids import DatasetId, ExperimentKey
from protocol.manifests import ExperimentSpec, NetworkManifest

BENCH_EXPERIMENT = ExperimentKey.parse("bench/mnist/rev-1")


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
