"""Native trainers and a validator against a real edge: windows, promotion, screening, restart."""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import optax
import pytest

import protocol.evidence
from datasets.layout import read_train_manifest
from native_peer import Project, StorageConfig, Validator, ValidatorConfig, WindowUnavailable
from native_peer.edge_client import Activity, EdgeRequestError
from native_peer.head_follower import FollowedHead
from native_peer.identity import NodeIdentity
from native_peer.learner import SCAN_LENGTHS, TrainEngine
from native_peer.mnist import RELEASE, WORKLOAD, mlp_learner
from native_peer.models import builtin_model
from native_peer.shard_cache import ShardCache
from native_peer.trainer import Trainer, WindowOutcome
from native_peer.validator import Decision
from protocol.batches import make_batches
from protocol.clock import ManualClock
from protocol.codec import decode_tensors
from protocol.errors import SignatureError
from protocol.evidence import AHEAD_CHAIN
from protocol.ids import ContentId
from protocol.manifests import ExperimentSpec, FetchManifest
from protocol.messages import Candidate, HeadDescriptor, Verdict
from protocol.model import init_params
from protocol.reasons import Reason
from protocol.screening import PRESETS
from protocol.shards import decode_shard, decode_shard_stored, feature_scale
from protocol.signing import peer_id_from_public_key
from protocol.updates import decode_update, encode_update
from protocol.window import epoch_seed, package_candidate
from server.serve import BackgroundEdge
from tools.networks import BASELINE, LOW_LR, mnist_network

from .support import candidate_envelope, metric, mnist_network_env, mnist_trainer, until

SPEC = builtin_model("mnist-mlp")


_OPEN: list[Trainer] = []  # made by ``_trainer``: ``network_env`` closes them, passed or failed, before its edge stops


@pytest.fixture
def network_env(tmp_path: Path, dataset_root: Path) -> Iterator[tuple[BackgroundEdge, Validator, Path]]:
    with mnist_network_env(tmp_path, dataset_root) as env:
        try:
            yield env
        finally:
            while _OPEN:
                _OPEN.pop().close()


def _trainer(edge: BackgroundEdge, root: Path, name: str, continuous: bool = False) -> Trainer:
    network = mnist_network(NodeIdentity.load_or_create(root / "validator" / "identity.key").public_key)
    trainer = mnist_trainer(network, root / name, edge.url, continuous=continuous)
    _OPEN.append(trainer)
    return trainer


def test_a_continuous_trainer_leases_and_trains_the_next_window_while_its_last_is_judged(
    network_env: tuple[BackgroundEdge, Validator, Path],
) -> None:
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    validator.ensure_genesis(spec)
    trainer = _trainer(edge, root, "continuous", continuous=True)
    experiment = trainer.experiment(*BASELINE.parts)
    assert not trainer.train_ahead_once(experiment)  # nothing published yet, nothing to go on from
    first = trainer.train_window_once(experiment)
    work = trainer._carry[experiment.key]
    published = work.origin  # what the window published
    computed = trainer.compute_s
    assert trainer.train_ahead_once(experiment)  # while the window is judged: the next window's lease
    assert work.ahead is not None
    ahead = work.ahead.grant.lease
    assert (ahead.window, ahead.base_head) == (first.window + 1, first.base_head_id)  # granted before its head
    assert not trainer.train_ahead_once(experiment)  # its epochs are trained: it waits for that head
    assert trainer.compute_s > computed
    progress = {k: v - published[k] for k, v in trainer.project.learner.to_tensors(work.params).items()}
    assert max(float(np.abs(v).max()) for v in progress.values()) > 0
    report = validator.poll(spec)  # the lease granted ahead is the next window's: this one is complete
    assert report is not None and report.merged
    head_tensors = _head_tensors(trainer, report.head)
    assert report.head.merged == (first.candidate_id,)
    np.testing.assert_array_equal(  # its candidate merged alone: the next window goes on from where it got to
        trainer._reconciled(head_tensors, work, report.head)["dense0.kernel"],
        trainer.project.learner.to_tensors(work.params)["dense0.kernel"],
    )
    second = trainer.train_window_once(experiment)
    assert (second.base_head_id, second.lease_id) == (report.head.head_id, ahead.lease_id)
    assert second.metrics["carried_steps"] == 0  # every step it carried trained its own lease
    assert second.examples == first.examples  # a candidate claims its own lease's examples
    declared = next(c for c in validator.edge.candidates(BASELINE) if c.candidate_id == second.candidate_id)
    assert declared.steps == first.steps  # its optimizer steps, those before the head too
    report = validator.poll(spec)
    assert report is not None and report.head.merged == (second.candidate_id,), [str(v.reason) for v in report.verdicts]
    assert not list((validator.storage.root / "candidates").iterdir())  # decided: their artifacts are deleted
    record = [json.loads(line) for line in trainer.storage.outcomes_path.read_text().splitlines()][-1]
    assert 0 < record["compute_s"] < record["wall_s"]
    waited = record["head_wait_s"] + record["lease_wait_s"]  # what it waited for, apart from its steps
    assert waited >= 0 and record["compute_s"] + waited <= record["wall_s"]
    trainer.close()


def test_a_validator_closes_a_window_without_reading_again_what_it_knows(
    network_env: tuple[BackgroundEdge, Validator, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window that follows the validator's own head reads no head (the candidate listing names the
    current one, the publish answered it canonical), no network (the activity answer carries the edge's
    key), the window's leases in one request, no lease by id (the candidate's is among them) and no
    candidates but the window's (the peers' records were read when the head came out: ``warm``)."""
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    validator.ensure_genesis(spec)
    trainer = _trainer(edge, root, "counted", continuous=True)
    experiment = trainer.experiment(*BASELINE.parts)
    trainer.train_window_once(experiment)
    assert validator.poll(spec) is not None  # the first window: the validator reads the head it starts from
    validator.warm(spec)  # as its loop does once the head is out: the peers' records are read here
    sent: list[tuple[str, str]] = []
    request = validator.edge._request
    monkeypatch.setattr(validator.edge, "_request", lambda m, p, **o: sent.append((m, p)) or request(m, p, **o))
    trainer.train_window_once(experiment)
    report = validator.poll(spec)
    assert report is not None and report.merged, report
    reads = [path.removeprefix(f"/v1/experiments/{BASELINE}") for method, path in sent if method == "GET"]
    assert "/head" not in reads and "/v1/network" not in reads, reads
    assert reads.count("/leases") == 1 and not [r for r in reads if r.startswith("/v1/leases/")], reads
    assert reads.count("/candidates") == 1, reads  # one page: shorter than a full one, so nothing more
    trainer.close()


def test_a_validator_without_its_disk_reads_the_same_records_from_the_lineage(
    network_env: tuple[BackgroundEdge, Validator, Path], tmp_path: Path, dataset_root: Path
) -> None:
    """A peer's record (``protocol.records``) comes from the canonical heads and the candidates they
    merged, as the edge serves them: a validator started on an empty storage (its key only) weighs the
    next window's peers exactly as the one that judged the lineage."""
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    validator.ensure_genesis(spec)
    trainers = [_trainer(edge, root, name) for name in ("regular", "newcomer")]
    experiments = [trainer.experiment(*BASELINE.parts) for trainer in trainers]
    for window in range(3):
        trainers[0].train_window_once(experiments[0])
        if window == 2:
            trainers[1].train_window_once(experiments[1])
        report = validator.poll(spec)
        assert report is not None and report.head.merged
    head = validator._current[spec.key]
    records = validator._records(spec, head)
    assert records == {str(trainers[0].peer_id): 3, str(trainers[1].peer_id): 1}, records
    blank = StorageConfig(tmp_path / "blank")
    blank.root.mkdir(parents=True)
    shutil.copy(root / "validator" / "identity.key", blank.identity_path)
    again = Validator(mlp_learner(), validator.network, blank, edge.url, dataset_root)
    _OPEN.append(again)
    assert again._records(spec, head) == records


def test_a_move_to_another_edge_publishes_again_the_open_decisions_of_every_experiment(
    network_env: tuple[BackgroundEdge, Validator, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client moves to the next edge while one experiment's proposal is being published (its head
    refused there, the outer state it names having gone only to the edge that died): the next poll, of
    whichever experiment, sees the move once and publishes the open decisions of every experiment
    again, not only its own (else that proposal is waited for forever: a flaky CI run of
    ``test_a_contributing_page_moves_to_a_mirror_when_its_edge_dies``)."""
    _, validator, _ = network_env
    specs = [validator.network.experiment(key) for key in (BASELINE, LOW_LR)]
    heads = [validator.ensure_genesis(spec) for spec in specs]
    for head in heads:  # an open proposal of each experiment, published once already
        validator.state.decisions[head.head_id] = Decision(head, True, None, validator.trust, [], published=True)
    published: list[str] = []
    monkeypatch.setattr(validator, "_publish", lambda decision: published.append(str(decision.head.experiment)))
    validator._edge_head(specs[1], None)  # no move: nothing again
    assert published == []
    monkeypatch.setattr(validator.edge, "failovers", validator.edge.failovers + 1)  # the client moved
    validator._edge_head(specs[1], None)  # the other experiment's poll sees it first
    assert sorted(published) == sorted(str(key) for key in (BASELINE, LOW_LR))


def test_a_trainer_whose_window_closed_while_it_trained_publishes_one_head_late_and_is_merged(
    network_env: tuple[BackgroundEdge, Validator, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer slower than the network's windows: its window closes without it (at the deadline, with
    another trainer's candidate) while it trains. It publishes anyway, one head late, and the validator
    judges that candidate in the next window as a delayed update and merges it (before, it started
    over from the new head, and a trainer always one window late never contributed)."""
    edge, fixture_validator, root = network_env
    spec = fixture_validator.network.experiment(BASELINE)
    validator, clock = _validator_with(fixture_validator, edge, fixture_validator.datasets_dir)
    validator.ensure_genesis(spec)
    slow, other = _trainer(edge, root, "slow"), _trainer(edge, root, "other")
    other.train_window_once(other.experiment(*BASELINE.parts))  # a first window: past the untrained genesis,
    assert validator.poll(spec) is not None  # where a lease's evidence is weak whoever trained it
    experiment = slow.experiment(*BASELINE.parts)
    engine = slow._engine(experiment)
    train = engine.train_epoch

    def overtaken(*args: Any) -> Any:  # its window closes, and the next head comes, while it trains
        monkeypatch.setattr(engine, "train_epoch", train)
        other.train_window_once(other.experiment(*BASELINE.parts))
        for _ in range(60):  # past the window's deadline: it closes without the slow trainer's lease
            if validator.poll(spec) is not None:
                break
            clock.advance(5.0)
        until(
            "the next head at the slow trainer", lambda: slow._follower(experiment.key).current().head.window == 2, 10
        )
        return train(*args)

    monkeypatch.setattr(engine, "train_epoch", overtaken)
    try:
        outcome = slow.train_window_once(experiment)  # published, one head late
        assert outcome.window == 1
        report = validator.poll(spec)  # the next window: its candidate, a delayed update
        assert report is not None and outcome.candidate_id in report.head.merged, report
    finally:
        slow.close()
        other.close()
        validator.close()


def test_a_trainer_whose_head_lags_the_edge_trains_its_lease_on_the_head_it_was_granted_on(
    network_env: tuple[BackgroundEdge, Validator, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer behind a slow link follows heads late: the edge grants its lease on a newer head than
    the one it holds. It fetches that head and trains the lease there (before, it refused the lease as
    "the head moved on" and asked again, on a head that had moved on again by then, for ever)."""
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    genesis = validator.ensure_genesis(spec)
    other, lagging = _trainer(edge, root, "other"), _trainer(edge, root, "lagging")
    other.train_window_once(other.experiment(*BASELINE.parts))
    report = validator.poll(spec)
    assert report is not None
    experiment = lagging.experiment(*BASELINE.parts)
    held = FollowedHead(genesis, decode_tensors(lagging.edge.artifact(genesis.head_id, root / "genesis"))[0])
    monkeypatch.setattr(lagging, "_head_to_train", lambda *args, **kwargs: held)  # its follower is a head behind
    try:
        outcome = lagging.train_window_once(experiment)
        assert outcome.base_head_id == report.head.head_id  # trained where the lease was granted
        assert (validator.poll(spec) or report).head.merged == (outcome.candidate_id,)
    finally:
        other.close()
        lagging.close()


def test_a_trainer_waits_for_a_first_head_instead_of_asking_again_at_once(
    network_env: tuple[BackgroundEdge, Validator, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the experiment's genesis a running trainer waits on its head follower between asks (it
    asked for a head 47,485 times in 20 s of a benchmark's start-up, on the core it trains on)."""
    edge, _, root = network_env
    trainer = _trainer(edge, root, "early", continuous=True)
    experiment = trainer.experiment(*BASELINE.parts)
    asked: list[float] = []
    ask = trainer._head_to_train
    monkeypatch.setattr(trainer, "_head_to_train", lambda *a, **k: asked.append(time.monotonic()) or ask(*a, **k))
    stop = threading.Event()
    threading.Timer(1.5, stop.set).start()
    assert trainer.run([experiment], stop=stop, poll_s=0.5) == []
    assert 1 <= len(asked) <= 4, len(asked)  # one ask per poll_s of waiting
    trainer.close()


def test_a_continuous_trainer_restarts_its_chain_of_work_trained_ahead_from_the_head(
    network_env: tuple[BackgroundEdge, Validator, Path],
) -> None:
    """After ``AHEAD_CHAIN`` windows in a row trained ahead from its own last candidate, on a network
    that measures its leases' evidence, the next lease (granted ahead) is trained from its head."""
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    validator.ensure_genesis(spec)
    trainer = _trainer(edge, root, "chain", continuous=True)
    experiment = trainer.experiment(*BASELINE.parts)
    outcomes = [trainer.train_window_once(experiment)]
    trained_ahead = []
    for _ in range(AHEAD_CHAIN + 1):
        epochs = 0
        while trainer.train_ahead_once(experiment):
            epochs += 1
        trained_ahead.append(epochs > 0)
        report = validator.poll(spec)
        assert report is not None and report.head.merged == (outcomes[-1].candidate_id,)
        outcomes.append(trainer.train_window_once(experiment))
    assert trained_ahead == [True] * AHEAD_CHAIN + [False]
    assert [o.steps > 0 for o in outcomes] == [True] + [False] * AHEAD_CHAIN + [True]  # steps after its head
    assert outcomes[-1].lease_id != outcomes[-2].lease_id and "carried_steps" not in outcomes[-1].metrics
    trainer.close()


def test_windows_promote_heads_and_accuracy_rises(network_env: tuple[BackgroundEdge, Validator, Path]) -> None:
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    genesis = validator.ensure_genesis(spec)
    assert [e.head_id for e in validator.evaluate(spec)] == [genesis.head_id]
    trainers = [_trainer(edge, root, f"t{i}") for i in range(2)]
    experiment = trainers[0].experiment(*BASELINE.parts)
    heads = [genesis]
    examples = {str(t.peer_id): 0 for t in trainers}  # credited: work with evidence it trained on its lease
    for window in range(3):
        outcomes = [t.train_window_once(experiment) for t in trainers]
        assert {o.base_head_id for o in outcomes} == {heads[-1].head_id}
        assert not set(outcomes[0].shard_ids) & set(outcomes[1].shard_ids)
        report = validator.poll(spec)
        assert report is not None and report.merged, report
        assert all(v.accepted for v in report.verdicts), [str(v.reason) for v in report.verdicts]
        for trainer, outcome in zip(trainers, outcomes, strict=True):
            [verdict] = [v for v in report.verdicts if v.peer_id == trainer.peer_id]
            evidence = verdict.metrics["lease_evidence_z"] >= PRESETS[spec.screening].credit_lease_evidence_z
            assert evidence or window == 0  # near chance it may be weak; from window 1 on, z is above 5
            examples[str(trainer.peer_id)] += outcome.examples if evidence else 0
        assert report.head.parent == heads[-1].head_id
        assert set(report.head.merged) == {o.candidate_id for o in outcomes}
        # published before it is measured on the test split, which decides nothing: that follows
        assert not any(name.startswith("test_") for name in report.head.metrics)
        assert report.head.head_id not in validator.edge.evaluated(spec.key, validator.network.validator_key_set)
        [evaluation] = validator.evaluate(spec)
        assert evaluation.head_id == report.head.head_id and evaluation.window == window + 1
        heads.append(report.head)
    tests = validator.edge.evaluated(spec.key, validator.network.validator_key_set)
    assert tests.keys() == {h.head_id for h in heads}  # genesis's too, and each one once
    assert tests[heads[-1].head_id]["test_accuracy"] > tests[genesis.head_id]["test_accuracy"] + 0.5
    for trainer in trainers:  # compiled before the first lease (TrainEngine.warm), and nothing since
        engine = trainer._engines[BASELINE]
        assert engine.warmed and engine._epoch._cache_size() == len(SCAN_LENGTHS)
    # credit: tallied by the edge from the verdicts, each signed by the validator
    board = httpx.get(f"{edge.url}/v1/experiments/{BASELINE}/credit").json()
    assert {(s["peer_id"], s["accepted"], s["rejected"], s["examples"]) for s in board} == {
        (peer, 3, 0, count) for peer, count in examples.items()
    }
    assert [s["examples"] for s in board] == sorted(examples.values(), reverse=True)
    for peer in examples:
        signed = [Verdict.from_wire(v) for v in httpx.get(f"{edge.url}/v1/experiments/{BASELINE}/verdicts",
                                                            params={"peer_id": peer}).json()]  # fmt: skip
        for verdict in signed:
            verdict.verify(validator.identity.public_key)  # anyone can recompute the standing
        assert sum(int(v.metrics["examples"]) for v in signed if v.accepted) == examples[peer]
    stranger = httpx.get(f"{edge.url}/v1/experiments/{BASELINE}/credit/ed25519-{'0' * 40}").json()
    assert (stranger["accepted"], stranger["examples"]) == (0, 0)
    assert httpx.get(f"{edge.url}/v1/experiments/{BASELINE}/credit/not-a-key").status_code == 400
    assert trainers[0].train_window_once(experiment).base_head_id == heads[-1].head_id
    with pytest.raises(WindowUnavailable):  # nothing new to train on until the next head
        trainers[0].train_window_once(experiment, wait_s=0.2)
    for trainer in trainers:
        trainer.close()


def _copied_update(rider: Trainer, experiment: Any, validator: Validator, honest: WindowOutcome) -> bytes:
    """A free rider on a real lease of ``honest``'s window: it trains nothing and uploads ``honest``'s
    update (as a colluder or a leak would give it) with every coordinate jittered by 1 %, claiming
    its whole lease, as a trainer of that lease would."""
    grant = rider.edge.request_lease(experiment.key, rider.identity, "native")
    head = rider.edge.current_head(BASELINE)
    assert head is not None and head.head_id == honest.base_head_id == grant.lease.base_head
    base = _head_tensors(rider, head)
    seen = validator.edge.artifact(honest.candidate_id, rider.storage.root / "copied")  # a validator's read
    copied = decode_update(SPEC, base, decode_tensors(seen)[0], experiment.spec.codec)
    jitter = np.random.default_rng(honest.window)
    crafted = {
        k: (base[k] + (copied[k] - base[k]) * (1 + 0.01 * jitter.standard_normal(base[k].shape))).astype(np.float32)
        for k in base
    }
    tensors, _ = encode_update(SPEC, base, crafted, experiment.spec.codec, None)
    _, body = package_candidate(
        grant.lease, head, tensors, rider.identity, peer_kind="native", model=SPEC.name,
        codec=experiment.spec.codec, examples=honest.examples, steps=honest.steps,
        created_at_ms=int(time.time() * 1000), metrics={},
    )  # fmt: skip
    return body


def test_credit_follows_evidence_of_work_not_claims(network_env: tuple[BackgroundEdge, Validator, Path]) -> None:
    """An honest trainer and a free rider that copies its update (jittered), each on its own real lease:
    the validator measures each candidate's lease evidence z on its copy of the training split, and
    the verdicts follow z, never the examples claimed. Of the copy and its original one is judged, the
    one of higher z; the other is ``near_duplicate`` (half a strike, ``protocol.near_duplicates``).
    Near chance (window 0) acceptance asks for no evidence, and z is no guide to which is the original;
    credit always asks for z ≥ 3. Once the head has learned (window 1) the honest update shows its
    work. The rider's z is a draw of about N(0, 1) (lease ids, salts and keys are random here), so the
    test checks that each verdict follows its z and that the rider's z stays below 5 (a draw above it
    has odds of 3 in 10 million); the seeded attack suite asserts that free riders are never credited."""
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    policy = PRESETS[spec.screening]
    validator.ensure_genesis(spec)
    honest, rider = _trainer(edge, root, "honest"), _trainer(edge, root, "rider")
    experiment = honest.experiment(*BASELINE.parts)
    windows = []
    for _ in range(2):
        outcome = honest.train_window_once(experiment)
        rider.edge.publish_candidate(BASELINE, _copied_update(rider, experiment, validator, outcome))
        report = validator.poll(spec)
        assert report is not None
        windows.append({v.peer_id: v for v in report.verdicts})
    honest_id, rider_id = str(honest.peer_id), str(rider.peer_id)
    assert all(set(w) == {honest_id, rider_id} for w in windows)
    assert all(w[rider_id].metrics["lease_evidence_z"] < 5.0 for w in windows)
    strikes = 0.0
    for index, window in enumerate(windows):
        kept, copy = sorted(window.values(), key=lambda v: -v.metrics["lease_evidence_z"])
        # refused as a copy, or once the head has learned, for the evidence first where it lacks it
        refusals = (Reason.NEAR_DUPLICATE,) if index == 0 else (Reason.NEAR_DUPLICATE, Reason.NO_LEASE_EVIDENCE)
        assert copy.reason in refusals and copy.metrics["examples"] == 0
        strikes = validator.state.trust.strike_decay * strikes + (0.5 if copy.peer_id == rider_id else 0.0)
        if index == 0:
            assert kept.accepted  # near chance: acceptance asks for no evidence
        credited = kept.accepted and kept.metrics["lease_evidence_z"] >= policy.credit_lease_evidence_z
        assert (kept.metrics["examples"] > 0) == credited
    work = windows[1][honest_id]
    assert work.metrics["lease_evidence_z"] >= policy.credit_lease_evidence_z
    assert work.accepted and work.metrics["examples"] == outcome.examples > 0  # the original, judged
    assert validator.state.trust.strikes[rider_id] == pytest.approx(strikes) and strikes > 0
    board = {s["peer_id"]: s for s in httpx.get(f"{edge.url}/v1/experiments/{BASELINE}/credit").json()}
    assert board.get(rider_id, {"examples": 0})["examples"] == sum(w[rider_id].metrics["examples"] for w in windows)
    assert board[honest_id]["examples"] >= outcome.examples
    for node in (honest, rider):
        node.close()


def test_a_lease_of_most_of_the_pool_is_judged_without_lease_evidence_and_earns_no_credit(
    network_env: tuple[BackgroundEdge, Validator, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease holding more of the training pool than ``protocol.evidence.MAX_LEASE_SHARE`` (here lowered
    below the network's 4-shard leases) is not measured: once the head has learned, its honest candidate
    is accepted on the other screens, with no ``lease_evidence_z`` and no examples credited."""
    edge, validator, root = network_env
    monkeypatch.setattr(protocol.evidence, "MAX_LEASE_SHARE", 0.05)  # 4 of 37 shards is 0.11 of the pool
    spec = validator.network.experiment(BASELINE)
    validator.ensure_genesis(spec)
    trainer = _trainer(edge, root, "alone")
    experiment = trainer.experiment(*BASELINE.parts)
    verdicts = []
    for _ in range(2):  # window 1: the head has learned, lease evidence applies
        trainer.train_window_once(experiment)
        report = validator.poll(spec)
        assert report is not None
        verdicts += report.verdicts
    for verdict in verdicts:
        assert verdict.accepted and "lease_evidence_z" not in verdict.metrics and verdict.metrics["examples"] == 0
    trainer.close()


def test_restarted_trainer_resumes_identity_cache_and_optimizer(
    network_env: tuple[BackgroundEdge, Validator, Path],
) -> None:
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    validator.ensure_genesis(spec)
    first = _trainer(edge, root, "restart")
    experiment = first.experiment(*BASELINE.parts)
    outcome = first.train_window_once(experiment)
    peer_id = first.peer_id
    first.close()
    validator.poll(spec)
    again = _trainer(edge, root, "restart")
    assert again.peer_id == peer_id
    assert again.progress(BASELINE).windows_done == 1
    second = again.train_window_once(experiment)
    assert second.base_head_id != outcome.base_head_id
    assert again.restored_optimizers == {BASELINE}
    assert (root / "restart/experiments/study__mnist__rev-1/optimizer.safetensors").exists()
    again.close()


def test_a_window_whose_candidate_was_not_published_is_not_counted_and_can_be_trained_again(
    network_env: tuple[BackgroundEdge, Validator, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    edge, validator, root = network_env
    validator.ensure_genesis(validator.network.experiment(BASELINE))
    trainer = _trainer(edge, root, "unpublished")
    experiment = trainer.experiment(*BASELINE.parts)
    publish = trainer.edge.publish_candidate

    def refused(*args: Any) -> None:
        raise EdgeRequestError(503, "unavailable", "the edge is busy")

    monkeypatch.setattr(trainer.edge, "publish_candidate", refused)
    with pytest.raises(EdgeRequestError):
        trainer.train_window_once(experiment)
    assert trainer.progress(BASELINE).windows_done == 0 and not validator.edge.candidates(BASELINE)
    monkeypatch.setattr(trainer.edge, "publish_candidate", publish)
    outcome = trainer.train_window_once(experiment)  # the same head, not "already trained on"
    assert trainer.progress(BASELINE).windows_done == 1
    assert [c.candidate_id for c in validator.edge.candidates(BASELINE)] == [outcome.candidate_id]
    trainer.close()


def test_a_candidate_one_window_late_is_merged_as_a_delayed_update_and_older_ones_are_stale(
    network_env: tuple[BackgroundEdge, Validator, Path], dataset_root: Path, request: pytest.FixtureRequest
) -> None:
    """A trainer that misses its window's deadline by one window still contributes: its update is
    judged in the next window, moved onto that window's head (Streaming DiLoCo's delayed outer
    gradient); two windows late it is ``stale_base``."""
    edge, fixture_validator, root = network_env
    validator, clock = _validator_with(fixture_validator, edge, dataset_root)
    spec = validator.network.experiment(BASELINE)
    validator.ensure_genesis(spec)
    slow, slower, fast = (_trainer(edge, root, name) for name in ("slow", "slower", "fast"))
    for node in (slow, slower, fast, validator):  # closed when a check fails too: no socket left over
        request.addfinalizer(node.close)
    experiment = fast.experiment(*BASELINE.parts)
    # two windows in time first: past the large steps from the initial parameters, where an update one
    # window late, added onto a head that already moved the same way, can overshoot it (and the
    # regression screen rightly refuses it)
    for _ in range(2):
        fast.train_window_once(experiment)
        slow.train_window_once(experiment)  # slow takes part in time: its optimizer has a history
        first = validator.poll(spec)
        assert first is not None and len(first.head.merged) == 2
    fast_outcome = fast.train_window_once(experiment)
    # slow and slower lease in the same window but publish only after the validator has moved on
    late = [_late_update(trainer, experiment, first.head) for trainer in (slow, slower)]
    assert validator.poll(spec) is None  # their leases are live: the window waits (deadline not reached)
    clock.advance(spec.window_timeout_s)  # the deadline is at most window_timeout_s
    report = validator.poll(spec)
    assert report is not None and report.head.merged == (fast_outcome.candidate_id,)
    (delayed, body), (stale, stale_body) = late
    slow.edge.publish_candidate(BASELINE, body)
    following = validator.poll(spec)  # no lease of the next window is out: it closes with the late update
    assert following is not None and following.head.merged == (delayed.candidate_id,), following.verdicts
    slower.edge.publish_candidate(BASELINE, stale_body)
    validator.poll(spec)
    verdicts = {v.candidate_id: v for v in validator.edge.verdicts(BASELINE)}
    assert verdicts[stale.candidate_id].reason is Reason.STALE_BASE and not verdicts[stale.candidate_id].accepted
    assert verdicts[delayed.candidate_id].accepted and verdicts[delayed.candidate_id].head_id == following.head.head_id
    assert verdicts[fast_outcome.candidate_id].head_id == report.head.head_id


def _head_tensors(trainer: Trainer, head: HeadDescriptor) -> dict[str, np.ndarray]:
    """``head``'s tensors, downloaded apart from the trainer's own copies (its head follower writes those)."""
    destination = trainer.storage.root / "test-heads" / head.head_id.removeprefix("sha256:")
    return decode_tensors(trainer.edge.artifact(head.head_id, destination))[0]


def _late_update(trainer: Trainer, experiment: Any, head: HeadDescriptor) -> tuple[Candidate, bytes]:
    """What ``trainer`` trains honestly on a lease of the window on ``head``, with the optimizer state
    it kept (fresh if it never trained), to publish later."""
    grant = trainer.edge.request_lease(experiment.key, trainer.identity, "native")
    x, y = ShardCache.assemble(trainer.shards.prefetch(grant))
    base = _head_tensors(trainer, head)
    xb, yb = trainer._loader(experiment).batches(x, y, epoch_seed(grant.lease, 0))
    params = trainer.project.learner.from_tensors(base)
    params, _, _ = trainer._engine(experiment).train_epoch(params, trainer._optimizer_state(experiment, params), xb, yb)
    trained = trainer.project.learner.to_tensors(params)
    tensors, _ = encode_update(SPEC, base, trained, experiment.spec.codec, None)
    return package_candidate(
        grant.lease,
        head,
        tensors,
        trainer.identity,
        peer_kind="native",
        model=SPEC.name,
        codec=experiment.spec.codec,
        examples=xb.shape[0] * xb.shape[1],
        steps=xb.shape[0],
        created_at_ms=int(time.time() * 1000),
        metrics={},
    )


def test_a_silent_lease_holds_each_experiments_window_only_until_its_deadline(
    network_env: tuple[BackgroundEdge, Validator, Path], dataset_root: Path
) -> None:
    """Two experiments on one validator, a peer with a record (its last candidate was accepted)
    holding a lease in each that never delivers: each window closes at its own adaptive deadline (not
    at the lease TTL)."""
    edge, fixture_validator, root = network_env
    validator, clock = _validator_with(fixture_validator, edge, dataset_root)
    specs = [validator.network.experiment(key) for key in (BASELINE, LOW_LR)]
    worker, squatter = _trainer(edge, root, "worker"), _trainer(edge, root, "squatter")
    for spec in specs:
        validator.ensure_genesis(spec)
        squatter.train_window_once(squatter.experiment(*spec.key.parts))  # honest once: it has a record
        report = validator.poll(spec)
        assert report is not None and report.merged
        validator.state.durations[spec.key] = [1.0, 1.2, 0.8]  # recent windows took about a second
        worker.train_window_once(worker.experiment(*spec.key.parts))
        squatter.edge.request_lease(spec.key, squatter.identity, "native")  # leases, never delivers
    assert [validator.poll(spec) for spec in specs] == [None, None]
    deadline_s = max(3 * 1.0, 5.0)  # 3 x median, at least min_deadline_s: far below window_timeout_s
    clock.advance(deadline_s - 0.5)
    assert [validator.poll(spec) for spec in specs] == [None, None]
    clock.advance(1.0)
    reports = [validator.poll(spec) for spec in specs]
    assert all(report is not None and report.merged for report in reports), reports
    for node in (worker, squatter, validator):
        node.close()


def test_a_lease_of_an_identity_without_a_record_holds_a_window_only_for_the_newcomers_grace(
    network_env: tuple[BackgroundEdge, Validator, Path], dataset_root: Path
) -> None:
    """A squatter taking a fresh identity every window costs each window one median duration, not a
    deadline; the identity that squatted in the window it closed has no record after it either."""
    edge, fixture_validator, root = network_env
    validator, clock = _validator_with(fixture_validator, edge, dataset_root)
    spec = validator.network.experiment(BASELINE)
    validator.ensure_genesis(spec)
    worker = _trainer(edge, root, "worker")
    validator.state.durations[spec.key] = [1.0, 1.2, 0.8]  # grace 1 s, deadline 5 s
    worker.train_window_once(worker.experiment(*spec.key.parts))
    fresh = NodeIdentity.load_or_create(root / "fresh-squatter.key")
    validator.edge.request_lease(BASELINE, fresh, "native")
    assert validator.poll(spec) is None
    clock.advance(0.9)
    assert validator.poll(spec) is None  # within the grace
    clock.advance(0.2)
    report = validator.poll(spec)
    assert report is not None and report.merged  # past the grace, 3.9 s before the deadline
    # the history the grace and the deadline follow is the honest pace (all in at the first poll),
    # not the grace the squatter cost: else a squatter in every window would hold it up for good
    assert validator.state.durations[spec.key][-1] == 0.0
    worker.close()
    validator.close()


def test_a_squatter_from_the_first_window_on_holds_up_only_that_window(
    network_env: tuple[BackgroundEdge, Validator, Path], dataset_root: Path
) -> None:
    """With no history a first window waits for newcomers as long again as it took to hold its first
    candidate (``protocol.deadline.window_grace_s``), not to its deadline, and keeps the honest pace as
    history, so the squatter's next leases hold up the next window only that long."""
    edge, fixture_validator, root = network_env
    validator, clock = _validator_with(fixture_validator, edge, dataset_root)
    spec = validator.network.experiment(BASELINE)
    validator.ensure_genesis(spec)
    worker = _trainer(edge, root, "worker")
    experiment = worker.experiment(*spec.key.parts)
    for window in range(2):
        assert validator.poll(spec) is None  # the window opens as its head is published: nothing leased yet
        clock.advance(2.0)  # the worker's pace: its candidate 2 s into each window
        worker.train_window_once(experiment)
        validator.edge.request_lease(BASELINE, NodeIdentity.load_or_create(root / f"squat-{window}.key"), "native")
        if window == 0:  # no history: a grace of as long again as its first candidate took
            assert validator.poll(spec) is None  # the squatter's lease is out
            clock.advance(1.9)
            assert validator.poll(spec) is None  # within the grace
            clock.advance(0.2)
        report = validator.poll(spec)  # the next window: its grace, the median window, is over already
        assert report is not None and report.merged, window  # the squatter held it up 2 s, not to its deadline
        assert validator.state.durations[spec.key] == [2.0] * (window + 1)
    worker.close()
    validator.close()


def test_a_window_that_rejects_everything_is_followed_by_a_new_attempt(
    network_env: tuple[BackgroundEdge, Validator, Path],
) -> None:
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    genesis = validator.ensure_genesis(spec)
    attacker, honest = _trainer(edge, root, "attacker"), _trainer(edge, root, "honest")
    lease = attacker.edge.request_lease(BASELINE, attacker.identity, "native").lease
    broken = {name: value * np.float32(1000) for name, value in init_params(SPEC, 1).items()}  # far too large
    codec = spec.codec
    junk, body = candidate_envelope(attacker.identity, lease.base_head, lease.lease_id, params=broken, codec=codec)
    attacker.edge.publish_candidate(BASELINE, body)
    report = validator.poll(spec)  # every live lease delivered: the window closes now
    assert report is not None and not report.merged
    [verdict] = report.verdicts
    assert verdict.candidate_id == junk.candidate_id and not verdict.accepted
    assert verdict.reason is Reason.NORM_TOO_LARGE
    retry = report.head  # same parameters under a new head: the next attempt
    assert retry.parent == genesis.head_id and retry.window == 1 and retry.merged == ()
    assert retry.metrics["val_loss"] == genesis.metrics["val_loss"]
    assert edge_head(validator, spec).head_id == retry.head_id
    outcome = honest.train_window_once(honest.experiment(*BASELINE.parts))
    assert outcome.base_head_id == retry.head_id
    recovered = validator.poll(spec)
    assert recovered is not None and recovered.merged and recovered.head.merged == (outcome.candidate_id,)
    for node in (attacker, honest):
        node.close()


def edge_head(validator: Validator, spec: ExperimentSpec) -> HeadDescriptor:
    head = validator.edge.current_head(spec.key)
    assert head is not None
    return head


def _validator_with(validator: Validator, edge: BackgroundEdge, dataset_root: Path) -> tuple[Validator, ManualClock]:
    """``validator`` again, on a manual clock (deadlines pass when a test says so), and that clock."""
    clock = ManualClock(wall_ms=int(time.time() * 1000))
    config = ValidatorConfig(clock=clock)
    return Validator(validator.learners, validator.network, validator.storage, edge.url, dataset_root, config), clock


def test_validator_state_survives_restart(
    network_env: tuple[BackgroundEdge, Validator, Path], dataset_root: Path
) -> None:
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    genesis = validator.ensure_genesis(spec)
    trainer = _trainer(edge, root, "t-restart")
    experiment = trainer.experiment(*BASELINE.parts)
    first = trainer.train_window_once(experiment)
    report = validator.poll(spec)
    assert report is not None and report.merged
    validator.close()
    restarted = Validator(validator.learners, validator.network, validator.storage, edge.url, dataset_root)
    assert restarted.ensure_genesis(spec).head_id == report.head.head_id != genesis.head_id
    assert first.candidate_id in restarted.state.judged
    assert restarted.poll(spec) is None  # nothing new: the judged candidate is not judged again
    second = trainer.train_window_once(experiment)
    again = restarted.poll(spec)
    assert again is not None and again.merged and again.head.parent == report.head.head_id
    assert [v.candidate_id for v in again.verdicts] == [second.candidate_id]
    restarted.close()
    trainer.close()


def test_the_validator_trains_its_own_update_once_per_anchor_and_a_restarted_one_computes_the_same(
    network_env: tuple[BackgroundEdge, Validator, Path], dataset_root: Path
) -> None:
    """Windows between anchors are judged against their base + the anchor head's update: the validator
    trains one update for windows 0-3 (``anchor_every`` 4), and a restarted validator, which has seen
    none of the earlier heads, finds the anchor head at the edge and computes the same bytes."""
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    assert spec.anchor_every == 4
    genesis = validator.ensure_genesis(spec)
    trainer = _trainer(edge, root, "t-anchor")
    experiment = trainer.experiment(*BASELINE.parts)
    heads = [genesis]
    for _ in range(2):
        trainer.train_window_once(experiment)
        report = validator.poll(spec)
        assert report is not None and report.merged
        heads.append(report.head)
    anchor = validator._anchors[spec.key]
    assert anchor.trained == 1  # windows 0 and 1 share the update trained on the genesis head
    params = {h.head_id: validator._head_params(h) for h in heads}
    delta = {k: anchor.prepare(genesis.head_id, lambda: params[genesis.head_id])[k] for k in params[genesis.head_id]}
    reference = validator._reference(spec, heads[2], params[heads[2].head_id])
    for name, value in reference.items():
        expected = (params[heads[2].head_id][name].astype(np.float64) + delta[name]).astype(np.float32)
        np.testing.assert_array_equal(value, expected)
    assert anchor.trained == 1
    restarted = Validator(validator.learners, validator.network, validator.storage, edge.url, dataset_root)
    again = restarted._reference(spec, heads[2], params[heads[2].head_id])
    for name in reference:
        np.testing.assert_array_equal(again[name], reference[name])
    restarted.close()
    trainer.close()


def test_a_trainer_waits_for_the_next_head_when_every_shard_is_leased(
    network_env: tuple[BackgroundEdge, Validator, Path], dataset_root: Path
) -> None:
    edge, fixture_validator, root = network_env
    validator, clock = _validator_with(fixture_validator, edge, dataset_root)
    spec = validator.network.experiment(BASELINE)
    validator.ensure_genesis(spec)
    assert validator.poll(spec) is None  # the window opens as its head is published
    shards = len(json.loads((dataset_root / "mnist" / "train" / "fetch-manifest.json").read_text())["shards"])
    squatters = [_trainer(edge, root, f"squatter-{i}") for i in range(-(-shards // spec.shards_per_lease))]
    for squatter in squatters:
        squatter.edge.request_lease(BASELINE, squatter.identity, "native")
    late = _trainer(edge, root, "late")
    experiment = late.experiment(*BASELINE.parts)
    with pytest.raises(WindowUnavailable):
        late.train_window_once(experiment)
    with pytest.raises(WindowUnavailable):  # it waits for the next head rather than asking again
        late.train_window_once(experiment)
    clock.advance(1.0)
    squatters[0].train_window_once(squatters[0].experiment(*BASELINE.parts))
    # the other squatters' leases keep the first window open for its grace: as long again as its first
    # candidate took (``protocol.deadline.window_grace_s``)
    assert validator.poll(spec) is None
    clock.advance(1.1)
    report = validator.poll(spec)
    assert report is not None and report.merged
    assert late.train_window_once(experiment).base_head_id == report.head.head_id
    for node in (*squatters, late, validator):
        node.close()


def test_a_window_squatted_whole_ends_at_its_deadline_and_the_experiment_goes_on(
    network_env: tuple[BackgroundEdge, Validator, Path], dataset_root: Path
) -> None:
    """Identities that lease every shard and never deliver: the window closes empty at its deadline,
    the next head keeps the parameters under a new id, and the refused trainer trains on it."""
    edge, fixture_validator, root = network_env
    validator, clock = _validator_with(fixture_validator, edge, dataset_root)
    spec = validator.network.experiment(BASELINE)
    genesis = validator.ensure_genesis(spec)
    shards = len(json.loads((dataset_root / "mnist" / "train" / "fetch-manifest.json").read_text())["shards"])
    squatters = [
        NodeIdentity.load_or_create(root / f"squat-{i}.key") for i in range(-(-shards // spec.shards_per_lease))
    ]
    for squatter in squatters:
        lease = validator.edge.request_lease(BASELINE, squatter, "native").lease
        assert lease.expires_at_ms - lease.issued_at_ms <= spec.window_timeout_s * 1000  # it lives one window
    honest = _trainer(edge, root, "honest")
    experiment = honest.experiment(*BASELINE.parts)
    with pytest.raises(EdgeRequestError) as refused:
        honest.edge.request_lease(BASELINE, honest.identity, "native")
    retry_after_s = refused.value.retry_after_s
    assert refused.value.status == 409 and retry_after_s is not None and 0 < retry_after_s <= spec.window_timeout_s
    with pytest.raises(WindowUnavailable):
        honest.train_window_once(experiment)
    assert validator.poll(spec) is None
    clock.advance(spec.window_timeout_s - 1)
    assert validator.poll(spec) is None  # before its deadline, the squatters' leases hold it open
    clock.advance(1)
    report = validator.poll(spec)
    assert report is not None and not report.merged and report.verdicts == ()
    assert (report.head.parent, report.head.window, report.head.merged) == (genesis.head_id, 1, ())
    assert report.head.metrics["val_loss"] == genesis.metrics["val_loss"]
    outcome = honest.train_window_once(experiment)
    assert outcome.base_head_id == report.head.head_id
    following = validator.poll(spec)
    assert following is not None and following.head.merged == (outcome.candidate_id,)
    for node in (honest, validator):
        node.close()


def test_a_window_nobody_leased_waits_for_its_first_trainer(
    network_env: tuple[BackgroundEdge, Validator, Path], dataset_root: Path
) -> None:
    edge, fixture_validator, _ = network_env
    validator, clock = _validator_with(fixture_validator, edge, dataset_root)
    spec = validator.network.experiment(BASELINE)
    genesis = validator.ensure_genesis(spec)
    validator.poll(spec)
    clock.advance(10 * spec.window_timeout_s)
    assert validator.poll(spec) is None  # no trainer anywhere: no empty heads minted
    assert edge_head(validator, spec).head_id == genesis.head_id
    squatter = NodeIdentity.load_or_create(validator.storage.root / "squatter.key")
    validator.edge.request_lease(BASELINE, squatter, "native")
    assert validator.poll(spec) is None  # the deadline counts from the first lease, not from the head
    clock.advance(spec.window_timeout_s)
    report = validator.poll(spec)
    assert report is not None and report.head.merged == ()  # then it ends, empty
    validator.close()


def test_a_trainer_with_a_sharded_dataset_reads_only_its_leased_shards_from_disk(
    network_env: tuple[BackgroundEdge, Validator, Path], dataset_root: Path
) -> None:
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    validator.ensure_genesis(spec)
    broken = root / "other-copy"
    for number, entry in enumerate(read_train_manifest(dataset_root / "mnist").shards):
        if number % 2:  # every other shard differs from the manifest's, the rest are missing
            (broken / "mnist/train" / entry.locator).parent.mkdir(parents=True, exist_ok=True)
            (broken / "mnist/train" / entry.locator).write_bytes(b"not this shard")

    def trainer(name: str, datasets: Path) -> Trainer:
        builder = Project(mlp_learner()).trainer(RELEASE, WORKLOAD).with_network(validator.network)
        storage = StorageConfig(root / name)
        return builder.with_storage(storage).with_bootstrap_peer(edge.url).with_sharded_dataset(datasets).spawn()

    local, fallback = trainer("local", dataset_root), trainer("fallback", broken)
    try:
        outcome = local.train_window_once(local.experiment(*BASELINE.parts))
        assert local.shards.local_reads == len(outcome.shard_ids) == spec.shards_per_lease  # only the leased ones
        assert local.shards.downloads == 0 and not (root / "local/shards").exists()  # read where they lie
        outcome = fallback.train_window_once(fallback.experiment(*BASELINE.parts))
        assert fallback.shards.local_reads == 0 and fallback.shards.downloads == len(outcome.shard_ids)
    finally:
        local.close()
        fallback.close()


def _served(edge: BackgroundEdge) -> dict[str, float]:
    """The edge's counters of bytes served: shards, whole heads and head deltas."""
    names = ("dtn_shard_bytes_total", "dtn_head_bytes_total", "dtn_head_delta_bytes_total")
    text = httpx.get(f"{edge.url}/metrics").text
    return {name: metric(text, name) for name in names}


def test_a_native_trainer_downloads_each_byte_once(network_env: tuple[BackgroundEdge, Validator, Path]) -> None:
    """Issue 25, counted at the edge: over five windows a trainer downloads each shard it leased once
    and one whole head (the first); every later head comes as a delta from the head it trained on."""
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    genesis = validator.ensure_genesis(spec)
    manifest = validator.edge.fetch_manifest(spec.dataset_id)
    trainer = _trainer(edge, root, "once")
    experiment = trainer.experiment(*BASELINE.parts)
    leased: list[str] = []
    try:
        for _ in range(5):
            leased += trainer.train_window_once(experiment).shard_ids
            report = validator.poll(spec)
            assert report is not None
            assert report.merged, [(str(v.reason), v.detail) for v in report.verdicts]
        leased += trainer.train_window_once(experiment).shard_ids  # on the last head
    finally:
        trainer.close()
    served = _served(edge)
    head_bytes = len(validator.edge.artifact(genesis.head_id, root / "genesis.safetensors"))
    assert served["dtn_shard_bytes_total"] == sum(manifest.shard(s).size_bytes for s in set(leased))
    assert served["dtn_head_bytes_total"] == head_bytes  # the trainer's first head
    assert 0 < served["dtn_head_delta_bytes_total"] < 5 * 0.8 * head_bytes  # five heads, each a delta


def test_a_shard_leased_again_is_served_decoded_from_memory(
    network_env: tuple[BackgroundEdge, Validator, Path],
) -> None:
    edge, validator, root = network_env
    validator.ensure_genesis(validator.network.experiment(BASELINE))
    trainer = _trainer(edge, root, "memory")
    grant = trainer.edge.request_lease(BASELINE, trainer.identity, "native")
    shards = len(grant.lease.shard_ids)
    first = ShardCache.assemble(trainer.shards.prefetch(grant))
    assert (trainer.shards.downloads, trainer.shards.memory_hits) == (shards, 0)
    assert (first[0].dtype, first[1].dtype) == (np.uint8, np.uint8)  # kept as stored: the step scales them
    again = ShardCache.assemble(trainer.shards.prefetch(grant))  # no read, no hash, no decode
    assert (trainer.shards.downloads, trainer.shards.hits, trainer.shards.memory_hits) == (shards, 0, shards)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    tight = ShardCache(trainer.edge, trainer.storage, trainer._pool, memory_bytes=1)  # no room for one shard
    for _ in range(2):
        ShardCache.assemble(tight.prefetch(grant))
    assert (tight.memory_hits, tight.hits) == (0, 2 * shards)  # each use read and verified from disk
    trainer.close()


def test_the_shard_files_kept_on_disk_stay_within_their_cap_and_a_later_process_reads_them(
    network_env: tuple[BackgroundEdge, Validator, Path],
) -> None:
    edge, validator, root = network_env
    validator.ensure_genesis(validator.network.experiment(BASELINE))
    trainer = _trainer(edge, root, "disk")
    try:
        grant = trainer.edge.request_lease(BASELINE, trainer.identity, "native")
        manifest = trainer.edge.fetch_manifest(grant.lease.dataset_id)
        sizes = sorted(manifest.shard(s).size_bytes for s in grant.lease.shard_ids)
        cap = sizes[-1] + sizes[-2]  # room for two of the lease's shards, not for all of them
        assert len(sizes) > 2 and sum(sizes) > cap

        def on_disk() -> list[int]:
            return [p.stat().st_size for p in trainer.storage.shards_dir.glob("*.safetensors")]

        first = ShardCache(trainer.edge, trainer.storage, trainer._pool, memory_bytes=1, disk_bytes=cap)
        x, _ = ShardCache.assemble(first.prefetch(grant))
        kept = len(on_disk())
        assert first.downloads == len(sizes) and 0 < kept < len(sizes) and sum(on_disk()) <= cap
        # a later process with room for the whole lease (under the first cap its own downloads would evict
        # kept files that its other threads had not read yet, in whatever order the threads ran)
        later = ShardCache(trainer.edge, trainer.storage, trainer._pool, memory_bytes=1, disk_bytes=sum(sizes))
        again, _ = ShardCache.assemble(later.prefetch(grant))
        assert (later.hits, later.downloads) == (kept, len(sizes) - kept)  # the kept files, verified; the rest fetched
        assert sum(on_disk()) <= sum(sizes)
        np.testing.assert_array_equal(x, again)
    finally:
        trainer.close()  # its sockets, whatever happened


def test_training_on_stored_uint8_examples_equals_training_on_their_float32_reading(
    dataset_root: Path, train_manifest: FetchManifest
) -> None:
    data = (dataset_root / "mnist/train" / train_manifest.shards[0].locator).read_bytes()
    stored_x, stored_y, kind = decode_shard_stored(data, "pixels")
    x, y = decode_shard(data, "pixels")
    # 8 batches of 64: one compiled scan of 8 steps per engine
    (stored_x, stored_y, x, y) = (stored_x[:512], stored_y[:512], x[:512], y[:512])
    learner = mlp_learner()
    params = learner.from_tensors(init_params(SPEC, 0))
    runs = []
    for engine, (xs, ys) in (
        (TrainEngine(learner, optax.adam(1e-3)), (x, y)),
        (TrainEngine(learner, optax.adam(1e-3), feature_scale=feature_scale(kind)), (stored_x, stored_y)),
    ):
        xb, yb = make_batches(xs, ys, 64, 7)
        trained, _, loss = engine.train_epoch(params, engine.init_optimizer(params), xb, yb)
        runs.append((learner.to_tensors(trained), loss))
    (float_tensors, float_loss), (stored_tensors, stored_loss) = runs
    assert stored_loss == float_loss
    for name, value in float_tensors.items():
        np.testing.assert_array_equal(stored_tensors[name], value)
    assert not np.array_equal(float_tensors["dense0.kernel"], learner.to_tensors(params)["dense0.kernel"])
    unscaled = TrainEngine(learner, optax.adam(1e-3))  # the scale is what makes them equal
    _, _, wrong = unscaled.train_epoch(
        params, unscaled.init_optimizer(params), *make_batches(stored_x, stored_y, 64, 7)
    )
    assert wrong != float_loss


def test_the_edge_wakes_a_waiting_validator_when_a_candidate_arrives(
    network_env: tuple[BackgroundEdge, Validator, Path],
) -> None:
    """No poll sleep on the trainers' critical path: a validator waiting on the edge's activity (up to
    ``idle_s``, far longer than the test allows) closes the window as soon as its lease delivered."""
    edge, fixture_validator, root = network_env
    spec = fixture_validator.network.experiment(BASELINE)
    genesis = fixture_validator.ensure_genesis(spec)
    validator = Validator(
        fixture_validator.learners,
        fixture_validator.network,
        fixture_validator.storage,
        edge.url,
        fixture_validator.datasets_dir,
        ValidatorConfig(idle_s=4.0),
    )
    token = validator.edge.activity(None, 0.0)
    assert token.edge_key == validator.network.edge_key  # the edge says which key it signs with
    started = time.monotonic()
    assert validator.edge.activity(token.since, 0.3) == token  # nothing happened: it waited out its time
    assert time.monotonic() - started >= 0.3
    stop = threading.Event()
    thread = threading.Thread(target=validator.run, args=([spec], stop), daemon=True)
    thread.start()
    trainer = _trainer(edge, root, "pushed")
    try:
        time.sleep(0.5)  # the validator has polled once and waits on the edge
        outcome = trainer.train_window_once(trainer.experiment(*BASELINE.parts))
        published = time.monotonic()
        head = trainer.edge.current_head(BASELINE, after=genesis.head_id, wait_s=3.5)
        assert head is not None and head.merged == (outcome.candidate_id,)
        assert time.monotonic() - published < 2.0  # woken by the candidate, not by idle_s
    finally:
        stop.set()
        thread.join(10)
        trainer.close()
        validator.close()


def test_the_edge_takes_only_verdicts_the_canonical_lineage_bears_out(
    network_env: tuple[BackgroundEdge, Validator, Path],
) -> None:
    """A validator key signing verdicts at will (one Byzantine validator of a quorum) can neither mint
    credit for a candidate nobody uploaded nor erase work a canonical head merged."""
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    validator.ensure_genesis(spec)
    trainer = _trainer(edge, root, "credited")
    outcome = trainer.train_window_once(trainer.experiment(*BASELINE.parts))
    report = validator.poll(spec)
    assert report is not None and report.head.merged == (outcome.candidate_id,)
    [honest] = report.verdicts
    forged = {
        "mint": replace(
            honest, candidate_id=ContentId("sha256:" + "7" * 64), peer_id=peer_id_from_public_key(b"\x09" * 32)
        ),
        "erase": replace(honest, accepted=False, reason=Reason.REGRESSION, head_id=None),
        "elsewhere": replace(honest, head_id=outcome.base_head_id),  # accepted, naming a head that did not merge it
    }
    statuses = {}
    for name, verdict in forged.items():
        with pytest.raises(EdgeRequestError) as refused:
            validator.edge.publish_verdicts(BASELINE, [verdict.signed(validator.identity)])
        statuses[name] = refused.value.status
    assert statuses == {"mint": 404, "erase": 409, "elsewhere": 409}
    standing = validator.edge._request("GET", f"/v1/experiments/{BASELINE}/credit/{trainer.peer_id}").json()
    assert standing["accepted"] == 1 and standing["rejected"] == 0, standing
    trainer.close()


def test_a_continuous_trainer_that_waits_for_heads_asks_for_larger_leases(
    network_env: tuple[BackgroundEdge, Validator, Path],
) -> None:
    """Its next window's lease trained, a continuous trainer waits for the head; the next lease it asks
    for fills that wait (``protocol.lease_size``), within the experiment's ``max_shards_per_lease``."""
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    assert spec.max_shards_per_lease is not None and spec.max_shards_per_lease > spec.shards_per_lease
    validator.ensure_genesis(spec)
    trainer = _trainer(edge, root, "sizing", continuous=True)
    experiment = trainer.experiment(*BASELINE.parts)
    trainer.train_window_once(experiment)
    assert trainer.train_ahead_once(experiment) and not trainer.train_ahead_once(experiment)
    first = trainer._carry[experiment.key].ahead
    assert first is not None and len(first.grant.lease.shard_ids) == spec.shards_per_lease
    judged = threading.Timer(1.0, validator.poll, (spec,))  # the head comes a second later
    judged.start()
    outcome = trainer.train_window_once(experiment, wait_s=10.0)  # waits for it, then publishes
    judged.join()
    assert outcome.lease_id == first.grant.lease.lease_id
    assert trainer.train_ahead_once(experiment)
    second = trainer._carry[experiment.key].ahead
    assert second is not None and spec.shards_per_lease < len(second.grant.lease.shard_ids) <= spec.max_shards_per_lease
    trainer.close()


def test_a_continuous_trainer_waiting_for_a_head_asks_for_the_next_lease_as_the_head_arrives(
    network_env: tuple[BackgroundEdge, Validator, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its lease trained, a continuous trainer waits for the head; the lease after that head is asked for
    as the head arrives, before the trainer is handed it (so the request travels while the candidate
    is packaged), sized by the wait, which is counted once."""
    edge, validator, root = network_env
    spec = validator.network.experiment(BASELINE)
    validator.ensure_genesis(spec)
    trainer = _trainer(edge, root, "eager", continuous=True)
    experiment = trainer.experiment(*BASELINE.parts)
    before = trainer.train_window_once(experiment).base_head_id
    assert trainer.train_ahead_once(experiment) and not trainer.train_ahead_once(experiment)
    asked: list[tuple[str, str]] = []
    submit = trainer._submit_ahead

    def spy(experiment: Any, after: HeadDescriptor) -> Any:
        held = trainer._follower(experiment.key).current()
        asked.append((after.head_id, held.head.head_id if held else ""))
        return submit(experiment, after)

    monkeypatch.setattr(trainer, "_submit_ahead", spy)
    judged = threading.Timer(0.5, validator.poll, (spec,))
    judged.start()
    try:
        outcome = trainer.train_window_once(experiment, wait_s=10.0)
        judged.join()
        assert asked == [(outcome.base_head_id, before)]  # once, before the trainer held that head
        assert trainer._sizers[experiment.key].idle_s == 0.0  # the wait sized the lease once, then was gone
        assert trainer.train_ahead_once(experiment)
        ahead = trainer._carry[experiment.key].ahead
        assert ahead is not None and len(ahead.grant.lease.shard_ids) > spec.shards_per_lease  # it waited
    finally:
        trainer.close()


def test_a_continuous_trainer_two_heads_behind_starts_again_from_the_current_head(
    network_env: tuple[BackgroundEdge, Validator, Path], dataset_root: Path
) -> None:
    """A lease granted ahead whose window closed without it (at its deadline, two heads on) is not
    trained: the trainer starts again from the current head, with a lease of the current window."""
    edge, validator, root = network_env
    validator, clock = _validator_with(validator, edge, dataset_root)
    spec = validator.network.experiment(BASELINE)
    validator.ensure_genesis(spec)
    behind, other = _trainer(edge, root, "behind", continuous=True), _trainer(edge, root, "other")
    experiment = behind.experiment(*BASELINE.parts)
    behind.train_window_once(experiment)  # published, it asked for window 1's lease at once
    ahead = behind._next_lease(behind._carry[experiment.key])
    assert ahead is not None and ahead.grant.lease.window == 1
    assert validator.poll(spec) is not None  # window 0 closes with its candidate
    other.train_window_once(experiment)
    assert validator.poll(spec) is None  # the lease the trainer behind holds keeps window 1 open
    clock.advance(spec.window_timeout_s)
    latest = validator.poll(spec)  # window 1 closes at its deadline, without the trainer behind
    assert latest is not None and latest.head.window == 2
    behind._follower(experiment.key).refresh()  # the trainer knows of the current head
    assert not behind.train_ahead_once(experiment)  # window 1 is over: its lease is left untrained
    outcome = behind.train_window_once(experiment)
    assert outcome.base_head_id == latest.head.head_id
    for node in (behind, other, validator):
        node.close()


def test_writers_of_one_path_at_once_each_leave_it_whole(tmp_path: Path) -> None:
    """A shard two leases of one trainer hold is written by two threads at once (the content-keyed
    cache): each write is whole, none fails on the other's temporary file."""
    from native_peer.storage import write_atomic

    path = tmp_path / "shards" / "same.safetensors"
    errors: list[BaseException] = []

    def write(value: int) -> None:
        try:
            for _ in range(200):
                write_atomic(path, bytes([value]) * 4096)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    data = path.read_bytes()
    assert len(data) == 4096 and len(set(data)) == 1
    assert [p.name for p in path.parent.iterdir()] == ["same.safetensors"]  # no temporary file left


def test_a_validator_that_finds_its_edge_untrusted_waits_and_goes_on(
    network_env: tuple[BackgroundEdge, Validator, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """An edge that serves other network terms (``protocol.network_pins.served_by``) or a head without
    a quorum makes the validator wait and ask again, not stop: the edge may be put right."""
    _, validator, _ = network_env
    spec = validator.network.experiment(BASELINE)
    stop, calls = threading.Event(), []
    activity = validator.edge.activity

    def untrusted_once(*args: Any, **kwargs: Any) -> Activity:
        calls.append(args)
        if len(calls) == 1:
            raise SignatureError("the edge now serves network 'other' on other terms")
        stop.set()
        return activity(*args, **kwargs)

    validator.edge.activity = untrusted_once  # type: ignore[method-assign]
    validator.run([spec], stop)
    assert len(calls) == 2 and "edge not trusted" in caplog.text


def _quick_to_wake(validator: Validator) -> Validator:
    """Another validator of ``validator``'s network, storage and edge that waits 0.05 s at most for
    activity between rounds (the caller closes it)."""
    return Validator(
        validator.learners,
        validator.network,
        validator.storage,
        validator.edge.url,
        validator.datasets_dir,
        ValidatorConfig(idle_s=0.05),
    )


def test_a_head_that_does_not_verify_in_one_experiment_holds_only_that_one(
    network_env: tuple[BackgroundEdge, Validator, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """One experiment whose head does not verify is held, after a back-off of its own (0.5 s, then
    doubling); the validator goes on validating the others meanwhile (a failed round held them all)."""
    _, fixture_validator, _ = network_env
    validator = _quick_to_wake(fixture_validator)
    stop, polled, refused_at = threading.Event(), Counter[str](), list[float]()
    poll = validator.poll

    def untrusted_baseline(spec: ExperimentSpec) -> None:
        polled[str(spec.key)] += 1
        if spec.key == BASELINE:
            refused_at.append(time.monotonic())
            raise SignatureError("head is not signed by a validator of this network")
        poll(spec)
        if polled[str(LOW_LR)] == 6:
            stop.set()

    validator.poll = untrusted_baseline  # type: ignore[method-assign]
    bound = threading.Timer(60.0, stop.set)  # the checks below fail if this is what stopped the loop
    bound.start()
    try:
        validator.run(None, stop)
        genesis = validator.edge.current_head(LOW_LR)
    finally:
        bound.cancel()
        validator.close()
    assert polled[str(LOW_LR)] == 6 > polled[str(BASELINE)] >= 1  # the other experiment validated on
    gaps = [later - earlier for earlier, later in itertools.pairwise(refused_at)]
    assert all(gap >= 0.5 * 2**i - 0.01 for i, gap in enumerate(gaps)), gaps  # asked again once its hold ended
    assert f"{BASELINE}: the edge serves what was not signed" in caplog.text
    assert genesis is not None  # and has its genesis


def test_a_validator_reads_the_network_again_only_when_its_edges_activity_names_another_key(
    network_env: tuple[BackgroundEdge, Validator, Path],
) -> None:
    """The activity answer carries the key the edge signs with: a validator asks for the network (to
    follow a replaced edge, ``Validator._follow_edge_key``) when that key changes, not every window."""
    _, fixture_validator, _ = network_env
    spec = fixture_validator.network.experiment(BASELINE)
    fixture_validator.ensure_genesis(spec)
    validator = _quick_to_wake(fixture_validator)
    stop, events = threading.Event(), []
    activity, network = validator.edge.activity, validator.edge.network

    def rekeyed_on_the_third(*args: Any, **kwargs: Any) -> Activity:
        events.append("activity")
        answer = activity(*args, **kwargs)
        if events.count("activity") == 4:
            stop.set()
        return replace(answer, edge_key=b"\x01" * 32) if events.count("activity") == 3 else answer

    def read_network() -> Any:
        events.append("network")
        return network()

    validator.edge.activity = rekeyed_on_the_third  # type: ignore[method-assign]
    validator.edge.network = read_network  # type: ignore[method-assign]
    try:
        validator.run([spec], stop)
    finally:
        validator.close()
    assert events == ["activity"] * 3 + ["network", "activity"]
    assert validator.network.edge_key == fixture_validator.network.edge_key  # the same edge, after all


def test_a_trainer_that_finds_its_edge_untrusted_waits_and_goes_on(
    network_env: tuple[BackgroundEdge, Validator, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """A head, lease or network the validators did not sign makes a running trainer wait and ask again,
    never train on it, and never stop for it: the edge may be put right."""
    edge, validator, root = network_env
    validator.ensure_genesis(validator.network.experiment(BASELINE))
    trainer = _trainer(edge, root, "wary")
    experiment = trainer.experiment(*BASELINE.parts)
    current_head, calls = trainer.edge.current_head, []

    def forged_once(*args: Any, **kwargs: Any) -> HeadDescriptor | None:
        calls.append(args)
        if len(calls) == 1:
            raise SignatureError("bad dtn/head/v1 signature")
        return current_head(*args, **kwargs)

    trainer.edge.current_head = forged_once  # type: ignore[method-assign]
    outcomes = trainer.run([experiment], max_windows=1)
    trainer.close()
    assert len(outcomes) == 1 and len(calls) >= 2 and "edge not trusted" in caplog.text
