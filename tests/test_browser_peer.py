"""The browser peer's Python (the code Pyodide runs) against a real edge and validator, under
CPython through a native bridge: lease-scoped fetches, a signed candidate over the WebSocket,
acceptance into a promoted head, reconnection after the edge restarts, and heads taken from other
peers (checked by content id; a peer that lies is dropped)."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from browser_peer.bridge import HttpAnswer
from browser_peer.costs import Costs
from browser_peer.numpy_trainer import Adam
from browser_peer.parts import PartPace, PartTask, split
from browser_peer.peer import BrowserPeer, PeerConfig
from lab.browser_host import NativeBridge, windows
from lab.stack import LocalNetwork, prepare_network, validating
from native_peer.edge_client import EdgeClient
from native_peer.identity import NodeIdentity
from protocol.clock import ManualClock
from protocol.errors import CodecError
from protocol.evidence import AHEAD_CHAIN
from protocol.model import init_params, mlp
from protocol.run_control import RunControl, SignedRunControl
from protocol.shards import PIXEL_SCALE
from protocol.signing import PureSigner, peer_id_from_public_key
from protocol.uploads import UPLOAD_HEADER
from server.serve import BackgroundEdge
from tools.networks import BASELINE

from .native_bridge import Swarm, SwarmBridge
from .support import edge_settings, experiment_spec, head_envelope, metric, write_network


@contextmanager
def _judged_edge(stack: LocalNetwork, **settings: Any) -> Iterator[BackgroundEdge]:
    """An edge (no Pyodide runtime: the peer runs under CPython) and a validator judging ``BASELINE``."""
    with (
        BackgroundEdge(stack.edge_settings(pyodide_dir=stack.root / "no-pyodide", **settings)) as edge,
        validating(stack, edge.url, [stack.network.experiment(BASELINE)]),
    ):
        yield edge


def _run_to_end(peer: BrowserPeer, bridge: NativeBridge, timeout_s: float = 120.0) -> None:
    """Run ``peer`` until it stops (its ``max_windows``), then close the bridge."""

    async def contribute() -> None:
        await asyncio.wait_for(peer.run(), timeout_s)
        await bridge.aclose()

    asyncio.run(contribute())


@pytest.fixture
def stack(tmp_path: Path, dataset_root: Path) -> Iterator[LocalNetwork]:
    yield prepare_network(tmp_path, datasets=dataset_root)


def test_browser_peer_candidate_is_accepted(stack: LocalNetwork) -> None:
    with _judged_edge(stack) as edge:
        bridge = NativeBridge()
        peer = BrowserPeer(bridge, PeerConfig(edge.url, BASELINE, b"\x42" * 32, max_windows=2))
        _run_to_end(peer, bridge)
    assert peer.status["windows_done"] == 2
    assert peer.status["accepted"] >= 1, peer.status
    shard_urls = [u for u in bridge.fetched if "/shards/" in u]
    assert len(shard_urls) == 8 and all("?lease=lease-" in u for u in shard_urls)
    assert not any("validation" in u or "test" in u for u in bridge.fetched)
    phases = [s["phase"] for s in bridge.statuses]
    assert any(p.startswith("training window") for p in phases) and phases[-1] == "stopped"


def test_a_browser_peer_leases_and_trains_the_next_window_while_its_last_is_judged(stack: LocalNetwork) -> None:
    with _judged_edge(stack) as edge:
        bridge = NativeBridge()
        peer = BrowserPeer(bridge, PeerConfig(edge.url, BASELINE, b"\x47" * 32, max_windows=3))
        _run_to_end(peer, bridge)
        validator = NodeIdentity.load_or_create(stack.validator_storage.identity_path)
        client = EdgeClient(edge.url, reader=validator)  # the open window's candidates too
        mine = [c for c in client.candidates(BASELINE) if c.peer_id == peer.peer_id]
        leases = [client.lease(c.lease_id) for c in mine]
        windows = {h.head_id: h.window for h in client.heads(BASELINE)}
        client.close()
    assert len(mine) == 3 and all(lease is not None for lease in leases)
    ahead = [lease for lease in leases if lease is not None and windows[lease.base_head] == lease.window - 1]
    assert len(ahead) == 2, leases  # after its first window, each lease came before its window's head
    assert all(windows[c.base_head] == lease.window for c, lease in zip(mine, leases, strict=True) if lease)
    assert peer.status["accepted"] >= 2, peer.status


def test_a_browser_peer_trains_a_lease_from_its_head_after_a_chain_of_windows_trained_ahead(
    stack: LocalNetwork,
) -> None:
    """After ``AHEAD_CHAIN`` windows in a row trained ahead from its own last candidate, on a network
    that measures its leases' evidence, the next lease (granted ahead) is trained from its head."""
    with _judged_edge(stack) as edge:
        bridge = NativeBridge()
        peer = BrowserPeer(bridge, PeerConfig(edge.url, BASELINE, b"\x48" * 32, max_windows=AHEAD_CHAIN + 3))
        _run_to_end(peer, bridge, timeout_s=240.0)
        client = EdgeClient(edge.url, reader=NodeIdentity.load_or_create(stack.validator_storage.identity_path))
        heads = client.heads(BASELINE)
        windows = {h.head_id: h.window for h in heads}
        mine = sorted(
            (c for c in client.candidates(BASELINE) if c.peer_id == peer.peer_id), key=lambda c: windows[c.base_head]
        )
        client.close()
    merged = {candidate for head in heads for candidate in head.merged}
    # the rule: a lease asked for ahead trains from its head after AHEAD_CHAIN windows in a row trained
    # ahead (held), or after a candidate that was not merged (refused work is not carried)
    expected, held, chain = [], 0, 0
    for candidate in mine[:-1]:  # each published window, then the lease it asked for ahead
        held += chain >= AHEAD_CHAIN
        expected.append(chain >= AHEAD_CHAIN or candidate.candidate_id not in merged)
        chain = 0 if expected[-1] else chain + 1
    phases = [phase for phase, _ in itertools.groupby(s["phase"] for s in bridge.statuses)]  # each change once
    trained_on_its_head = []  # for each lease granted ahead: whether it trained after its head came
    for i, phase in enumerate(phases):
        if re.fullmatch(r"downloading head \d+", phase):
            rest = phases[i + 1 :]
            published = next(j for j, p in enumerate(rest) if p.startswith("publishing candidate"))
            trained_on_its_head.append(any(p.startswith("training window") for p in rest[:published]))
    assert len(mine) == AHEAD_CHAIN + 3 and trained_on_its_head == expected, (expected, phases)
    assert sum(p.endswith("ahead; training it from its head") for p in phases) == held


def test_browser_peer_reconnects_after_edge_restart(stack: LocalNetwork) -> None:
    bridge = NativeBridge()
    edge = BackgroundEdge(stack.edge_settings(pyodide_dir=stack.root / "no-pyodide")).start()
    settings = edge.settings  # keep the port for the restart
    peer = BrowserPeer(bridge, PeerConfig(edge.url, BASELINE, b"\x43" * 32, max_windows=2, reconnect_max_s=1.0))

    async def scenario() -> None:
        nonlocal edge
        task = asyncio.ensure_future(peer.run())
        while peer.status["windows_done"] < 1:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(edge.stop)
        while peer.status["connected"]:
            await asyncio.sleep(0.05)
        edge = await asyncio.to_thread(lambda: BackgroundEdge(settings).start())
        await asyncio.wait_for(task, 120)
        await bridge.aclose()

    try:
        with validating(stack, edge.url, [stack.network.experiment(BASELINE)]):
            asyncio.run(scenario())
    finally:
        edge.stop()
    assert peer.status["windows_done"] == 2
    assert any(s["phase"].startswith("reconnecting") for s in bridge.statuses)


@pytest.mark.slow  # outlives a real idle timeout, by design
def test_browser_peer_heartbeat_outlives_the_idle_timeout(
    tmp_path: Path, dataset_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import browser_peer.peer

    monkeypatch.setattr(browser_peer.peer, "HEARTBEAT_S", 0.3)
    write_network(tmp_path / "network.json", experiment_spec(BASELINE))
    with BackgroundEdge(edge_settings(tmp_path, dataset_root, idle_timeout_s=1.0)) as edge:
        _, genesis = head_envelope(experiment=BASELINE)
        httpx.post(f"{edge.url}/v1/experiments/{BASELINE}/heads", content=genesis).raise_for_status()
        bridge = NativeBridge()
        peer = BrowserPeer(bridge, PeerConfig(edge.url, BASELINE, b"\x44" * 32))

        async def idle_after_one_window() -> None:
            task = asyncio.ensure_future(peer.run())
            while peer.status["windows_done"] < 1:
                await asyncio.sleep(0.05)
            await asyncio.sleep(3.0)  # no validator: no new head; three idle timeouts pass
            peer.stop()
            await asyncio.wait_for(task, 10)
            await bridge.aclose()

        asyncio.run(idle_after_one_window())
    assert peer.status["windows_done"] == 1
    assert not any(s["phase"].startswith("reconnecting") for s in bridge.statuses)


def test_browser_peer_stops_on_an_unknown_experiment(stack: LocalNetwork) -> None:
    with BackgroundEdge(stack.edge_settings(pyodide_dir=stack.root / "no-pyodide")) as edge:
        bridge = NativeBridge()
        peer = BrowserPeer(bridge, PeerConfig(edge.url, "study/not-run-here/rev-1", b"\x45" * 32))

        async def attempt() -> None:
            await asyncio.wait_for(peer.run(), 30)
            await bridge.aclose()

        asyncio.run(attempt())
    assert any(s["phase"].startswith("error: this network runs no experiment") for s in bridge.statuses)
    assert peer.status["phase"] == "stopped" and peer.status["windows_done"] == 0


def test_a_browser_peer_stopped_by_an_error_it_does_not_reconnect_after_says_so() -> None:
    """An error ``run`` does not reconnect after (those are failed transfers and closed sockets) ends it,
    reported for the page to show and raised: a tab's peer never stops without a word."""

    class Broken(NativeBridge):
        async def connect(self, url: str) -> Any:
            raise AttributeError("'NoneType' object has no attribute 'message'")

    bridge = Broken()
    peer = BrowserPeer(bridge, PeerConfig("http://127.0.0.1:9", BASELINE, b"\x4a" * 32))
    with pytest.raises(AttributeError):
        asyncio.run(peer.run())
    asyncio.run(bridge.aclose())
    assert (
        bridge.statuses[-1]["phase"] == "error: stopped by AttributeError: 'NoneType' object has no attribute 'message'"
    )
    assert bridge.statuses[-1]["connected"] is False and not peer.running


@pytest.mark.slow  # several windows through a real edge: seconds of the fast tier's 3-minute budget
def test_a_paused_browser_peer_leases_nothing_and_trains_once_resumed_at_its_cpu_share(stack: LocalNetwork) -> None:
    with _judged_edge(stack) as edge:
        bridge = NativeBridge()
        peer = BrowserPeer(bridge, PeerConfig(edge.url, BASELINE, b"\x43" * 32, max_windows=1))
        peer.pause("tab hidden")  # the page's word before the peer has even joined
        peer.set_share(0.5)

        async def contribute() -> None:
            task = asyncio.ensure_future(peer.run())
            await asyncio.sleep(3)
            assert peer.status["connected"] and peer.status["paused"] == "tab hidden"
            assert not any("/shards/" in u for u in bridge.fetched) and not task.done()
            leases = httpx.get(f"{edge.url}/v1/experiments/{BASELINE}/leases", params={"base_head": _head(edge.url)})
            assert leases.json() == []  # a paused tab holds no shards
            peer.resume()
            await asyncio.wait_for(task, 120)
            await bridge.aclose()

        asyncio.run(contribute())
    assert peer.status["windows_done"] == 1 and peer.status["cpu_share"] == 0.5
    assert peer.status["downloaded_bytes"] >= 4 * 700_000 and peer.status["sent_bytes"] > 0
    costs = peer.status  # its first window: every byte since the start
    assert (costs["window_downloaded_bytes"], costs["window_sent_bytes"]) == (
        costs["downloaded_bytes"],
        costs["sent_bytes"],
    )
    assert costs["paused_s"] >= 2.5 and costs["training_s"] > 0 and costs["waiting_s"] > 0
    assert costs["training_s"] + costs["paused_s"] + costs["waiting_s"] == pytest.approx(costs["wall_s"])
    phases = [s["phase"] for s in bridge.statuses]
    assert phases.index("resuming") < next(i for i, p in enumerate(phases) if p.startswith("training window"))


@pytest.mark.slow  # a window through a real edge after a pause: seconds of the fast tier's budget
def test_a_browser_peer_waits_through_a_run_control_pause_and_trains_once_resumed(stack: LocalNetwork) -> None:
    """Refused a lease while its experiment is paused (409 ``Halted`` over the relay), the peer asks again
    on the same head: resumed, it trains the window no validator closed meanwhile."""
    validator = NodeIdentity.load_or_create(stack.validator_storage.identity_path)

    def order(action: str, sequence: int) -> None:
        signed = SignedRunControl.of(RunControl(stack.network.network_id, BASELINE, action, sequence, 1), [validator])
        assert httpx.post(f"{edge.url}/v1/experiments/{BASELINE}/control", json=signed.to_wire()).status_code == 201

    with _judged_edge(stack) as edge:
        order("pause", 1)
        bridge = NativeBridge()
        peer = BrowserPeer(bridge, PeerConfig(edge.url, BASELINE, b"\x44" * 32, max_windows=1))

        async def contribute() -> None:
            task = asyncio.ensure_future(peer.run())
            await asyncio.sleep(3)
            assert "paused by run control" in peer.status["phase"] and not task.done()
            assert not any("/shards/" in u for u in bridge.fetched)
            order("resume", 2)
            await asyncio.wait_for(task, 60)
            await bridge.aclose()

        asyncio.run(contribute())
    assert peer.status["windows_done"] == 1


def _head(url: str) -> str:
    return str(httpx.get(f"{url}/v1/experiments/{BASELINE}/head").json()["head_id"])


def test_the_guest_rests_in_proportion_to_its_share_and_waits_while_paused() -> None:
    from browser_peer.guest import YIELD_EVERY_S, Guest

    rests: list[float] = []

    async def sleep(seconds: float) -> None:
        rests.append(seconds)

    async def scenario() -> None:
        guest = Guest(sleep)
        await guest.after_batch(YIELD_EVERY_S / 4)
        guest.set_share(0.5)
        await guest.after_batch(0.2)
        guest.set_share(0.0)  # clamped to MIN_SHARE
        await guest.after_batch(0.1)
        assert rests == pytest.approx([0.2, 0.9])  # at full share no rest, and a yield only every YIELD_EVERY_S
        guest.set_share(1.0)
        for _ in range(3):  # 0.9 of YIELD_EVERY_S since the last rest
            await guest.after_batch(0.3 * YIELD_EVERY_S)
        assert rests == pytest.approx([0.2, 0.9])
        await guest.after_batch(0.3 * YIELD_EVERY_S)
        assert rests == pytest.approx([0.2, 0.9, 0.0])
        guest.pause("on battery")
        waiting = asyncio.ensure_future(guest.after_batch(0.0))
        admitted = asyncio.ensure_future(guest.admit())
        await asyncio.sleep(0.05)
        assert not waiting.done() and not admitted.done()
        guest.resume()
        await asyncio.wait_for(asyncio.gather(waiting, admitted), 1)

    asyncio.run(scenario())


def test_a_reloaded_page_resumes_its_optimizer_and_progress(stack: LocalNetwork) -> None:
    from browser_peer.progress import Progress, storage_key

    spec = stack.network.experiment(BASELINE)
    storage: dict[str, bytes] = {}  # one browser profile's IndexedDB, across two page loads
    with _judged_edge(stack) as edge:
        peers = []
        for done in (1, 2):  # the first load trains one window; the reloaded page goes on to two
            bridge = NativeBridge(storage)
            peer = BrowserPeer(bridge, PeerConfig(edge.url, BASELINE, b"\x44" * 32, max_windows=done))

            async def contribute(peer: BrowserPeer = peer, bridge: NativeBridge = bridge) -> None:
                await asyncio.wait_for(peer.run(), 120)
                await bridge.aclose()

            asyncio.run(contribute())
            peers.append(peer)
    first, second = peers
    assert first.status["windows_done"] == 1 and second.status["windows_done"] == 2
    assert second.status["resumed_steps"] == 62  # one window of 62 Adam steps, carried over
    saved = Progress.decode(storage[storage_key(BASELINE)], BASELINE, spec.model, spec.learning_rate)
    assert saved is not None and saved.optimizer.count == 2 * 62 and saved.windows_done == 2
    assert saved.last_base is not None and saved.residual is not None  # int8 codec: its residual is kept
    # another experiment's (or a damaged) state is never used
    assert Progress.decode(storage[storage_key(BASELINE)], "study/other/rev-1", spec.model, 1e-3) is None
    assert Progress.decode(b"\x00" * 16, BASELINE, spec.model, 1e-3) is None


JSON_BYTES = 16 << 10  # a window's head descriptor and a page load's fetch-manifest (6 KB), with room


def test_a_contributor_downloads_each_byte_once(stack: LocalNetwork) -> None:
    """Issue 25: after a page load's first window a tab downloads per window no more than one head
    delta and the shards it never held (and a little JSON): shards are kept by content across windows
    and page loads, heads come as deltas from the head trained on. Without the shard store a shard
    leased again is downloaded again; without deltas every head comes whole. A head the relay announced
    is taken from its event, not asked of the edge."""
    storage: dict[str, bytes] = {}
    stored: dict[str, bytes] = {}  # one browser profile's IndexedDB, across a reload
    loads = []
    with _judged_edge(stack) as edge:
        for done in (3, 6):  # the reloaded page goes on to six windows
            bridge = NativeBridge(storage, shards=stored)
            peer = BrowserPeer(bridge, PeerConfig(edge.url, BASELINE, b"\x48" * 32, max_windows=done))
            _run_to_end(peer, bridge)
            loads.append((bridge, peer))
    held: set[str] = set()
    head_bytes = next(size for url, size in loads[0][0].received if "/v1/artifacts/" in url)
    for bridge, peer in loads:
        for number, window in enumerate(windows(bridge.received, BASELINE)):
            shards = [(url.split("?")[0], size) for url, size in window if "/shards/" in url]
            deltas = [size for url, size in window if "/delta?from=" in url]
            heads = [size for url, size in window if "/v1/artifacts/" in url]
            assert not {url for url, _ in shards} & held, "a shard held before was downloaded again"
            held |= {url for url, _ in shards}
            if number == 0:  # the page's first head comes whole: it holds none to take a delta from
                continue
            assert not heads and len(deltas) <= 1 and all(size < 0.8 * head_bytes for size in deltas), window
            assert sum(size for _, size in window) <= sum(deltas) + sum(size for _, size in shards) + JSON_BYTES
        assert peer.status["head_delta_bytes"] > 0
        # a head the relay's heads event carried, after the one trained on, is not asked of the edge again
        descriptors = [
            any(url.endswith(f"{BASELINE}/head") for url, _ in w) for w in windows(bridge.received, BASELINE)
        ]
        assert not all(descriptors[1:]), descriptors
    assert sum(peer.status["shard_cache_hits"] for _, peer in loads) > 0  # shards leased again were kept
    assert loads[1][1].status["windows_done"] == 6


STAGE_IDLE_S = 1.0


class _BadNetwork(NativeBridge):
    """A tab on a bad network: its first staged chunk and the second piece of its first head fail as a
    dropped connection does (pyfetch raises ``OSError``); its first publish arrives only once the edge
    has dropped the stage, as one that reaches another edge than the chunks did (theirs went away)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, str]] = []  # (method, Content-Range or Range)
        self.failed: list[tuple[str, str]] = []
        self.published: list[str | None] = []  # each publish's UPLOAD_HEADER

    async def request(self, method: str, url: str, headers: dict[str, str], body: bytes | None = None) -> HttpAnswer:
        sent = (method, headers.get("content-range") or headers.get("range") or "")
        self.requests.append(sent)
        first_chunk = method == "PUT" and not any(m == "PUT" for m, _ in self.failed)
        second_piece = sent[1] == "bytes=100000-199999" and not any(m == "GET" for m, _ in self.failed)
        if first_chunk or second_piece:
            self.failed.append(sent)
            raise OSError(f"{method} {url}: connection reset")
        if method == "POST":
            self.published.append(headers.get(UPLOAD_HEADER))
            if len(self.published) == 1:
                await asyncio.sleep(2 * STAGE_IDLE_S)  # the edge drops the stage meanwhile
        return await super().request(method, url, headers, body)


@pytest.mark.slow  # several windows through a real edge: seconds of the fast tier's 3-minute budget
def test_a_candidate_over_the_frame_limit_is_staged_and_published_over_http_across_broken_transfers(
    stack: LocalNetwork,
) -> None:
    """Heads come in pieces; a candidate over the frame limit is staged, then published by ``POST
    …/candidates`` naming its stage (where a balancer finds the stage's edge), not on the relay; a
    publish that finds no stage stages the candidate again from 0."""
    limits = {"max_frame_bytes": 64 * 1024, "upload_chunk_bytes": 32 * 1024}  # under this model's artifacts
    limits |= {"upload_idle_s": STAGE_IDLE_S}
    with _judged_edge(stack, **limits) as edge:
        bridge = _BadNetwork()
        config = PeerConfig(edge.url, BASELINE, b"\x49" * 32, max_windows=2, piece_bytes=100_000)
        peer = BrowserPeer(bridge, config)
        _run_to_end(peer, bridge)
        verdicts = httpx.get(f"{edge.url}/v1/experiments/{BASELINE}/verdicts", params={"peer_id": peer.peer_id}).json()
        staged = httpx.get(f"{edge.url}/metrics").text
    assert peer.status["windows_done"] == 2 and sum(v["accepted"] for v in verdicts) >= 1, verdicts
    assert [m for m, _ in bridge.failed] == ["GET", "PUT"]
    chunk_ranges = [r for m, r in bridge.requests if m == "PUT"]
    assert chunk_ranges[0] == chunk_ranges[1] == "bytes 0-32767/" + chunk_ranges[0].rsplit("/", 1)[1]  # again
    assert len(chunk_ranges) > 2 * 3  # two candidates of several chunks each
    pieces = [r for m, r in bridge.requests if m == "GET" and r.startswith("bytes=")]
    assert pieces[:3] == ["bytes=0-99999", "bytes=100000-199999", "bytes=100000-199999"]  # the broken piece again
    assert metric(staged, "dtn_staged_upload_bytes") == 0  # each stage gone once published
    # both candidates published over HTTP, each naming its stage; the first twice: the edge held no stage
    # of it the first time (404), so it was staged again from 0 and published again
    first, again, second = bridge.published
    assert first == again != second and all(str(cid).startswith("sha256:") for cid in (first, second))
    assert metric(staged, "dtn_candidates_total", via="http") == 2 and 'via="ws"' not in staged
    assert metric(staged, "dtn_rejected_uploads_total", error="NotFound") == 1
    after = [r for m, r in bridge.requests[[m for m, _ in bridge.requests].index("POST") :] if m == "PUT"]
    assert after[0].startswith("bytes 0-32767/")


def test_a_tab_trains_one_window_on_several_workers_and_signs_one_candidate(stack: LocalNetwork) -> None:
    with _judged_edge(stack) as edge:
        bridge = NativeBridge(part_workers=2)  # three parts: this worker's and two others'
        sent: list[PartTask] = []  # the parts the other workers were given, in order
        train_part = bridge.train_part

        async def recorded(index: int, payload: bytes) -> bytes:
            sent.append(PartTask.decode(payload))
            return await train_part(index, payload)

        bridge.train_part = recorded  # type: ignore[method-assign]
        peer = BrowserPeer(bridge, PeerConfig(edge.url, BASELINE, b"\x45" * 32, max_windows=2))
        _run_to_end(peer, bridge)
        verdicts = httpx.get(f"{edge.url}/v1/experiments/{BASELINE}/verdicts", params={"peer_id": peer.peer_id}).json()
    assert peer.status["windows_done"] == 2 and any(v["accepted"] for v in verdicts), verdicts
    # 4,000 leased examples = 62 batches of 64 a window: the first window in parts of 21, 20 and 21
    # batches, the second split by the rates measured in the first; every part goes from the tab's
    # Adam, on the shards' uint8 examples; the tab goes on with the moments averaged and the most steps
    assert len(sent) == 4 and all(task.x.dtype == np.uint8 and task.scale == PIXEL_SCALE for task in sent)
    helpers = [[len(task.x) // 64 for task in sent[i : i + 2]] for i in (0, 2)]
    assert helpers[0] == [20, 21]
    assert peer._optimizer is not None and peer._optimizer.count == sum(max(62 - sum(h), *h) for h in helpers)


def test_a_window_is_split_over_workers_in_proportion_to_their_measured_rates() -> None:
    x, y = np.zeros((4000, 784), np.uint8), np.zeros(4000, np.int32)
    batches = lambda weights: [len(part) // 64 for part, _ in split(x, y, weights, 64)]  # noqa: E731
    assert batches([1.0, 1.0, 1.0]) == [21, 20, 21] and batches([3.0, 1.0]) == [46, 16]
    assert batches([1.0, 1e-12, 1.0]) == [31, 1, 30]  # every part gets a batch
    assert [len(part) for part, _ in split(x[:100], y[:100], [1.0, 1.0, 1.0], 64)] == [100]  # one batch: one part
    pace = PartPace()
    assert pace.weights(2) == [1.0, 1.0]
    pace.measured([10_000.0, 20_000.0])
    assert pace.weights(2) == [10_000.0, 20_000.0] and pace.weights(3) == [1.0, 1.0, 1.0]
    pace.measured([30_000.0, 20_000.0])  # smoothed: half the newest window
    assert pace.weights(2) == [20_000.0, 20_000.0]
    pace.measured([30_000.0, None])  # a worker failed: equal parts again
    assert pace.weights(2) == [1.0, 1.0]


def test_a_part_task_carries_uint8_examples_and_refuses_others() -> None:
    spec = mlp("mnist-mlp", [784, 16, 10])
    x, y = np.arange(64 * 784, dtype=np.int64).reshape(64, 784) % 256, np.zeros(64, np.int32)
    task = PartTask(spec, 64, (1,), init_params(spec, 0), Adam(1e-3), x.astype(np.uint8), y, PIXEL_SCALE)
    again = PartTask.decode(task.encode())
    assert again.x.dtype == np.uint8 and np.array_equal(again.x, task.x) and again.scale == PIXEL_SCALE
    floats = PartTask(spec, 64, (1,), task.params, task.optimizer, x.astype(np.float32), y, 1.0)  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="uint8"):
        PartTask.decode(floats.encode())


def test_browser_peers_take_the_head_from_a_holder_and_drop_one_that_lies(tmp_path: Path, dataset_root: Path) -> None:
    """B takes the head that A announced from A, checks it and asks the edge for none of it; C gets
    wrong bytes from A, drops A for good and downloads the head from the edge, and still trains."""
    write_network(tmp_path / "network.json", experiment_spec(BASELINE))
    swarm = Swarm()
    seeds = [bytes([seed]) * 32 for seed in (0x46, 0x47, 0x48)]
    ids = [peer_id_from_public_key(PureSigner(seed).public_key) for seed in seeds]
    bridges = [SwarmBridge(swarm, peer_id) for peer_id in ids]
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge:  # no validator: the head stays
        head, genesis = head_envelope(experiment=BASELINE)
        httpx.post(f"{edge.url}/v1/experiments/{BASELINE}/heads", content=genesis).raise_for_status()
        a, b, c = (
            BrowserPeer(bridge, PeerConfig(edge.url, BASELINE, seed))
            for bridge, seed in zip(bridges, seeds, strict=True)
        )

        async def one_window(peer: BrowserPeer) -> asyncio.Future[None]:
            """Start ``peer``; return once it published a window (it stays joined until stopped)."""
            task = asyncio.ensure_future(peer.run())
            while peer.status["windows_done"] < 1:
                await asyncio.sleep(0.05)
            return task

        async def scenario() -> None:
            holder = await one_window(a)  # A holds the head (from the edge) and stays joined
            b_task = await one_window(b)
            b.stop()
            await asyncio.wait_for(b_task, 10)
            swarm.heads.pop(ids[1])  # B's tab is closed
            swarm.liars.add(ids[0])
            c_task = await asyncio.wait_for(one_window(c), 60)
            for peer, task in ((a, holder), (c, c_task)):
                peer.stop()
                await asyncio.wait_for(task, 10)
            for bridge in bridges:
                await bridge.aclose()

        asyncio.run(scenario())
    size = len(swarm.heads[ids[0]][head.head_id])
    artifact = f"/v1/artifacts/{head.head_id}"
    assert a.status["head_edge_bytes"] == size and a.status["head_peer_bytes"] == 0
    assert b.status["head_peer_bytes"] == size and b.status["head_edge_bytes"] == 0
    assert not any(url.endswith(artifact) for url in bridges[1].fetched)
    assert swarm.asked == [(ids[1], ids[0]), (ids[2], ids[0])]
    assert c.status["peers_dropped"] == [ids[0]] and "content id mismatch" in bridges[2].dropped[ids[0]]
    assert c.status["head_edge_bytes"] == size and c.status["head_peer_bytes"] == 0
    assert any(url.endswith(artifact) for url in bridges[2].fetched)
    assert b.status["windows_done"] == c.status["windows_done"] == 1


def test_peers_that_wake_to_a_head_together_download_it_from_the_edge_once(tmp_path: Path, dataset_root: Path) -> None:
    """The first to ask fetches the head from the edge; the other waits for its announcement."""
    write_network(tmp_path / "network.json", experiment_spec(BASELINE))
    swarm = Swarm()
    seeds = [bytes([seed]) * 32 for seed in (0x49, 0x4A)]
    bridges = [SwarmBridge(swarm, peer_id_from_public_key(PureSigner(seed).public_key)) for seed in seeds]
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge:
        head, genesis = head_envelope(experiment=BASELINE)
        httpx.post(f"{edge.url}/v1/experiments/{BASELINE}/heads", content=genesis).raise_for_status()
        peers = [
            BrowserPeer(bridge, PeerConfig(edge.url, BASELINE, seed))
            for bridge, seed in zip(bridges, seeds, strict=True)
        ]

        async def together() -> None:
            tasks = [asyncio.ensure_future(peer.run()) for peer in peers]
            while any(peer.status["windows_done"] < 1 for peer in peers):
                await asyncio.sleep(0.05)
            for peer, task in zip(peers, tasks, strict=True):
                peer.stop()
                await asyncio.wait_for(task, 10)
            for bridge in bridges:
                await bridge.aclose()

        asyncio.run(together())
    size = len(next(iter(swarm.heads.values()))[head.head_id])
    assert sorted(peer.status["head_edge_bytes"] for peer in peers) == [0, size]
    assert sorted(peer.status["head_peer_bytes"] for peer in peers) == [0, size]


def test_costs_split_the_wall_time_and_count_the_bytes_of_each_published_window() -> None:
    costs = Costs(started_s=100.0)
    assert costs.status(100.0)["wall_s"] == 0 and costs.status(99.0)["waiting_s"] == 0  # never below 0
    costs.paused(2.0)
    costs.trained(5.0, 640)
    costs.published(downloaded_bytes=3_000, sent_bytes=400)
    costs.trained(4.0, 1_280)
    costs.published(downloaded_bytes=3_500, sent_bytes=800)
    assert costs.status(112.0) == {
        "wall_s": 12.0,
        "training_s": 9.0,
        "trained_examples": 1_920,
        "paused_s": 2.0,
        "waiting_s": 1.0,
        "window_downloaded_bytes": 500,  # since the window before was published
        "window_sent_bytes": 400,
    }


def test_a_tab_sizes_its_next_lease_by_the_time_it_waited_as_native_trainers_do() -> None:
    """A tab sizes the lease it asks for ahead by ``protocol.lease_size``, from its ``Costs`` since the
    last sizing: all its waiting (it fetches, publishes and waits one thing after another) and none of
    its paused time."""
    clock = ManualClock()
    peer = BrowserPeer(NativeBridge(), PeerConfig("http://127.0.0.1:9", str(BASELINE), b"\x49" * 32), clock=clock)
    spec = experiment_spec(shards_per_lease=4, max_shards_per_lease=20)
    clock.advance(30.0)  # booting, then its first window: not measured
    peer._size_lease(spec, 4)
    assert peer._lease_shards is None  # the experiment's default until a window was measured
    peer.costs.trained(0.1)
    clock.advance(0.4)  # 0.1 s training a lease of 4 shards, 0.3 s waiting for transfers and the head
    peer._size_lease(spec, 4)
    assert peer._lease_shards == 16  # 4 x (0.1 + 0.3) / 0.1
    peer.costs.paused(60.0)
    peer.costs.trained(0.4)
    clock.advance(60.41)  # hidden for a minute, then a lease of 16 that waited for nothing (under 5 %)
    peer._size_lease(spec, 16)
    assert (peer._lease_shards, peer._calm) == (16, 1)
