"""JAX's persistent compilation cache, shared by the native peers of one machine.

Every trainer and validator process compiles the same few programs: a model's training epoch for each
scan length (``native_peer.learner.SCAN_LENGTHS``) and its evaluation. Two experiments of one model
and optimizer compile to the same programs (the learning rate lives in the optimizer's state), and a
restarted peer compiles what it compiled before. With the cache on, JAX keeps each compiled program
in a folder, keyed by the program, its options and the platform, and a process that needs it again
loads it instead of compiling (what that saves: ``python -m benchmarks.compile_cache``).

The folder holds only what this machine's own processes compiled; nothing in it comes from the
network. Reads and writes take a file lock (``filelock``), so peers starting together never read a
half-written entry, and the least recently used entries go past ``MAX_BYTES``.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

__all__ = ["CACHE_ENV", "MAX_BYTES", "default_cache_dir", "use_compile_cache"]

CACHE_ENV = "DTN_COMPILE_CACHE"  # the folder, instead of default_cache_dir() (a run's own: lab.stack.Fleet)
MAX_BYTES = 1 << 30


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dtn" / "jax"


def use_compile_cache() -> Path:
    """Keep this process's compiled JAX programs in a folder shared with the machine's other peers, and
    load them from there; returns the folder: ``$DTN_COMPILE_CACHE`` when set, else
    ``default_cache_dir()``. A cache JAX was already given (``JAX_COMPILATION_CACHE_DIR``) is left as
    JAX's own settings make it: other programs may share that folder, and JAX's locked, evicting mode
    must not meet its unlocked one in one folder. ``JAX_ENABLE_COMPILATION_CACHE=false`` turns either
    off. Call it once, at a process's entry point, before anything compiles."""
    if jax.config.jax_compilation_cache_dir:
        return Path(jax.config.jax_compilation_cache_dir)
    folder = Path(os.environ.get(CACHE_ENV) or default_cache_dir())
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # under load even small ones take long
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)  # also what makes JAX lock the folder
    return folder
