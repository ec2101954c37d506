"""Shared fixtures: the prepared MNIST dataset (real data, prepared once per session).

The tiers (Makefile): ``make test-fast`` runs ``pytest -m "not slow"``, ``make test`` both tiers. A test
that starts a browser, nginx, PostgreSQL, Redis or coturn belongs to the slow tier: started from any other
test, the program is refused and the test fails, naming the mark it needs (``SLOW_PROGRAMS``).

One JAX compilation cache per session (``JAX_COMPILATION_CACHE_DIR``, set before anything imports
JAX and inherited by the processes tests start): every trainer and validator a test builds compiles
the same programs again, and compiling was most of the native tests' time (71.7 s of
``tests/test_native_peer.py``'s fast tests, 27.9 s with the cache). A node compiles once per process.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from datasets import mnist
from datasets.layout import read_train_manifest
from protocol.manifests import FetchManifest

REPO = Path(__file__).resolve().parent.parent
# before any test module imports JAX (nothing imported above does)
_JAX_CACHE = tempfile.mkdtemp(prefix="dtn-jax-cache-")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _JAX_CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
SLOW_PROGRAMS = frozenset(
    {"chromium", "nginx", "npx", "node", "initdb", "pg_ctl", "postgres", "redis-server", "turnserver"}
)

_fast_test: list[str] = []  # the node id of the fast test being set up or run, if any


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(_refuse_slow_programs)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_JAX_CACHE, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with _watching(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with _watching(item):
        return (yield)


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[_FAILED] = True
    return report


@pytest.hookimpl(tryfirst=True)  # before pytest collects the teardown's unraisable warnings (trylast)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """A failed test's leaks (sockets, files an assertion left open) are collected in its own teardown
    and reported there, not by whichever later test the garbage collector happens to run in."""
    if item.stash.get(_FAILED, False):
        gc.collect()


@contextmanager
def _watching(item: pytest.Item) -> Iterator[None]:
    """While a fast test (no ``slow`` mark) is set up or runs, ``_refuse_slow_programs`` refuses for it."""
    fast = item.get_closest_marker("slow") is None
    if fast:
        _fast_test.append(item.nodeid)
    try:
        yield
    finally:
        if fast:
            _fast_test.pop()


def _refuse_slow_programs(event: str, args: tuple[Any, ...]) -> None:
    """An audit hook: fails the fast test that is starting one of ``SLOW_PROGRAMS``."""
    if event != "subprocess.Popen" or not _fast_test:
        return
    argv = args[1]  # (executable, args as a list, cwd, env)
    program = os.path.basename(os.fsdecode(argv[0])) if argv else ""
    if program in SLOW_PROGRAMS:
        pytest.fail(f"{_fast_test[-1]} starts {program}: it belongs to the slow tier (@pytest.mark.slow)")


@pytest.fixture(scope="session")
def dataset_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<tmp>/datasets`` with MNIST prepared in it (``mnist/train``, ``mnist/validation``, ...)."""
    out = tmp_path_factory.mktemp("datasets")
    mnist.prepare(out)
    return out


@pytest.fixture(scope="session")
def train_manifest(dataset_root: Path) -> FetchManifest:
    return read_train_manifest(dataset_root / "mnist")
