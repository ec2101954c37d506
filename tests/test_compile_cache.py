"""``native_peer.compile_cache``: what one native peer compiled, the next process and the next
experiment of the same model load instead of compiling again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.compile_cache import run_peer


@pytest.mark.slow  # two peer processes, each compiling or loading its epochs: 11 s
def test_a_second_experiment_and_a_second_process_load_the_compiled_epoch(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}  # the tests' own cache set aside
    env["XDG_CACHE_HOME"] = str(tmp_path)  # so the default folder, under it
    first, second = run_peer(env), run_peer(env)
    folder = tmp_path / "dtn" / "jax"
    assert first["folder"] == second["folder"] == str(folder)
    (cold, other), (again, again_other) = first["experiments"], second["experiments"]  # type: ignore[misc]
    assert cold["misses"] > 0 and cold["hits"] == 0  # nothing compiled yet
    # the second experiment's epoch is the same program (its learning rate is optimizer state): loaded
    assert other["misses"] == 0 and other["hits"] >= 1
    # a new process loads every program the first one compiled
    assert (again["hits"], again["misses"]) == (cold["misses"], 0) and again_other["misses"] == 0
    assert (folder / ".lockfile").exists()  # read and written under a lock: peers start together
