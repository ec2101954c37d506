"""Peers behind emulated home links (``lab.links``, issue #25 item 3): the link delays, loses and shapes
what crosses it; a trainer behind it trains and publishes at no more than the link's rate; peers that
vanish mid-window and mid-upload do not hold a window open. Real namespaces, TUN devices, ``tc``, a
real edge and validator, native trainers as processes. Root only (skipped otherwise, saying why)."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from benchmarks import BENCH_EXPERIMENT, bench_network
from lab.links import HOME, HomeLink, LinkProfile, link_unsupported
from lab.stack import Fleet, LocalNetwork, prepare_network, validating
from native_peer.edge_client import EdgeClient
from native_peer.storage import StorageConfig
from server.serve import BackgroundEdge

from .support import until

pytestmark = [
    pytest.mark.slow,  # namespaces, a forwarder process, trainers for tens of seconds
    pytest.mark.skipif(link_unsupported() is not None, reason=link_unsupported() or ""),
]

SHAPED_ONLY = LinkProfile(down_mbit=HOME.down_mbit, up_mbit=HOME.up_mbit, rtt_ms=0.0, loss=0.0)


def test_the_home_link_delays_loses_and_limits_what_crosses_it(tmp_path: Path) -> None:
    sent = 2_000_000
    with HomeLink(HOME, seed=1) as link, socket.socket() as server:
        server.bind((link.host, 0))
        server.listen()
        received: list[int] = []

        def sink() -> None:  # every connection read to its end, then closed
            while True:
                conn, _ = server.accept()
                with conn:
                    while chunk := conn.recv(65536):
                        received.append(len(chunk))

        threading.Thread(target=sink, daemon=True).start()
        probe = (  # inside the namespace: 5 connects (one round trip each), then `sent` bytes up
            "import socket, time\n"
            "rtts = []\n"
            "for _ in range(5):\n"
            "    t = time.perf_counter()\n"
            f"    s = socket.create_connection(('{link.host}', {server.getsockname()[1]}))\n"
            "    rtts.append(time.perf_counter() - t)\n"
            "    if len(rtts) < 5: s.close()\n"
            "t = time.perf_counter()\n"
            f"s.sendall(b'x' * {sent}); s.shutdown(socket.SHUT_WR); s.recv(1)\n"
            "print(min(rtts), time.perf_counter() - t)\n"
        )
        done = subprocess.run(link.argv([sys.executable, "-c", probe]), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        rtt_s, upload_s = map(float, done.stdout.split())
        _, up_bytes = link.counters()
    assert rtt_s >= 0.95 * HOME.rtt_ms / 1000  # loopback: well under a millisecond
    assert HOME.up_mbit is not None
    assert upload_s >= 0.95 * sent * 8 / (HOME.up_mbit * 1e6)  # loopback: a few milliseconds
    assert sum(received) == sent  # TCP delivered every byte over the lossy link
    assert up_bytes >= sent
    up = link.stats["up"]  # counted by the forwarder, which is gone now
    assert 0.003 <= up["lost"] / (up["lost"] + up["forwarded"]) <= 0.03  # ~1 % of ~1,400 packets


def test_a_trainer_behind_a_shaped_link_uploads_no_faster_than_its_rate(tmp_path: Path, dataset_root: Path) -> None:
    """Round trip and loss left out (``SHAPED_ONLY``): only the rate can make the upload take long."""
    local = prepare_network(tmp_path, datasets=dataset_root, network=lambda key: bench_network(key, 4))
    spec = local.network.experiment(BENCH_EXPERIMENT)
    assert spec.codec == "fp32"  # a 0.4 MB candidate: 0.65 s at 5 Mbit/s
    with (
        HomeLink(SHAPED_ONLY) as link,
        BackgroundEdge(local.edge_settings(host=link.host)) as edge,
        validating(local, edge.url, [spec]),
        Fleet(tmp_path) as fleet,
    ):
        trainer = [*local.trainer_argv(edge.url, tmp_path / "trainer"), "--experiment", str(BENCH_EXPERIMENT),
                   "--windows", "1", "--idle-between-windows"]  # fmt: skip
        fleet.start("trainer", link.argv(trainer))
        outcome = until("the trainer's first window", StorageConfig(tmp_path / "trainer").outcomes, 120)[0]
        received_ms = until("its candidate at the edge", lambda: _received_ms(local, outcome), 60)
    upload_s = (received_ms - outcome["at_ms"]) / 1000  # from after it was packaged to stored by the edge
    assert SHAPED_ONLY.up_mbit is not None
    burst = SHAPED_ONLY.up_mbit * 1e6 / 8 / 100  # lab.links' bucket: 10 ms of the rate
    assert upload_s >= 0.95 * (outcome["candidate_bytes"] - burst) * 8 / (SHAPED_ONLY.up_mbit * 1e6)


def _received_ms(local: LocalNetwork, outcome: dict[str, Any]) -> int | None:
    with sqlite3.connect(local.root / "edge" / "edge.sqlite3") as db:
        row = db.execute(
            "SELECT received_at_ms FROM candidates WHERE candidate_id = ?", (outcome["candidate_id"],)
        ).fetchone()
    return int(row[0]) if row else None


def test_a_window_ends_and_the_next_head_comes_when_a_home_peer_vanishes_mid_upload_and_mid_window(
    tmp_path: Path, dataset_root: Path
) -> None:
    """A trainer behind the home link is killed (a closed tab: no goodbye) first while its candidate is on
    the wire (just packaged: 0.4 MB at 5 Mbit/s takes 0.65 s), then, restarted, while it holds a lease of
    the current window; each time the window ends and its next head comes, with a trainer on loopback."""
    local = prepare_network(tmp_path, datasets=dataset_root, network=lambda key: bench_network(key, 4))
    spec = local.network.experiment(BENCH_EXPERIMENT)
    home = tmp_path / "home"
    with (
        HomeLink(HOME) as link,
        BackgroundEdge(local.edge_settings(host=link.host)) as edge,
        validating(local, edge.url, [spec]),
        Fleet(tmp_path) as fleet,
    ):
        client = EdgeClient(edge.url)
        argv = [*local.trainer_argv(edge.url, home), "--experiment", str(BENCH_EXPERIMENT)]
        fleet.start("steady", [*local.trainer_argv(edge.url, tmp_path / "steady"), *argv[-2:]])
        fleet.start("home", link.argv(argv))
        packaged = until("the home trainer's first window", StorageConfig(home).outcomes, 120, poll_s=0.005)[0]
        fleet.processes["home"].kill()
        fleet.stop("home")
        assert _received_ms(local, packaged) is None  # killed mid-upload: its candidate never arrived
        until(
            f"a head after window {packaged['window']}",
            lambda: any(h.window > packaged["window"] for h in client.heads(BENCH_EXPERIMENT)),
            90,
        )

        fleet.start("home", link.argv(argv))  # back, same identity

        def holding() -> int | None:  # the window in which it holds a lease and has published nothing
            head = client.current_head(BENCH_EXPERIMENT)
            leases = client.window_leases(BENCH_EXPERIMENT, head) if head else []
            mine = any(lease.peer_id == packaged["peer_id"] for lease in leases)
            fresh = len(StorageConfig(home).outcomes()) == 1
            return head.window if head and mine and fresh else None

        window = until("a lease of the restarted home trainer", holding, 120, poll_s=0.05)
        fleet.processes["home"].kill()
        fleet.stop("home")
        until(
            f"a head after window {window}",
            lambda: any(h.window > window for h in client.heads(BENCH_EXPERIMENT)),
            90,
        )
        fleet.check_alive()
        client.close()
