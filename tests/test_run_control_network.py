"""Run control on a running network (issue #24 item 3): a real edge, 3 validators with quorum 2 (two of
them running, the third only signs orders, offline) and a native MNIST trainer on two experiments, all
on real time. An order to pause one experiment, signed by two validators and submitted to the edge,
stops that experiment's heads for several windows of the other, which goes on; the trainer stays
alive through it. Rolled back to an earlier head and resumed, the experiment's next head carries that
head's parameters on top of the lineage, and heads advance from it. A pardon releases a quarantined
trainer before the next window is judged."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest

from native_peer import StorageConfig, Validator
from native_peer.edge_client import EdgeClient
from native_peer.identity import NodeIdentity
from native_peer.mnist import mlp_learner
from protocol.codec import decode_tensors
from protocol.errors import SignatureError
from protocol.ids import ExperimentKey
from protocol.messages import HeadDescriptor
from protocol.reasons import Reason
from protocol.run_control import RunControl, SignedRunControl
from protocol.trust import TrustBook
from server.serve import BackgroundEdge
from tools.networks import BASELINE, LOW_LR, mnist_network

from .support import edge_settings, mnist_network_env, mnist_trainer, until

WINDOW_S = 60.0  # generous: two validators judge on shared cores


def _window(edge: BackgroundEdge, key: ExperimentKey) -> int:
    response = httpx.get(f"{edge.url}/v1/experiments/{key}/head", timeout=10)
    return HeadDescriptor.from_wire(response.json()).window if response.status_code == 200 else -1


@pytest.fixture
def running(
    tmp_path: Path, dataset_root: Path
) -> Iterator[tuple[BackgroundEdge, list[NodeIdentity], threading.Thread]]:
    identities = [NodeIdentity.load_or_create(tmp_path / f"validator-{i}" / "identity.key") for i in range(3)]
    preset = mnist_network(identities[0].public_key)
    experiments = tuple(s for s in preset.experiments if s.key in (BASELINE, LOW_LR))
    network = replace(preset, validator_keys=tuple(i.public_key for i in identities), quorum=2, experiments=experiments)
    (tmp_path / "network.json").write_text(json.dumps(network.to_wire()))
    stop = threading.Event()
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge:
        validators = [
            Validator(mlp_learner(), network, StorageConfig(tmp_path / f"validator-{i}"), edge.url, dataset_root)
            for i in (0, 1)
        ]
        trainer = mnist_trainer(network, tmp_path / "trainer", edge.url)
        threads = [threading.Thread(target=v.run, args=(experiments, stop), daemon=True) for v in validators]
        keys = [trainer.experiment(*key.parts) for key in (BASELINE, LOW_LR)]
        threads.append(threading.Thread(target=trainer.run, args=(keys,), kwargs={"stop": stop}, daemon=True))
        for thread in threads:
            thread.start()
        try:
            yield edge, identities, threads[-1]
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
            trainer.close()
            for validator in validators:
                validator.close()


def _order(
    edge: BackgroundEdge, action: str, sequence: int, signers: list[NodeIdentity], target: str | None = None
) -> dict[str, object]:
    now_ms = int(time.time() * 1000)
    order = RunControl("demo", BASELINE, action, sequence=sequence, issued_at_ms=now_ms, target=target)
    client = EdgeClient(edge.url)
    try:
        return client.submit_order(SignedRunControl.of(order, signers))
    finally:
        client.close()


def _head(edge: BackgroundEdge, key: ExperimentKey) -> HeadDescriptor:
    return HeadDescriptor.from_wire(httpx.get(f"{edge.url}/v1/experiments/{key}/head", timeout=10).json())


def _params(edge: BackgroundEdge, head: HeadDescriptor) -> dict[str, np.ndarray]:
    return decode_tensors(httpx.get(f"{edge.url}/v1/artifacts/{head.head_id}", timeout=30).content)[0]


@pytest.mark.slow
def test_a_paused_experiment_makes_no_head_while_the_other_goes_on_then_rolls_back_and_resumes(
    running: tuple[BackgroundEdge, list[NodeIdentity], threading.Thread],
) -> None:
    edge, identities, trainer = running
    until(
        "both experiments past window 1", lambda: min(_window(edge, k) for k in (BASELINE, LOW_LR)) >= 2, 4 * WINDOW_S
    )
    assert _order(edge, "pause", 1, identities[1:])["state"] == {"sequence": 1, "paused": True, "stopped": False}
    time.sleep(2)  # a proposal already on its way may still complete the window it closed
    paused, other = _head(edge, BASELINE), _window(edge, LOW_LR)
    until("three windows of the other experiment", lambda: _window(edge, LOW_LR) >= other + 3, 4 * WINDOW_S)
    assert _head(edge, BASELINE) == paused
    assert trainer.is_alive()
    lineage = [HeadDescriptor.from_wire(h) for h in httpx.get(f"{edge.url}/v1/experiments/{BASELINE}/heads").json()]
    target = next(h for h in lineage if h.window == 1)
    _order(edge, "rollback", 2, identities[:2], target=target.head_id)
    _order(edge, "resume", 3, [identities[0], identities[2]])
    until("a head of the resumed experiment", lambda: _window(edge, BASELINE) > paused.window, 2 * WINDOW_S)
    rolled = next(
        h for h in httpx.get(f"{edge.url}/v1/experiments/{BASELINE}/heads").json() if h["parent"] == paused.head_id
    )
    rolled_back = HeadDescriptor.from_wire(rolled)
    assert rolled_back.window == paused.window + 1 and rolled_back.merged == ()
    for name, value in _params(edge, target).items():  # the parameters of the head rolled back to
        np.testing.assert_array_equal(_params(edge, rolled_back)[name], value)
    assert rolled_back.outer_state == target.outer_state  # and its outer momentum (DiLoCo)
    until("training on from it", lambda: _window(edge, BASELINE) > rolled_back.window, 2 * WINDOW_S)
    assert trainer.is_alive()


@pytest.mark.slow
def test_a_pardon_releases_a_quarantined_peer_before_the_next_window_is_judged(
    tmp_path: Path, dataset_root: Path
) -> None:
    """One validator (quorum 1) with the trainer in quarantine: its candidate is turned down unseen until
    an order pardons it, then judged and accepted in the next window."""
    with mnist_network_env(tmp_path, dataset_root) as (edge, validator, root):
        spec = validator.network.experiment(BASELINE)
        validator.ensure_genesis(spec)
        trainer = mnist_trainer(validator.network, root / "trainer", edge.url)
        experiment = trainer.experiment(*BASELINE.parts)
        peer = str(trainer.peer_id)
        validator.state.trust = replace(TrustBook(), strikes={peer: 5.0}, held=frozenset({peer}))
        trainer.train_window_once(experiment)
        report = validator.poll(spec)
        assert report is not None and [str(v.reason) for v in report.verdicts] == [str(Reason.QUARANTINED)]
        order = RunControl("demo", BASELINE, "pardon", sequence=1, issued_at_ms=int(time.time() * 1000), target=peer)
        signer = NodeIdentity.load_or_create(root / "validator" / "identity.key")
        client = EdgeClient(edge.url)
        client.submit_order(SignedRunControl.of(order, [signer]))
        client.close()
        second = trainer.train_window_once(experiment)
        report = validator.poll(spec)
        assert report is not None and report.head.merged == (second.candidate_id,), [
            str(v.reason) for v in report.verdicts
        ]
        assert not validator.trust.quarantined(peer) and validator.state.control == {str(BASELINE): 1}
        # an edge whose store serves an order out of sequence is not followed (the run loop backs off)
        with closing(sqlite3.connect(root / "edge" / "edge.sqlite3")) as db, db:
            (signed,) = db.execute("SELECT signed FROM run_orders").fetchone()
            db.execute("INSERT INTO run_orders VALUES (?, 0, ?, 0)", (str(BASELINE), signed))
        trainer.train_window_once(experiment)
        with pytest.raises(SignatureError, match=r"run-control orders that do not check: .*already used"):
            validator.poll(spec)
        trainer.close()
