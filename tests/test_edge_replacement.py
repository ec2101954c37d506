"""The network outlives its edge: an edge killed and replaced by one on an empty store (a new key, no
heads) gets the lineage back from its validator, and the running validator and trainer go on with it;
or a second edge that follows the first (``server.follower``, its own store) carries the network on
for a validator and a trainer given both edges, and a contributing page moves to it. Real uvicorn
edges, a real validator and trainer in threads (or processes), real MNIST, a real Chromium."""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from lab.demo import CHROMIUM, CHROMIUM_FLAGS, browser_problem
from lab.stack import PYODIDE_DIR, Fleet, free_port, prepare_network
from native_peer import StorageConfig, Validator
from native_peer.identity import NodeIdentity
from native_peer.mnist import mlp_learner
from native_peer.trainer import Trainer
from protocol.manifests import NetworkManifest
from protocol.messages import Candidate, HeadDescriptor
from protocol.network_pins import NetworkSignature, signed_by
from server.serve import BackgroundEdge
from server.store import Store
from tools.networks import BASELINE, mnist_network

from .support import browsers, edge_settings, missing, mnist_trainer, until
from .test_scale_out import start_edge


def _heads(url: str) -> list[HeadDescriptor]:
    response = httpx.get(f"{url}/v1/experiments/{BASELINE}/heads", timeout=10)
    return [HeadDescriptor.from_wire(h) for h in response.json()] if response.status_code == 200 else []


@contextmanager
def _running(validator: Validator | list[Validator], trainer: Trainer, network: NetworkManifest) -> Iterator[None]:
    """The validators and ``trainer`` run in threads while the block runs; then all stop and close."""
    stop = threading.Event()
    validators = validator if isinstance(validator, list) else [validator]
    runs = [threading.Thread(target=v.run, args=([network.experiment(BASELINE)], stop)) for v in validators]
    runs.append(
        threading.Thread(target=trainer.run, args=([trainer.experiment(*BASELINE.parts)],), kwargs={"stop": stop})
    )
    try:
        for run in runs:
            run.start()
        yield
    finally:
        stop.set()
        for run in runs:
            run.join(timeout=60)
        trainer.close()
        for v in validators:
            v.close()


def _gone(edge: BackgroundEdge, root: Path) -> list[HeadDescriptor]:
    """Kill ``edge`` and delete its store and artifacts (``root``/edge); every head it certified."""
    edge.stop()
    store = Store(root / "edge" / "edge.sqlite3")
    held = store.heads(BASELINE)
    store.close()
    shutil.rmtree(root / "edge")
    return held


@pytest.mark.slow  # a minute of real windows across two edges
def test_an_edge_replaced_on_an_empty_store_continues_the_lineage_and_its_trainer_trains_on(
    tmp_path: Path, dataset_root: Path
) -> None:
    storage = StorageConfig(tmp_path / "validator")
    network = mnist_network(NodeIdentity.load_or_create(storage.identity_path).public_key)
    (tmp_path / "network.json").write_text(json.dumps(network.to_wire()))
    first = BackgroundEdge(edge_settings(tmp_path, dataset_root)).start()
    validator = Validator(mlp_learner(), network, storage, first.url, dataset_root)
    trainer = mnist_trainer(network, tmp_path / "trainer", first.url)
    old_key = trainer.network.edge_key
    second = None
    try:
        with _running(validator, trainer, network):
            until("4 heads on the first edge", lambda: len(_heads(first.url)) >= 4, 120)
            before = _gone(first, tmp_path)  # every head the first edge certified, the last one included
            assert len(before) >= 4
            second = BackgroundEdge(edge_settings(tmp_path, dataset_root, port=first.settings.port)).start()
            until("3 more heads on the second edge", lambda: len(_heads(second.url)) >= len(before) + 3, 120)
    finally:
        first.stop()
    try:
        heads = _heads(second.url)
        new_key = httpx.get(f"{second.url}/v1/network").json()["edge_key"]
        candidates = httpx.get(f"{second.url}/v1/experiments/{BASELINE}/candidates").json()
        signatures = [NetworkSignature.from_wire(s) for s in httpx.get(f"{second.url}/v1/network/signatures").json()]
    finally:
        second.stop()
    assert [h.head_id for h in heads[: len(before)]] == [h.head_id for h in before]  # no head lost
    assert len(heads) >= len(before) + 3, "the network did not go on after the replacement"
    assert [h.window for h in heads] == list(range(len(heads)))  # one genesis, one head a window
    for parent, head in itertools.pairwise(heads):
        assert head.parent == parent.head_id
    for head in heads:
        head.verify_trusted(network.validator_key_set, network.quorum)
    # the trainer went on: heads after the replacement merge its candidates, leased from the new edge
    ours = {c["candidate_id"] for c in candidates if Candidate.from_wire(c).peer_id == trainer.peer_id}
    merged_after = {cid for head in heads[len(before) :] for cid in head.merged}
    assert merged_after & ours, "no candidate of the trainer merged after the replacement"
    assert trainer.network.edge_key != old_key and validator.network.edge_key == trainer.network.edge_key
    assert replace(trainer.network, edge_key=None) == replace(network, edge_key=None)
    assert new_key is not None and validator.network.edge_key is not None
    assert signed_by(network, signatures) == network.validator_key_set  # what pinning peers check, given back


@pytest.mark.slow  # three validators judge every window: two minutes of real windows across two edges
def test_a_two_of_three_network_gets_its_certified_lineage_back_on_an_edge_with_an_empty_store(
    tmp_path: Path, dataset_root: Path
) -> None:
    """Issue #24 with a quorum: the replacement edge takes the lost heads back with their certificates
    from whichever validators hold them, and the network goes on with heads two of three vouch for."""
    storages = [StorageConfig(tmp_path / f"validator-{i}") for i in range(3)]
    keys = tuple(NodeIdentity.load_or_create(s.identity_path).public_key for s in storages)
    network = replace(mnist_network(keys[0]), validator_keys=keys, quorum=2)
    (tmp_path / "network.json").write_text(json.dumps(network.to_wire()))
    first = BackgroundEdge(edge_settings(tmp_path, dataset_root)).start()
    validators = [Validator(mlp_learner(), network, s, first.url, dataset_root) for s in storages]
    trainer = mnist_trainer(network, tmp_path / "trainer", first.url)
    second = None
    try:
        with _running(validators, trainer, network):
            until("3 certified heads on the first edge", lambda: len(_heads(first.url)) >= 3, 180)
            before = _gone(first, tmp_path)
            second = BackgroundEdge(edge_settings(tmp_path, dataset_root, port=first.settings.port)).start()
            until("2 more heads on the second edge", lambda: len(_heads(second.url)) >= len(before) + 2, 180)
    finally:
        first.stop()
    try:
        heads = _heads(second.url)
    finally:
        second.stop()
    assert [h.head_id for h in heads[: len(before)]] == [h.head_id for h in before]  # no head lost
    assert [h.window for h in heads] == list(range(len(heads)))  # one genesis, one head a window
    for parent, head in itertools.pairwise(heads):
        assert head.parent == parent.head_id
    for head in heads:
        head.verify_trusted(network.validator_key_set, network.quorum)  # two of three vouch for each
        assert len(head.signers(network.validator_key_set)) >= 2


def _replaced(edge: BackgroundEdge, root: Path, dataset_root: Path) -> tuple[BackgroundEdge, list[HeadDescriptor]]:
    """Kill ``edge``, delete its store and artifacts, start a fresh one on its port; the heads it held."""
    held = _gone(edge, root)
    return BackgroundEdge(edge_settings(root, dataset_root, port=edge.settings.port)).start(), held


@pytest.mark.slow  # real windows on two edges and a window timeout's wait
def test_a_trainer_whose_delivered_candidate_died_with_the_edge_trains_that_window_again(
    tmp_path: Path, dataset_root: Path
) -> None:
    storage = StorageConfig(tmp_path / "validator")
    network = mnist_network(NodeIdentity.load_or_create(storage.identity_path).public_key)
    network = replace(network, experiments=tuple(replace(s, window_timeout_s=2.0) for s in network.experiments))
    (tmp_path / "network.json").write_text(json.dumps(network.to_wire()))
    spec = network.experiment(BASELINE)
    edge = BackgroundEdge(edge_settings(tmp_path, dataset_root)).start()
    validator = Validator(mlp_learner(), network, storage, edge.url, dataset_root)
    trainer = mnist_trainer(network, tmp_path / "trainer", edge.url)
    experiment = trainer.experiment(*BASELINE.parts)
    stop = threading.Event()
    run = threading.Thread(target=trainer.run, args=([experiment],), kwargs={"max_windows": 1, "stop": stop})
    try:
        validator.ensure_genesis(spec)
        trainer.train_window_once(experiment)
        assert validator.poll(spec) is not None  # head 1
        delivered = trainer.train_window_once(experiment)  # on head 1, taken by the edge, not judged yet
        edge, before = _replaced(edge, tmp_path, dataset_root)
        run.start()  # the trainer counts head 1 as trained: it waits for head 2
        deadline = time.monotonic() + 60
        while (report := validator.poll(spec)) is None and time.monotonic() < deadline:
            time.sleep(0.2)  # the first poll gives the edge its heads back; the window on head 1 is open
        run.join(timeout=30)
    finally:
        stop.set()
        trainer.close()
        validator.close()
        edge.stop()
    assert [h.window for h in before] == [0, 1]
    assert report is not None, "the window whose only candidate died with the edge never closed"
    assert report.head.parent == before[-1].head_id and report.head.window == 2
    assert report.head.merged and delivered.candidate_id not in report.head.merged  # trained again, leased anew
    assert trainer.progress(BASELINE).last_base_head == before[-1].head_id


@pytest.mark.slow  # a minute of real windows across two edges
def test_a_second_edge_following_the_first_carries_the_network_when_the_first_and_its_store_are_gone(
    tmp_path: Path, dataset_root: Path
) -> None:
    storage = StorageConfig(tmp_path / "validator")
    network = mnist_network(NodeIdentity.load_or_create(storage.identity_path).public_key)
    for root in (tmp_path, tmp_path / "second"):
        root.mkdir(exist_ok=True)
        (root / "network.json").write_text(json.dumps(network.to_wire()))
    first = BackgroundEdge(edge_settings(tmp_path, dataset_root)).start()
    second = BackgroundEdge(edge_settings(tmp_path / "second", dataset_root, follow=first.url)).start()
    edges = [first.url, second.url]
    validator = Validator(mlp_learner(), network, storage, edges, dataset_root)
    trainer = mnist_trainer(network, tmp_path / "trainer", edges)
    try:
        with _running(validator, trainer, network):
            # the peers talk to the first edge only
            until("4 heads mirrored by the second edge", lambda: len(_heads(second.url)) >= 4, 120)
            mirrored = _heads(second.url)
            before = _gone(first, tmp_path)  # every head the first edge certified, the last one included
            until("3 more heads on the second edge", lambda: len(_heads(second.url)) >= len(before) + 3, 120)
    finally:
        first.stop()
    try:
        heads = _heads(second.url)
        candidates = httpx.get(f"{second.url}/v1/experiments/{BASELINE}/candidates").json()
    finally:
        second.stop()
    assert len(mirrored) >= 4 and before[: len(mirrored)] == mirrored  # followed, certificates included
    assert [h.head_id for h in heads[: len(before)]] == [h.head_id for h in before]  # no head lost
    assert len(heads) >= len(before) + 3, "the network did not go on through the second edge"
    assert [h.window for h in heads] == list(range(len(heads)))  # one genesis, one head a window
    for parent, head in itertools.pairwise(heads):
        assert head.parent == parent.head_id
        head.verify_trusted(network.validator_key_set, network.quorum)
    ours = {c["candidate_id"] for c in candidates if Candidate.from_wire(c).peer_id == trainer.peer_id}
    assert {cid for head in heads[len(before) :] for cid in head.merged} & ours, "no candidate merged after"
    assert trainer.edge.url == validator.edge.url == second.url


@pytest.mark.slow  # real windows on two edges
def test_a_head_proposed_to_an_edge_that_then_died_is_proposed_again_to_the_next_edge(
    tmp_path: Path, dataset_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The validator's last proposal reached only the first edge (here: never left this validator, as
    when the first edge certified it and died before the second mirrored it). On its move to the
    second edge the validator proposes it again there, instead of waiting for it forever."""
    storage = StorageConfig(tmp_path / "validator")
    network = mnist_network(NodeIdentity.load_or_create(storage.identity_path).public_key)
    for root in (tmp_path, tmp_path / "second"):
        root.mkdir(exist_ok=True)
        (root / "network.json").write_text(json.dumps(network.to_wire()))
    spec = network.experiment(BASELINE)
    first = BackgroundEdge(edge_settings(tmp_path, dataset_root)).start()
    second = BackgroundEdge(edge_settings(tmp_path / "second", dataset_root, follow=first.url)).start()
    validator = Validator(mlp_learner(), network, storage, [first.url, second.url], dataset_root)
    trainer = mnist_trainer(network, tmp_path / "trainer", first.url)
    try:
        genesis = validator.ensure_genesis(spec)
        until("genesis mirrored", lambda: [h.head_id for h in _heads(second.url)] == [genesis.head_id], 60)
        trainer.train_window_once(trainer.experiment(*BASELINE.parts))
        with monkeypatch.context() as patched:
            patched.setattr(type(validator.edge), "publish_head", lambda *_: None)  # lost with the first edge
            report = validator.poll(spec)
        assert report is not None and [h.window for h in _heads(first.url)] == [0]
        first.stop()

        def proposed_there() -> bool:
            validator.poll(spec)  # the first poll moves to the second edge
            return len(_heads(second.url)) == 2

        until("the proposal on the second edge", proposed_there, 30)
        heads = _heads(second.url)
    finally:
        trainer.close()
        validator.close()
        second.stop()
        first.stop()
    assert [h.head_id for h in heads] == [genesis.head_id, report.head.head_id]


def _accepted(url: str) -> set[str]:
    """The candidates the verdicts on the edge at ``url`` accepted."""
    response = httpx.get(f"{url}/v1/experiments/{BASELINE}/verdicts", timeout=10)
    return {v["candidate_id"] for v in response.json() if v["accepted"]} if response.status_code == 200 else set()


@pytest.mark.slow  # Chromium, two edge processes and a validator, real windows
def test_a_contributing_page_moves_to_a_mirror_when_its_edge_dies(tmp_path: Path, dataset_root: Path) -> None:
    """A page contributing on the first edge, whose relay welcome names the second (``--mirrors``), a
    follower on a store of its own: the first edge is killed, and the page moves to the second and
    contributes there, where the validator goes on too."""
    if (problem := browser_problem()) is not None:
        missing(problem)
    local = prepare_network(tmp_path, datasets=dataset_root)
    ports = free_port(), free_port()
    first, second = (f"http://127.0.0.1:{port}" for port in ports)
    with Fleet(tmp_path) as fleet:
        for name, port, settings in (("a", ports[0], {"mirrors": second}), ("b", ports[1], {"follow": first})):
            start_edge(fleet, name, tmp_path, dataset_root, port=port, **{"pyodide-dir": PYODIDE_DIR}, **settings)
        fleet.start("validator", local.validator_argv(f"{first},{second}"))
        fleet.start(
            "chromium",
            [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}",
             f"{first}/?contribute=1&experiment={BASELINE}"],
        )  # fmt: skip
        until("the page's candidate accepted on the first edge", lambda: _accepted(first), 150, fleet=fleet)
        before = _accepted(second)  # mirrored from the first
        killed = fleet.processes["a"]
        killed.kill()  # SIGKILL: its connections just vanish
        assert killed.wait(10) < 0
        fleet.stop("a")
        with httpx.Client(base_url=second, timeout=10) as http:
            until("the page on the second edge's relay", lambda: browsers(http) >= 1, 150, fleet=fleet)
        until("its candidate accepted there", lambda: _accepted(second) - before, 150, fleet=fleet)
