"""Network revisions on a running network (issue #24 item 3): a real edge, validators A and B of a 2-of-3
network (C only signs, offline) and native MNIST trainers, all on real time. Revision 1 adds an
experiment: the running validators start it with a genesis, and a trainer given the network's *first*
manifest follows the revision and trains it. Revision 2, with both experiments paused, replaces B and C
with D: B retires, D (given the first manifest too) follows the chain and takes over at the heads the
revision hands over at, and once resumed by A and D the heads go on certified by A and D while the
first trainer keeps training through both revisions."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from native_peer import StorageConfig, Validator
from native_peer.edge_client import EdgeClient, EdgeRequestError
from native_peer.identity import NodeIdentity
from native_peer.mnist import mlp_learner
from protocol.ids import ExperimentKey
from protocol.manifests import NetworkManifest
from protocol.messages import HeadDescriptor
from protocol.network_revisions import NetworkRevision, SignedNetworkRevision
from protocol.run_control import RunControl, SignedRunControl
from server.serve import BackgroundEdge
from tools.networks import BASELINE, LOW_LR, mnist_network

from .support import edge_settings, mnist_trainer, until

WINDOW_S = 60.0  # generous: validators and trainers share two cores


def _head(edge: BackgroundEdge, key: ExperimentKey) -> HeadDescriptor | None:
    response = httpx.get(f"{edge.url}/v1/experiments/{key}/head", timeout=10)
    return HeadDescriptor.from_wire(response.json()) if response.status_code == 200 else None


def _window(edge: BackgroundEdge, key: ExperimentKey) -> int:
    head = _head(edge, key)
    return -1 if head is None else head.window


def _merged(edge: BackgroundEdge, key: ExperimentKey) -> int:
    """Candidates merged into the heads of ``key`` so far."""
    heads = httpx.get(f"{edge.url}/v1/experiments/{key}/heads", timeout=10).json()
    return sum(len(head["merged"]) for head in heads)


def _submit(edge: BackgroundEdge, signed: SignedNetworkRevision | SignedRunControl) -> None:
    client = EdgeClient(edge.url)
    try:
        if isinstance(signed, SignedNetworkRevision):
            client.submit_revision(signed)
        else:
            client.submit_order(signed)
    finally:
        client.close()


def _served(edge: BackgroundEdge) -> NetworkManifest:
    return NetworkManifest.from_wire(httpx.get(f"{edge.url}/v1/network", timeout=10).json())


@pytest.mark.slow
def test_a_running_network_adds_an_experiment_and_hands_over_to_new_validators(
    tmp_path: Path, dataset_root: Path
) -> None:
    a, b, c, d = (NodeIdentity.load_or_create(tmp_path / f"validator-{i}" / "identity.key") for i in range(4))
    preset = mnist_network(a.public_key)
    baseline, added = (preset.experiment(key) for key in (BASELINE, LOW_LR))
    first = replace(
        preset, validator_keys=(a.public_key, b.public_key, c.public_key), quorum=2, experiments=(baseline,)
    )
    (tmp_path / "network.json").write_text(json.dumps(first.to_wire()))
    stop = threading.Event()
    threads: dict[str, threading.Thread] = {}
    closing: list[object] = []

    def start(name: str, target: object, *args: object, **kwargs: object) -> None:
        threads[name] = threading.Thread(target=target, args=args, kwargs=kwargs, daemon=True)  # type: ignore[arg-type]
        threads[name].start()

    def validator(index: int) -> Validator:
        storage = StorageConfig(tmp_path / f"validator-{index}")
        node = Validator(mlp_learner(), first, storage, edge.url, dataset_root)  # the first manifest, always
        closing.append(node)
        return node

    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge:
        try:
            for index in (0, 1):
                start(f"validator-{index}", validator(index).run, None, stop)
            trainer = mnist_trainer(first, tmp_path / "trainer", edge.url)
            closing.append(trainer)
            start("trainer", trainer.run, [trainer.experiment(*BASELINE.parts)], stop=stop)
            until("the first experiment past window 1", lambda: _window(edge, BASELINE) >= 2, 4 * WINDOW_S)

            # revision 1: a new experiment, signed by A and by C offline
            one = NetworkRevision.of(_served(edge), int(time.time() * 1000), experiments=[added])
            _submit(edge, SignedNetworkRevision.of(one, [a, c]))
            until("the validators' genesis of the new experiment", lambda: _window(edge, LOW_LR) >= 0, 2 * WINDOW_S)
            second = mnist_trainer(first, tmp_path / "trainer-2", edge.url)  # given the first manifest
            closing.append(second)
            start("trainer-2", second.run, [second.experiment(*LOW_LR.parts)], stop=stop)
            until("the new experiment merges work", lambda: _merged(edge, LOW_LR) >= 2, 4 * WINDOW_S)

            # revision 2, both experiments paused: B and C give way to D (quorum 2 of A and D)
            for key in (BASELINE, LOW_LR):
                order = RunControl(first.network_id, key, "pause", sequence=1, issued_at_ms=int(time.time() * 1000))
                _submit(edge, SignedRunControl.of(order, [a, b]))
            for attempt in range(5):
                time.sleep(3)  # a proposal already on its way may still complete the window it closed
                network = _served(edge)
                current = {key: _head(edge, key) for key in (BASELINE, LOW_LR)}
                heads = {key: head for key, head in current.items() if head is not None}
                paused = {key: head.window for key, head in current.items() if head is not None}
                two = NetworkRevision.of(
                    network,
                    int(time.time() * 1000),
                    validator_keys=(a.public_key, d.public_key),
                    heads=heads,
                    orders={BASELINE: 1, LOW_LR: 1},
                )
                try:
                    _submit(edge, SignedNetworkRevision.of(two, [b, c]))
                    break
                except EdgeRequestError as exc:  # one landed after all: write it again, as the edge says
                    if exc.status != 409 or "moved past the revision's handover" not in str(exc) or attempt == 4:
                        raise
            threads["validator-1"].join(timeout=2 * WINDOW_S)
            assert not threads["validator-1"].is_alive(), "B did not retire"
            start("validator-3", validator(3).run, None, stop)  # D, given the first manifest
            for key in (BASELINE, LOW_LR):
                order = RunControl(first.network_id, key, "resume", sequence=2, issued_at_ms=int(time.time() * 1000))
                _submit(edge, SignedRunControl.of(order, [a, d]))
            for key in (BASELINE, LOW_LR):
                until(
                    f"{key} two heads past the handover", lambda k=key: _window(edge, k) >= paused[k] + 2, 4 * WINDOW_S
                )
                head = _head(edge, key)
                assert head is not None
                assert head.signers(frozenset({a.public_key, d.public_key})) == {a.public_key, d.public_key}
            assert threads["trainer"].is_alive() and threads["trainer-2"].is_alive()
            merged = _merged(edge, BASELINE)
            until("the first trainer's work merged after that", lambda: _merged(edge, BASELINE) > merged, 4 * WINDOW_S)
        finally:
            stop.set()
            for thread in threads.values():
                thread.join(timeout=60)
            for node in closing:
                node.close()  # type: ignore[attr-defined]
