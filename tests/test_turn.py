"""Heads between tabs through a real TURN server: a private coturn on loopback (``deploy.services.PrivateTurn``,
TURN REST API credentials), an edge that gives its pages that server only (``ice_relay_only``), a
validator, and two Chromium tabs (``tests/turn/turn.spec.ts``). With the edge holding coturn's secret,
a head goes from one tab to the other through coturn's relay, checked; with a wrong secret, coturn
refuses the tabs' allocations and the asking tab takes the head from the edge."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.services import PrivateTurn, ServiceMissing
from lab.demo import browser_problem
from lab.stack import REPO, free_port, held_windows, prepare_network, validating
from server.serve import BackgroundEdge

from .support import missing, until

pytestmark = pytest.mark.slow

# the holding tab's window waits 60 s for a lease that never delivers (tests/browser/tabs.ts), as on the
# main browser stack (playwright.config.ts): long enough for the asking tab to boot while the head it needs
# is still current (the demo's window_timeout_s, 30 s, caps the deadline unless raised: held_windows)
NETWORK, CONFIG = held_windows(60.0)


@pytest.fixture(scope="module")
def turn() -> Iterator[PrivateTurn]:
    if (problem := browser_problem()) is not None:
        missing(problem)
    try:
        server = PrivateTurn()
    except ServiceMissing as exc:
        missing(str(exc))
    with server:
        yield server


def _tabs(tmp_path: Path, dataset_root: Path, turn: PrivateTurn, secret_file: Path, grep: str) -> dict[str, Any]:
    """Run the spec ``grep`` against an edge whose pages use ``turn`` only, holding ``secret_file``; its report."""
    local = prepare_network(tmp_path, datasets=dataset_root, network=NETWORK)
    settings = local.edge_settings(
        free_port(), ice_servers=turn.url, turn_secret_file=str(secret_file), ice_relay_only=True
    )
    with BackgroundEdge(settings) as edge, validating(local, edge.url, config=CONFIG):
        result = subprocess.run(
            ["npx", "playwright", "test", "--config", "tests/turn/playwright.config.ts", "--grep", grep],
            cwd=REPO, env=dict(os.environ, DTN_E2E_URL=edge.url), capture_output=True, text=True, timeout=400,
        )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("turn-report "))
    return dict(json.loads(line.removeprefix("turn-report ")))


def _relayed(log: str, peer_id: str) -> int:
    """Bytes coturn relayed to and from the peers of ``peer_id``'s allocations (its ``peer usage`` lines)."""
    usage = re.compile(rf"peer usage: realm=<[^>]*>, username=<\d+:{peer_id}>, rp=\d+, rb=(\d+), sp=\d+, sb=(\d+)")
    return sum(int(rb) + int(sb) for rb, sb in usage.findall(log))


def test_a_head_goes_from_tab_to_tab_through_coturn(
    tmp_path: Path, dataset_root: Path, turn: PrivateTurn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    report = _tabs(tmp_path, dataset_root, turn, turn.secret_file, "through the TURN server")
    assert report["ice"] == [turn.url]
    (fetched,) = [f for f in report["fetched"] if f["peer_id"] == report["holder"]]
    log = turn.read_log()
    for peer in (report["holder"], report["asker"]):  # each tab allocated a relay with its own credential
        assert re.search(rf"new, realm=<dtn\.test>, username=<\d+:{peer}>", log), peer
    # the head's bytes went through coturn's relays (both allocations count them: sent by one, received by
    # the other), as coturn reports once an allocation ends: released by a tab that sent its REFRESH before
    # closing, or expired (PrivateTurn.ALLOCATION_S after the tab's last refresh), so one report suffices
    peers = (report["holder"], report["asker"])
    try:
        until("coturn's usage report", lambda: any(_relayed(turn.read_log(), p) for p in peers), 3 * turn.ALLOCATION_S)
    finally:
        log = turn.read_log()
        print("\n".join(line for line in log.splitlines() if any(p in line for p in peers)))
    assert max(_relayed(log, p) for p in peers) >= fetched["size_bytes"]
    assert turn.secret_file.read_text() not in caplog.text  # the edge never logs it


def test_with_a_wrong_turn_secret_the_tab_falls_back_to_the_edge(
    tmp_path: Path, dataset_root: Path, turn: PrivateTurn
) -> None:
    wrong = tmp_path / "wrong-secret"
    wrong.write_text("not coturn's secret")
    report = _tabs(tmp_path, dataset_root, turn, wrong, "wrong TURN secret")
    log = turn.read_log()
    for peer in (report["holder"], report["asker"]):  # coturn refused each tab's credential: no relay
        assert re.search(rf"check_stun_auth: Cannot find credentials of user <\d+:{peer}>", log), peer
        assert not re.search(rf"new, realm=<dtn\.test>, username=<\d+:{peer}>", log), peer
