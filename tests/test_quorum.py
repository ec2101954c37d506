"""k-of-n validator quorum against a real edge: 3 validators, k = 2.

A head is canonical only once two distinct validators vouch for it (its proposer's signature plus
attestations); trainers verify that certificate. One validator down: the others go on. One
Byzantine validator signing a different merge: its head never becomes canonical, and the
disagreement shows in the edge's metrics and in the events viewers watch. One validator key used to
mint credit, erase it and flood proposals: credit and standing follow the quorum, the flood is
refused past the key's budget and the experiment goes on at its pace.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from lab.rogue import Rogue
from native_peer import StorageConfig, Validator, ValidatorConfig
from native_peer.edge_client import EdgeClient, EdgeRequestError
from native_peer.identity import NodeIdentity
from native_peer.mnist import mlp_learner
from native_peer.trainer import Trainer, WindowOutcome
from protocol.clock import ManualClock
from protocol.errors import InvalidMessage, SignatureError
from protocol.judging import WindowDecision
from protocol.manifests import ExperimentSpec, NetworkManifest
from protocol.messages import Attestation, HeadDescriptor
from protocol.network_revisions import NetworkRevision, SignedNetworkRevision
from server.serve import BackgroundEdge
from tools.cli import main as tools_main
from tools.networks import BASELINE, mnist_network

from .support import edge_settings, metric, mnist_trainer

Env = tuple[BackgroundEdge, NetworkManifest, list[Validator], ManualClock, Path]


class EagerValidator(Validator):
    """Proposes as soon as a window closes, whoever's turn it is."""

    def _turn(self, head: HeadDescriptor) -> int:
        return 0


class ByzantineValidator(EagerValidator):
    """Proposes as soon as a window closes, and signs a merge other than the one it judged."""

    def _judge(
        self, spec: ExperimentSpec, head: HeadDescriptor, window: Any, leases: Any = ()
    ) -> tuple[HeadDescriptor, bytes, WindowDecision]:
        _, _, decision = super()._judge(spec, head, window, leases)
        params = self._head_params(head)
        skewed = {name: (value + np.float32(0.05)).astype(np.float32) for name, value in params.items()}
        promoted, artifact = self._sign_head(
            spec, self.learner(spec).from_tensors(skewed), head, decision.accepted, 0, _validation(head)
        )
        return promoted, artifact, decision


def _validation(head: HeadDescriptor) -> dict[str, float]:
    return {"loss": head.metrics["val_loss"], "accuracy": head.metrics["val_accuracy"]}


@pytest.fixture
def quorum_env(tmp_path: Path, dataset_root: Path) -> Iterator[Env]:
    identities = [NodeIdentity.load_or_create(tmp_path / f"validator-{i}" / "identity.key") for i in range(3)]
    preset = mnist_network(identities[0].public_key)
    # FedAvg: these tests are about agreement, where every window must merge its one candidate; a
    # DiLoCo step may be blocked now and then (its momentum restarts), which tests/test_outer.py covers
    fedavg = tuple(replace(spec, outer_optimizer="fedavg", codec="fp32") for spec in preset.experiments)
    network = replace(preset, validator_keys=tuple(i.public_key for i in identities), quorum=2, experiments=fedavg)
    (tmp_path / "network.json").write_text(json.dumps(network.to_wire()))
    clock = ManualClock(wall_ms=int(time.time() * 1000))
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge:
        validators: list[Validator] = []
        yield edge, network, validators, clock, tmp_path
        for validator in validators:
            validator.close()


def _validator(env: Env, index: int, cls: type[Validator] = Validator, *, dataset_root: Path) -> Validator:
    edge, network, validators, clock, root = env
    storage = StorageConfig(root / f"validator-{index}")
    validator = cls(mlp_learner(), network, storage, edge.url, dataset_root, ValidatorConfig(clock=clock))
    validators.append(validator)
    return validator


def _trainer(env: Env, name: str) -> Trainer:
    edge, network, _, _, root = env
    return mnist_trainer(network, root / name, edge.url)


def _current(edge: BackgroundEdge) -> HeadDescriptor | None:
    response = httpx.get(f"{edge.url}/v1/experiments/{BASELINE}/head")
    return HeadDescriptor.from_wire(response.json()) if response.status_code == 200 else None


def _genesis(env: Env, validators: list[Validator]) -> tuple[ExperimentSpec, HeadDescriptor]:
    """The baseline experiment and its genesis head, proposed and attested by ``validators``."""
    spec = env[1].experiment(BASELINE)
    for validator in validators:
        validator.ensure_genesis(spec)
    head = _current(env[0])
    assert head is not None
    return spec, head


def _next_head(env: Env, validators: list[Validator], spec: ExperimentSpec, after: int) -> HeadDescriptor:
    """Poll ``validators`` (advancing their clock) until a head past window ``after`` is canonical."""
    edge, _, _, clock, _ = env
    for _ in range(40):
        for validator in validators:
            validator.poll(spec)
        head = _current(edge)
        if head is not None and head.window > after:
            return head
        clock.advance(5.0)
    raise AssertionError(f"no head after window {after}")


@pytest.mark.slow
def test_a_head_is_canonical_only_with_a_quorum_and_trainers_check_it(quorum_env: Env, dataset_root: Path) -> None:
    edge, network, _, _, _ = quorum_env
    first, second = (
        _validator(quorum_env, 0, dataset_root=dataset_root),
        _validator(quorum_env, 1, dataset_root=dataset_root),
    )
    spec = network.experiment(BASELINE)
    proposed = first.ensure_genesis(spec)
    assert _current(edge) is None  # one validator alone cannot make a head canonical
    assert second.ensure_genesis(spec).head_id == proposed.head_id  # it computed the same genesis and attested
    genesis = _current(edge)
    assert genesis is not None and genesis.head_id == proposed.head_id
    keys = network.validator_key_set
    assert len(genesis.signers(keys)) == 2
    genesis.verify_trusted(keys, 2)
    with pytest.raises(SignatureError):
        genesis.verify_trusted(keys, 3)
    with pytest.raises(SignatureError):
        replace(genesis, certificate=()).verify_trusted(keys, 2)  # the proposer's signature alone
    trainer = _trainer(quorum_env, "trainer")
    outcome = trainer.train_window_once(trainer.experiment(*BASELINE.parts))  # verifies the certificate
    head = _next_head(quorum_env, [first, second], spec, genesis.window)
    assert head.merged == (outcome.candidate_id,) and len(head.signers(keys)) == 2
    trainer.close()


@pytest.mark.slow
def test_with_one_validator_down_the_network_goes_on(quorum_env: Env, dataset_root: Path) -> None:
    _, network, _, _, _ = quorum_env
    alive = [_validator(quorum_env, i, dataset_root=dataset_root) for i in (0, 1)]  # validator 2 never runs
    spec, head = _genesis(quorum_env, alive)
    trainer = _trainer(quorum_env, "trainer")
    dead = network.validator_keys[2]
    skipped_turns = 0
    for _ in range(20):  # until the dead validator's turn to propose first has come (and been taken over)
        first_turn = min(network.validator_keys, key=lambda key: hashlib.sha256(head.head_id.encode() + key).digest())
        outcome = trainer.train_window_once(trainer.experiment(*BASELINE.parts))
        head = _next_head(quorum_env, alive, spec, head.window)
        assert outcome.candidate_id in head.merged
        assert len(head.signers(network.validator_key_set)) == 2
        skipped_turns += first_turn == dead
        if skipped_turns:
            break
    assert skipped_turns == 1
    trainer.close()


@pytest.mark.slow
def test_a_byzantine_validators_head_never_becomes_canonical(quorum_env: Env, dataset_root: Path) -> None:
    edge, network, _, _, _ = quorum_env
    byzantine = _validator(quorum_env, 0, ByzantineValidator, dataset_root=dataset_root)
    honest = [_validator(quorum_env, i, dataset_root=dataset_root) for i in (1, 2)]
    everyone = [byzantine, *honest]
    spec, head = _genesis(quorum_env, everyone)
    trainer = _trainer(quorum_env, "trainer")
    byzantine_heads: set[str] = set()
    for _ in range(2):
        trainer.train_window_once(trainer.experiment(*BASELINE.parts))
        parent = head
        head = _next_head(quorum_env, everyone, spec, head.window)
        rivals = byzantine.edge.proposals(spec.key, parent.head_id)
        byzantine_heads |= {p.head_id for p in rivals if p.validator_key == byzantine.identity.public_key}
        assert head.head_id not in byzantine_heads
        assert byzantine.identity.public_key not in head.signers(network.validator_key_set)
        assert head.validator_key != byzantine.identity.public_key
    assert len(byzantine_heads) == 2  # it did propose, every window
    with httpx.Client(base_url=edge.url) as http:
        assert metric(http, "dtn_quorum_conflicts_total") >= 2
        events = http.get("/portal/snapshot").json()["events"]
    disputes = [e["data"] for e in events if e["topic"] == "quorum" and e["data"]["rivals"]]
    assert disputes and any(set(d["rivals"]) & byzantine_heads or d["head_id"] in byzantine_heads for d in disputes)
    trainer.close()


def _proposed_then_retired(
    env: Env, cls: type[Validator], dataset_root: Path, request: pytest.FixtureRequest
) -> tuple[
    Validator, Validator, ExperimentSpec, HeadDescriptor, EdgeClient, WindowOutcome, HeadDescriptor, list[NodeIdentity]
]:
    """Validator 0 and validator 1 (a ``cls`` that proposes at once) make genesis, a trainer trains a
    window and validator 1 proposes its head; then a revision signed by validators 1 and 2 replaces them
    by validator 3 from genesis on, which no validator follows yet. Returns validators 0 and 1, the
    experiment, genesis, a client of the edge, the trainer's outcome, validator 1's proposal, keys 0–3."""
    edge, _, _, _, root = env
    first = _validator(env, 0, dataset_root=dataset_root)
    leaving = _validator(env, 1, cls, dataset_root=dataset_root)
    spec, genesis = _genesis(env, [first, leaving])
    trainer = _trainer(env, "trainer")
    reader = EdgeClient(edge.url)
    for client in (trainer, reader):
        request.addfinalizer(client.close)
    outcome = trainer.train_window_once(trainer.experiment(*BASELINE.parts))
    leaving.poll(spec)
    [left] = reader.proposals(spec.key, genesis.head_id)
    assert left.validator_key == leaving.identity.public_key
    keys = [NodeIdentity.load_or_create(root / f"validator-{i}" / "identity.key") for i in range(4)]
    change = NetworkRevision.of(
        reader.network(), 1_000, validator_keys=(keys[0].public_key, keys[3].public_key), heads={spec.key: genesis}
    )
    reader.submit_revision(SignedNetworkRevision.of(change, [keys[1], keys[2]]))
    return first, leaving, spec, genesis, reader, outcome, left, keys


@pytest.mark.slow
def test_a_proposal_left_by_a_validator_a_revision_retired_holds_up_nothing(
    quorum_env: Env, dataset_root: Path, request: pytest.FixtureRequest
) -> None:
    """A revision replaces validators while a window was being closed: the proposal a retired validator
    left on the handover head stays listed, never to be certified. The validators of the revised network
    pass it over (a validator that raised on it would stop validating every experiment) and certify the
    window between them."""
    first, leaving, spec, genesis, reader, outcome, left, keys = _proposed_then_retired(
        quorum_env, ByzantineValidator, dataset_root, request
    )
    joining = _validator(quorum_env, 3, dataset_root=dataset_root)  # given the first manifest: follows the chain
    for validator in (first, leaving, joining):
        validator._follow_network()
    assert leaving.retired is not None and first.retired is None and joining.retired is None
    head = _next_head(quorum_env, [first, joining], spec, genesis.window)
    assert head.merged == (outcome.candidate_id,)
    assert head.signers(frozenset(k.public_key for k in keys)) == {keys[0].public_key, keys[3].public_key}
    assert left.head_id in {p.head_id for p in reader.proposals(spec.key, genesis.head_id)}  # still listed


@pytest.mark.slow
def test_a_head_a_retired_validator_proposed_is_taken_over_by_validators_the_revision_lists(
    quorum_env: Env, dataset_root: Path, request: pytest.FixtureRequest
) -> None:
    """A revision retires a validator whose honest proposal waits for an attestation: a validator that
    attests it as the revision lands is told the head can never be certified (409, not a failed round),
    and the validators of the revised network certify that same head as their own proposal."""
    first, leaving, spec, genesis, _, outcome, left, keys = _proposed_then_retired(
        quorum_env, EagerValidator, dataset_root, request
    )
    first.poll(spec)  # not following the revision yet: attests the head, which the edge refuses with the reason
    assert first.state.decisions[left.head_id].attestation is not None and first.state.decisions[left.head_id].published
    with pytest.raises(EdgeRequestError) as refused:
        first.edge.publish_attestation(first.state.decisions[left.head_id].attestation)
    assert refused.value.status == 409 and "can never be certified" in str(refused.value)
    joining = _validator(quorum_env, 3, dataset_root=dataset_root)
    for validator in (first, leaving, joining):
        validator._follow_network()
    assert left.head_id not in first.state.decisions  # its proposer retired: the decision is dropped
    head = _next_head(quorum_env, [first, joining], spec, genesis.window)
    assert head.head_id == left.head_id and head.merged == (outcome.candidate_id,)
    assert head.validator_key in {keys[0].public_key, keys[3].public_key}
    assert head.signers(frozenset(k.public_key for k in keys)) == {keys[0].public_key, keys[3].public_key}


@pytest.mark.slow
def test_one_byzantine_validator_key_can_neither_mint_nor_erase_credit_nor_stall_the_experiment(
    quorum_env: Env, dataset_root: Path, request: pytest.FixtureRequest
) -> None:
    edge, network, _, clock, root = quorum_env
    rogue = NodeIdentity.load_or_create(root / "validator-0" / "identity.key")  # validator 0's key, never run
    honest = [_validator(quorum_env, i, dataset_root=dataset_root) for i in (1, 2)]
    spec, head = _genesis(quorum_env, honest)
    trainer = _trainer(quorum_env, "trainer")
    reader = EdgeClient(edge.url)
    for client in (trainer, reader):  # closed when an assertion fails too: no socket left to a later test
        request.addfinalizer(client.close)
    answers: dict[str, list[httpx.Response]] = {"flood": [], "mint": [], "erase": []}
    waited_on_honest_turns: list[float] = []
    windows = 0
    with closing(Rogue(edge.url, rogue, spec)) as flooding:
        # 4 windows, and more until an honest validator had the first turn in one: the turn follows the
        # head id (a rendezvous hash), which follows the trainer's random key and leases, and is the
        # rogue key's in all of 4 windows once in 81 runs; in 12, once in 531,441
        while windows < 4 or (not waited_on_honest_turns and windows < 12):
            windows += 1
            outcome = trainer.train_window_once(trainer.experiment(*BASELINE.parts))
            for kind, sent in flooding.round(head).items():
                answers[kind] += sent
            first_turn = min(
                network.validator_keys, key=lambda key: hashlib.sha256(head.head_id.encode() + key).digest()
            )
            started_s, parent = clock.monotonic_s(), head
            for validator in (*honest, *honest):  # each proposes or attests, whichever polls first
                validator.poll(spec)
            head = _next_head(quorum_env, honest, spec, head.window)
            assert outcome.candidate_id in head.merged and head.validator_key != rogue.public_key
            if first_turn != rogue.public_key:  # an honest proposer's turn: the flood held up no deadline
                waited_on_honest_turns.append(clock.monotonic_s() - started_s)
            rivals = [p for p in reader.proposals(spec.key, parent.head_id) if p.validator_key == rogue.public_key]
            assert len(rivals) == 2  # its budget of proposals for the window, no more stored
        for validator in honest:  # the last window's verdicts published
            validator.poll(spec)
    # the flood: 2 proposals a window taken, the rest refused with the reason
    statuses = Counter(a.status_code for a in answers["flood"])
    assert statuses == {202: 2 * windows, 429: 2 * windows}
    assert all("proposed its 2 heads" in a.json()["detail"] for a in answers["flood"] if a.status_code == 429)
    assert waited_on_honest_turns and all(waited == 0 for waited in waited_on_honest_turns), waited_on_honest_turns
    # minting: refused; nobody but the trainer on the leaderboard, credited what the honest pair vouched for
    assert {a.status_code for a in answers["mint"]} == {404}
    counted = reader.verdicts(BASELINE)
    vouched = sum(int(v.metrics["examples"]) for v in counted if v.accepted)
    assert vouched > 0  # evidence of work on its leases (decision 0020), from the second window on
    board = reader._request("GET", f"/v1/experiments/{BASELINE}/credit").json()
    assert [(s["peer_id"], s["accepted"], s["rejected"], s["examples"]) for s in board] == [
        (trainer.peer_id, windows, 0, vouched)
    ]
    # erasing: rejections of merged work refused with the reason; those of the open window only held
    erased = Counter(a.status_code for a in answers["erase"])
    assert erased == {409: sum(range(windows)), 202: windows}, (
        erased
    )  # each window: the merged ones so far, and the open one
    assert all("merged" in a.json()["detail"] for a in answers["erase"] if a.status_code == 409)
    assert len(counted) == windows and all(v.validator_key != rogue.public_key for v in counted)


def test_an_attestation_must_name_exactly_the_proposed_head(quorum_env: Env, dataset_root: Path) -> None:
    edge, network, _, _, _ = quorum_env
    first = _validator(quorum_env, 0, dataset_root=dataset_root)
    second = _validator(quorum_env, 1, dataset_root=dataset_root)
    spec = network.experiment(BASELINE)
    proposed = first.ensure_genesis(spec)
    wrong = Attestation.of(replace(proposed, window=7), (), second.identity, 1)
    response = httpx.post(f"{edge.url}/v1/experiments/{BASELINE}/attestations", json=wrong.to_wire())
    assert (response.status_code, response.json()["error"]) == (409, "Conflict")
    outsider = Attestation.of(proposed, (), NodeIdentity.load_or_create(edge.settings.data_dir / "x.key"), 1)
    response = httpx.post(f"{edge.url}/v1/experiments/{BASELINE}/attestations", json=outsider.to_wire())
    assert (response.status_code, response.json()["error"]) == (401, "SignatureError")
    assert _current(edge) is None
    right = Attestation.of(proposed, (), second.identity, 1)
    response = httpx.post(f"{edge.url}/v1/experiments/{BASELINE}/attestations", json=right.to_wire())
    assert response.status_code == 201 and _current(edge) is not None


def test_init_network_writes_a_k_of_n_manifest(tmp_path: Path, dataset_root: Path) -> None:
    storages = [str(tmp_path / f"v{i}") for i in range(3)]
    argv = [arg for path in storages for arg in ("--validator-storage", path)] + ["--datasets", str(dataset_root)]
    tools_main(["init-network", *argv, "--quorum", "2", "--out", str(tmp_path / "network.json")])
    network = NetworkManifest.from_wire(json.loads((tmp_path / "network.json").read_text()))
    assert network.quorum == 2 and len(network.validator_key_set) == 3
    assert network.validator_keys[1] == NodeIdentity.load_or_create(tmp_path / "v1" / "identity.key").public_key
    with pytest.raises(InvalidMessage):
        tools_main(["init-network", *argv, "--quorum", "4", "--out", str(tmp_path / "too-many.json")])
