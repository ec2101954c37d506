"""The test tiers (Makefile): a fast test may start processes, but not a browser, nginx, PostgreSQL or
Redis (``conftest.SLOW_PROGRAMS``); those belong to tests marked ``slow``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import SLOW_PROGRAMS


@pytest.mark.parametrize(
    "argv",
    [["nginx", "-v"], ["/usr/bin/chromium", "--version"], ["redis-server", "--version"]],
    ids=["nginx", "chromium", "redis-server"],
)
def test_a_fast_test_cannot_start_a_browser_nginx_or_a_database(argv: list[str]) -> None:
    with pytest.raises(pytest.fail.Exception, match=r"belongs to the slow tier \(@pytest.mark.slow\)"):
        subprocess.run(argv, capture_output=True, timeout=30)


def test_a_fast_test_may_start_python() -> None:
    assert "python" not in SLOW_PROGRAMS
    assert subprocess.run([sys.executable, "-c", "print('ok')"], capture_output=True, text=True).stdout == "ok\n"
