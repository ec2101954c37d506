"""One contract, every store engine: the same tests against SQLite (the embedded default) and
PostgreSQL (a private cluster on loopback, ``deploy.services``; skipped with the reason when it
cannot run here, failed under CI). SQLite's cases are in the fast tier, PostgreSQL's in the slow one."""

from __future__ import annotations

import itertools
import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol.ids import ContentId, DatasetId, ExperimentKey, HeadId, LeaseId, PeerId
from protocol.leases import assign_shards
from protocol.manifests import NetworkManifest
from protocol.messages import Attestation, Candidate, Evaluation, HeadDescriptor, Lease, Verdict
from protocol.network_revisions import NetworkRevision, SignedNetworkRevision
from protocol.reasons import Reason
from protocol.run_control import RunControl, RunState, SignedRunControl
from protocol.signing import PureSigner, peer_id_from_public_key
from server.errors import Conflict
from server.serve import BackgroundEdge
from server.store import SCHEMA_VERSION, EdgeStore, PostgresStore, Store

from .support import (
    EXPERIMENT,
    SPEC,
    VALIDATOR,
    candidate_envelope,
    edge_settings,
    experiment_spec,
    head_envelope,
    init_params,
    private_postgres,
    tools_output,
    write_network,
)

__all__ = ["private_postgres"]  # the fixture, used by name

EDGE = PureSigner(b"\x22" * 32)
TRAINERS = [PureSigner(bytes([i]) * 32) for i in range(40, 48)]
SHARDS = tuple(f"shard-{i:03d}" for i in range(24))
_databases = itertools.count()

Opener = Callable[[], EdgeStore]  # another store on the same database


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    opened: list[EdgeStore] = []
    if request.param == "sqlite":
        path = tmp_path / "edge.sqlite3"

        def open_store() -> EdgeStore:
            opened.append(Store(path))
            return opened[-1]
    else:
        url = request.getfixturevalue("private_postgres").create_database(f"contract_{next(_databases)}")

        def open_store() -> EdgeStore:
            opened.append(PostgresStore(url))
            return opened[-1]

    yield open_store
    for store in opened:
        store.close()


@pytest.fixture
def store(opener: Opener) -> EdgeStore:
    return opener()


def _chain(store: EdgeStore, length: int) -> list[HeadDescriptor]:
    heads: list[HeadDescriptor] = []
    for window in range(length):
        head, _ = head_envelope(parent=heads[-1].head_id if heads else None, window=window)
        assert store.promote_head(head, 1000 + window, 0)
        heads.append(head)
    return heads


def test_the_edge_seed_is_made_once_and_shared_by_every_store_on_the_database(opener: Opener) -> None:
    seed = opener().edge_seed()
    assert len(seed) == 32 and opener().edge_seed() == seed


def test_heads_chain_from_the_current_one(store: EdgeStore) -> None:
    assert store.current_head(EXPERIMENT) is None
    genesis, child = _chain(store, 2)
    assert store.current_head(EXPERIMENT) == child
    assert store.heads(EXPERIMENT) == [genesis, child]
    assert (
        store.head(EXPERIMENT, genesis.head_id) == genesis
        and store.head(EXPERIMENT, HeadId("sha256:" + "0" * 64)) is None
    )
    assert not store.promote_head(child, 5000, 0)  # already current
    stray, _ = head_envelope(parent=genesis.head_id, window=7)
    with pytest.raises(Conflict, match="is not the current head"):
        store.promote_head(stray, 5000, 0)


def test_one_candidate_per_lease_in_arrival_order(store: EdgeStore) -> None:
    (base,) = _chain(store, 1)
    first, _ = candidate_envelope(TRAINERS[0], base.head_id, "lease-a", seed=1)
    second, _ = candidate_envelope(TRAINERS[1], base.head_id, "lease-b", seed=2)
    assert store.add_candidate(first, 100, 1) and store.add_candidate(second, 250, 2)
    assert not store.add_candidate(first, 100, 3)  # the same upload again
    other, _ = candidate_envelope(TRAINERS[0], base.head_id, "lease-a", seed=3)
    with pytest.raises(Conflict, match="already delivered"):
        store.add_candidate(other, 100, 4)

    def listed(base_head: HeadId | None = None) -> list[Candidate]:
        return [c for _, c in store.candidates_since(EXPERIMENT, 0, 100, base_head)]

    assert listed() == [first, second] == listed(base.head_id)
    assert listed(HeadId("sha256:" + "1" * 64)) == []
    assert store.lease_delivered(LeaseId("lease-a")) == first.candidate_id
    assert store.lease_delivered(LeaseId("lease-c")) is None
    assert store.window_bytes(EXPERIMENT, base.head_id) == 350
    page = store.candidates_since(EXPERIMENT, 0, 1)
    assert [c for _, c in page] == [first]
    assert [c for _, c in store.candidates_since(EXPERIMENT, page[0][0], 10)] == [second]
    assert store.candidate_window(ContentId(first.candidate_id)) == (EXPERIMENT, base.head_id)
    assert store.candidate_window(ContentId(base.head_id)) is None  # a head is public


def test_candidates_retire_once_their_window_is_old(store: EdgeStore) -> None:
    heads = _chain(store, 1)
    candidate, _ = candidate_envelope(TRAINERS[0], heads[0].head_id, "lease-a")
    store.add_candidate(candidate, 10, 1)
    assert store.retire_candidates(EXPERIMENT, 2) == []
    heads += _chain_from(store, heads[-1], 2)
    assert store.retire_candidates(EXPERIMENT, 2) == [candidate.candidate_id]
    assert store.retire_candidates(EXPERIMENT, 2) == []  # marked gone, once
    assert [c for _, c in store.candidates_since(EXPERIMENT, 0, 10)] == [candidate]  # the descriptor stays


def _chain_from(store: EdgeStore, parent: HeadDescriptor, length: int) -> list[HeadDescriptor]:
    heads = [parent]
    for _ in range(length):
        head, _ = head_envelope(parent=heads[-1].head_id, window=heads[-1].window + 1)
        assert store.promote_head(head, 2000, 0)
        heads.append(head)
    return heads[1:]


def _chooser(peer: PeerId, now_ms: int, ttl_ms: int = 60_000) -> Callable[[HeadDescriptor | None, list[Lease]], Lease]:
    """What ``server.leasing`` does: the peer's live lease again, or free shards, or ``Conflict``."""

    def choose(head: HeadDescriptor | None, live: list[Lease]) -> Lease:
        assert head is not None
        for lease in live:
            if lease.peer_id == peer:
                return lease
        taken = {shard for lease in live for shard in lease.shard_ids}
        shards = assign_shards(head.head_id, peer, SHARDS, taken, 3)
        if not shards:
            raise Conflict("every shard is leased")
        lease = Lease(
            LeaseId(f"lease-{peer}-{now_ms}"), EXPERIMENT, peer, head.head_id, head.window, DatasetId("mnist"),
            shards, now_ms, now_ms + ttl_ms,
        )  # fmt: skip
        return lease.signed(EDGE)

    return choose


def test_a_lease_is_granted_once_per_peer_and_window_and_expires(store: EdgeStore) -> None:
    seen: list[object] = []
    peer = peer_id_from_public_key(TRAINERS[1].public_key)
    with pytest.raises(LookupError):
        store.grant_lease(EXPERIMENT, 0, lambda head, live: (seen.append((head, live)), _raise())[1], (peer, "native"))
    assert seen == [(None, [])] and store.peers() == []  # refused: nothing written, the peer not remembered
    (base,) = _chain(store, 1)
    lease, created = store.grant_lease(EXPERIMENT, 1000, _chooser(peer, 1000, ttl_ms=500), (peer, "native"))
    assert created and store.lease(lease.lease_id) == lease and store.leases(EXPERIMENT, base.head_id) == [lease]
    assert store.peers() == [{"peer_id": peer, "kind": "native", "first_seen_ms": 1000, "last_seen_ms": 1000}]
    again, created = store.grant_lease(EXPERIMENT, 1200, _chooser(peer, 1200), (peer, "native"))
    assert again == lease and not created and store.peers()[0]["last_seen_ms"] == 1200
    renewed, created = store.grant_lease(EXPERIMENT, 1600, _chooser(peer, 1600))  # the first one expired
    assert created and renewed.lease_id != lease.lease_id
    assert store.leases(EXPERIMENT, base.head_id) == [lease, renewed]
    assert store.lease(LeaseId("lease-none")) is None


def test_a_lease_given_back_frees_its_shards_and_delivers_nothing(store: EdgeStore) -> None:
    (base,) = _chain(store, 1)
    leaver, other, delivering = (peer_id_from_public_key(t.public_key) for t in TRAINERS[2:5])
    held, _ = store.grant_lease(EXPERIMENT, 1000, _chooser(leaver, 1000))
    done, _ = store.grant_lease(EXPERIMENT, 1000, _chooser(delivering, 1000))
    candidate, _ = candidate_envelope(TRAINERS[4], base.head_id, done.lease_id)
    assert store.add_candidate(candidate, 10, 1100)
    released = store.release_leases([held.lease_id, done.lease_id], 2000, lambda lease: lease.signed(EDGE))
    assert [lease.lease_id for lease in released] == [held.lease_id]  # a delivered lease is not given back
    [given_back] = released
    given_back.verify(EDGE.public_key)
    assert given_back.expires_at_ms == 2000 and store.lease(held.lease_id) == given_back
    assert store.release_leases([held.lease_id], 2100, lambda lease: lease.signed(EDGE)) == []  # once
    # its shards are free for the window's next asker; what validators read shows it lapsed
    live: list[Lease] = []
    store.grant_lease(
        EXPERIMENT, 2200, lambda head, granted: (live.extend(granted), _chooser(other, 2200)(head, granted))[1]
    )
    assert held.lease_id not in {lease.lease_id for lease in live}
    late, _ = candidate_envelope(TRAINERS[2], base.head_id, held.lease_id)
    with pytest.raises(Conflict, match="given back"):
        store.lease_delivered(held.lease_id)
    with pytest.raises(Conflict, match="given back"):
        store.add_candidate(late, 10, 2300)
    assert store.lease_delivered(done.lease_id) == candidate.candidate_id


def test_leases_of_old_windows_are_forgotten_with_their_holders_and_release_marks(store: EdgeStore) -> None:
    (base,) = _chain(store, 1)
    lapsed, given, delivering = (peer_id_from_public_key(t.public_key) for t in TRAINERS[2:5])
    old, _ = store.grant_lease(EXPERIMENT, 1000, _chooser(lapsed, 1000))
    back, _ = store.grant_lease(EXPERIMENT, 1000, _chooser(given, 1000))
    assert store.release_leases([back.lease_id], 1500, lambda lease: lease.signed(EDGE))
    done, _ = store.grant_lease(EXPERIMENT, 1000, _chooser(delivering, 1000))
    candidate, _ = candidate_envelope(TRAINERS[4], base.head_id, done.lease_id)
    assert store.add_candidate(candidate, 10, 1100)
    heads = _chain_from(store, base, 2)
    recent, _ = store.grant_lease(EXPERIMENT, 3000, _chooser(lapsed, 3000))  # on the head of window 2
    assert store.retire_leases(EXPERIMENT, 3) == 0  # window 0 is 2 heads behind
    assert len(store.lapsed_holders(EXPERIMENT, 0, 0)) == 2
    _chain_from(store, heads[-1], 1)
    assert store.retire_leases(EXPERIMENT, 3) == 3 and store.retire_leases(EXPERIMENT, 3) == 0
    assert all(store.lease(lease.lease_id) is None for lease in (old, back, done))
    assert store.leases(EXPERIMENT, base.head_id) == [] and store.lapsed_holders(EXPERIMENT, 0, 0) == []
    assert store.lease_delivered(back.lease_id) is None  # its release mark went with it
    assert store.lease(recent.lease_id) == recent
    assert [c for _, c in store.candidates_since(EXPERIMENT, 0, 10)] == [candidate]  # the candidate stays


def _raise() -> Lease:
    raise LookupError("no head")


def test_stores_on_one_database_never_lease_a_shard_twice(opener: Opener) -> None:
    """Eight threads, each with its own store (connection) on one database, race for 24 shards in
    leases of 3: every shard is leased once, and every request past them gets ``Conflict``."""
    stores = [opener() for _ in range(8)]
    _chain(stores[0], 1)
    granted: list[Lease] = []
    refused: list[Conflict] = []
    start = threading.Barrier(len(stores))

    def race(store: EdgeStore, worker: int) -> None:
        start.wait()
        for attempt in range(3):
            peer = _peer(10 * worker + attempt)
            try:
                granted.append(store.grant_lease(EXPERIMENT, 1000, _chooser(peer, 1000))[0])
            except Conflict as exc:
                refused.append(exc)

    threads = [threading.Thread(target=race, args=(store, i)) for i, store in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    shards = [shard for lease in granted for shard in lease.shard_ids]
    assert sorted(shards) == sorted(SHARDS) and len(granted) == 8 and len(refused) == 16


def _peer(number: int) -> PeerId:
    return peer_id_from_public_key(number.to_bytes(32, "big"))


def test_proposals_keep_their_attestations_as_certificates(store: EdgeStore) -> None:
    genesis, _ = head_envelope()
    child, _ = head_envelope(parent=genesis.head_id, window=1)
    assert store.add_proposal(genesis, 1) and not store.add_proposal(genesis, 2)
    assert store.add_proposal(child, 3)
    assert [h.head_id for h in store.proposals(EXPERIMENT, None)] == [genesis.head_id]
    assert [h.head_id for h in store.proposals(EXPERIMENT, genesis.head_id)] == [child.head_id]
    attestation = Attestation.of(child, [], VALIDATOR, 1)
    assert store.add_attestation(attestation) and not store.add_attestation(attestation)
    proposal = store.proposal(EXPERIMENT, child.head_id)
    assert proposal is not None and proposal.certificate == (attestation,)
    assert store.attestations(EXPERIMENT, child.head_id) == [attestation]
    assert store.proposal(EXPERIMENT, HeadId("sha256:" + "2" * 64)) is None


def test_evaluations_keep_the_first_copy_per_validator_head_and_split_listed_by_window(store: EdgeStore) -> None:
    genesis, _ = head_envelope()
    child, _ = head_envelope(parent=genesis.head_id, window=1)
    later = Evaluation.of(child, "test", {"accuracy": 0.9}, VALIDATOR, 2)
    first = Evaluation.of(genesis, "test", {"accuracy": 0.1}, VALIDATOR, 3)
    other = Evaluation.of(child, "test", {"accuracy": 0.8}, PureSigner(b"\x12" * 32), 4)
    assert store.add_evaluation(later) and store.add_evaluation(first) and store.add_evaluation(other)
    assert not store.add_evaluation(Evaluation.of(child, "test", {"accuracy": 0.2}, VALIDATOR, 5))
    assert store.evaluations(EXPERIMENT) == [first, later, other]  # by window, then as they came
    assert store.evaluations(EXPERIMENT, since_window=1) == [later, other]
    assert store.evaluations(EXPERIMENT, limit=2) == [first, later]


def test_a_proposers_budget_holds_for_requests_in_flight_at_once(opener: Opener) -> None:
    """Six threads, each with its own store on one database, add six different heads of one proposer on
    one parent at once with a budget of two: two are kept, the other four are refused (``None``), and
    a head kept already is not counted again."""
    stores = [opener() for _ in range(6)]
    genesis, _ = head_envelope()
    heads = [head_envelope(init_params(SPEC, 10 + i), parent=genesis.head_id, window=1)[0] for i in range(6)]
    start = threading.Barrier(len(stores))
    added: list[bool | None] = []

    def propose(store: EdgeStore, head: HeadDescriptor) -> None:
        start.wait()
        added.append(store.add_proposal(head, 1, budget=2))

    threads = [threading.Thread(target=propose, args=pair) for pair in zip(stores, heads, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(added, key=str) == sorted([True, True, None, None, None, None], key=str)
    assert len(stores[0].proposals(EXPERIMENT, genesis.head_id)) == 2
    kept = stores[0].proposals(EXPERIMENT, genesis.head_id)[0]
    assert stores[0].add_proposal(kept, 2, budget=2) is False  # kept already: neither new nor over budget


def test_verdicts_newest_first_by_peer_and_counted(store: EdgeStore) -> None:
    (base,) = _chain(store, 1)
    verdicts = []
    for i, trainer in enumerate(TRAINERS[:3]):
        candidate, _ = candidate_envelope(trainer, base.head_id, f"lease-{i}", seed=i)
        reason = Reason.ACCEPTED if i != 1 else Reason.OUTLIER
        verdict = Verdict(
            EXPERIMENT, candidate.candidate_id, base.head_id, candidate.peer_id, reason.accepted, reason, "",
            VALIDATOR.public_key, i,
        )  # fmt: skip
        verdicts.append(verdict.signed(VALIDATOR))
    assert all(store.add_verdict(v, 10) for v in verdicts) and not store.add_verdict(verdicts[0], 10)
    assert store.verdicts(EXPERIMENT) == verdicts[::-1] and store.verdicts(EXPERIMENT, limit=1) == verdicts[2:]
    assert store.verdicts(EXPERIMENT, verdicts[1].peer_id) == [verdicts[1]]
    assert store.verdict_counts(EXPERIMENT) == {"accepted": 2, "rejected": 1}


def test_pending_verdicts_and_validator_budgets_on_every_engine(store: EdgeStore) -> None:
    """What ``server.intake`` keeps for the quorum: votes per validator and candidate, the heads that
    decide a candidate, and each validator key's proposals and bytes per window."""
    genesis, after = _chain(store, 2)
    candidate, _ = candidate_envelope(TRAINERS[0], genesis.head_id, "lease-v")
    assert store.add_candidate(candidate, 100, 1)
    found = store.decided_by(EXPERIMENT, candidate.candidate_id, 2)
    assert found is not None and found[0] == candidate and found[1] is None and found[2] == [after]
    assert store.decided_by(EXPERIMENT, ContentId("sha256:" + "4" * 64), 2) is None
    others = [PureSigner(bytes([i]) * 32) for i in (60, 61)]
    votes = [
        Verdict(
            EXPERIMENT,
            candidate.candidate_id,
            genesis.head_id,
            candidate.peer_id,
            False,
            Reason.OUTLIER,
            "",
            signer.public_key,
            1,
        ).signed(signer)
        for signer in (VALIDATOR, *others)
    ]
    assert all(store.add_vote(v) for v in votes) and not store.add_vote(votes[0])  # one per validator
    assert store.votes(EXPERIMENT, candidate.candidate_id) == votes
    assert store.voted_candidates(EXPERIMENT, (genesis.head_id,)) == [candidate.candidate_id]
    assert store.voted_candidates(EXPERIMENT, (after.head_id,)) == []
    assert [v for _, v in store.votes_after(EXPERIMENT, 0)] == votes
    store.drop_votes(EXPERIMENT, candidate.candidate_id, others[0].public_key)
    assert store.votes(EXPERIMENT, candidate.candidate_id) == [votes[0], votes[2]]
    assert store.add_verdict(votes[0], 0)  # it counts: its votes stay (its certificate), pending no more
    assert store.voted_candidates(EXPERIMENT, (genesis.head_id,)) == []
    assert store.votes(EXPERIMENT, candidate.candidate_id) == [votes[0], votes[2]]
    store.drop_votes(EXPERIMENT, candidate.candidate_id)
    assert store.votes(EXPERIMENT, candidate.candidate_id) == []
    proposal, _ = head_envelope(parent=after.head_id, window=2)
    assert store.proposed_by(EXPERIMENT, after.head_id, VALIDATOR.public_key) == 0
    assert store.add_proposal(proposal, 5)
    assert store.proposed_by(EXPERIMENT, after.head_id, VALIDATOR.public_key) == 1
    assert store.proposed_by(EXPERIMENT, after.head_id, others[0].public_key) == 0
    assert store.charge_validator(proposal, proposal.head_id, 60, 100) is None
    assert store.charge_validator(proposal, proposal.head_id, 60, 100) is None  # once per artifact
    assert store.charge_validator(proposal, ContentId("sha256:" + "3" * 64), 60, 100) == 60  # past the budget
    assert (
        store.charge_validator(replace(proposal, validator_key=others[0].public_key), proposal.head_id, 60, 100) is None
    )


def test_tokens_bind_at_most_their_keys_and_revoke_by_prefix(store: EdgeStore) -> None:
    store.add_token("ab" * 32, "trainer", "alice", 5, 10_000, max_keys=2)
    store.add_token("cd" * 32, "viewer", "bob", 6, 20_000)
    assert store.token("ab" * 32) == ("trainer", 10_000) and store.token("ef" * 32) is None
    assert [t["label"] for t in store.tokens()] == ["alice", "bob"]
    assert store.bind_token_key("ab" * 32, "p1", 1) and store.bind_token_key("ab" * 32, "p1", 2)
    assert store.bind_token_key("ab" * 32, "p2", 3) and not store.bind_token_key("ab" * 32, "p3", 4)
    with pytest.raises(ValueError, match="hex digits"):
        store.delete_tokens("ab%")
    assert store.delete_tokens("abab") == 1 and store.token("ab" * 32) is None
    assert store.delete_tokens("abab") == 0 and [t["label"] for t in store.tokens()] == ["bob"]


def test_peers_are_remembered_with_their_latest_kind(store: EdgeStore) -> None:
    store.saw_peer(_peer(1), "native", 10)
    store.saw_peer(_peer(2), "browser", 20)
    store.saw_peer(_peer(1), "browser", 30)
    assert store.peers() == [
        {"peer_id": _peer(1), "kind": "browser", "first_seen_ms": 10, "last_seen_ms": 30},
        {"peer_id": _peer(2), "kind": "browser", "first_seen_ms": 20, "last_seen_ms": 20},
    ]
    ids = sorted([_peer(1), _peer(2)])
    assert [p["peer_id"] for p in store.peers_page("", 1)] == ids[:1]  # pages by id, after a cursor
    assert [p["peer_id"] for p in store.peers_page(ids[0], 5)] == ids[1:] and store.peers_page(ids[1], 5) == []


def test_a_database_of_another_schema_version_is_refused(opener: Opener, tmp_path: Path) -> None:
    store = opener()
    _mark_old_schema(store, tmp_path)
    with pytest.raises(RuntimeError, match=rf"holds edge schema v1; this edge needs v{SCHEMA_VERSION}"):
        opener()


def _mark_old_schema(store: EdgeStore, tmp_path: Path) -> None:
    if isinstance(store, PostgresStore):
        with store._db.transaction() as run:  # the test reaches into the engine to age the database
            run("UPDATE settings SET value = ? WHERE key = 'schema_version'", b"1")
    else:
        db = sqlite3.connect(tmp_path / "edge.sqlite3")
        db.execute("PRAGMA user_version = 1")
        db.close()


def test_an_unreachable_postgres_is_a_clear_error() -> None:
    with pytest.raises(
        RuntimeError, match=r"cannot reach the PostgreSQL store at postgresql://dtn:\*\*\*@127.0.0.1:1/"
    ):
        PostgresStore("postgresql://dtn:secret@127.0.0.1:1/none")


@pytest.mark.slow
def test_operators_manage_tokens_in_a_postgresql_store(private_postgres: Any, tmp_path: Path) -> None:
    """``python -m tools token`` works on the store several edges share, not only on SQLite."""
    url = private_postgres.create_database("tokens")
    issued = tools_output(["token", "issue", "--role", "trainer", "--label", "shared", "--store-url", url]).strip()
    listed = tools_output(["token", "list", "--store-url", url, "--data-dir", str(tmp_path)])
    assert "trainer" in listed and "shared" in listed
    assert "shared" not in tools_output(["token", "list", "--data-dir", str(tmp_path)])  # the SQLite store is another
    tools_output(["token", "revoke", issued, "--store-url", url])
    assert "shared" not in tools_output(["token", "list", "--store-url", url])


@pytest.mark.slow
def test_an_edge_on_postgresql_answers_503_while_it_is_down_and_goes_on_after_its_restart(
    private_postgres: Any, tmp_path: Path, dataset_root: Path
) -> None:
    """A PostgreSQL restart (an upgrade, a failover) costs the requests made meanwhile, not the edge."""
    from deploy.services import PrivatePostgres

    write_network(tmp_path / "network.json")
    with PrivatePostgres() as postgres:  # a cluster of its own: restarting it cuts no other test's connections
        settings = edge_settings(tmp_path, dataset_root, store_url=postgres.create_database("restarted"))
        with BackgroundEdge(settings) as edge, httpx.Client(base_url=edge.url, timeout=30) as http:
            heads = f"/v1/experiments/{EXPERIMENT}/heads"
            assert http.post(heads, content=head_envelope()[1]).status_code == 201
            before = http.get(heads).json()
            assert len(before) == 1
            postgres.halt()
            down = http.get(heads)
            assert down.status_code == 503 and down.json()["error"] == "Unavailable", down.text
            assert "127.0.0.1" in down.json()["detail"] and "password" not in down.text
            assert http.get("/readyz").status_code == 503
            postgres.start()
            assert http.get(heads).json() == before  # nothing lost, no edge restart
            assert http.get("/readyz").status_code == 200


def test_credit_is_tallied_from_signed_verdicts_as_they_arrive_alike_on_every_edge(opener: Opener) -> None:
    from server.credit import CreditBook

    store = opener()
    (base,) = _chain(store, 1)
    books = [CreditBook(store), CreditBook(opener())]  # two edges on one database

    def verdict(trainer: PureSigner, index: int, reason: Reason, examples: float) -> Verdict:
        candidate, _ = candidate_envelope(trainer, base.head_id, f"lease-{index}", seed=index)
        return Verdict(
            EXPERIMENT, candidate.candidate_id, base.head_id, candidate.peer_id, reason.accepted, reason, "",
            VALIDATOR.public_key, 100 + index, metrics={"examples": examples},
        ).signed(VALIDATOR)  # fmt: skip

    alice, bob = (peer_id_from_public_key(t.public_key) for t in TRAINERS[:2])
    store.add_verdict(
        verdict(TRAINERS[0], 0, Reason.ACCEPTED, 1e11), 4000
    )  # credited: the edge's count, not the metric
    store.add_verdict(verdict(TRAINERS[1], 1, Reason.ACCEPTED, 1000), 1000)
    assert [(s.peer_id, s.examples) for s in books[0].leaderboard(EXPERIMENT, 10)] == [(alice, 4000), (bob, 1000)]
    store.add_verdict(verdict(TRAINERS[1], 2, Reason.ACCEPTED, 3500), 3500)
    store.add_verdict(verdict(TRAINERS[0], 3, Reason.OUTLIER, 4000), 4000)  # rejected: no examples credited
    for book in books:
        assert [s.to_wire() for s in book.leaderboard(EXPERIMENT, 10)] == [
            {"peer_id": bob, "accepted": 2, "rejected": 0, "examples": 4500, "last_accepted_ms": 102},
            {"peer_id": alice, "accepted": 1, "rejected": 1, "examples": 4000, "last_accepted_ms": 100},
        ]
        assert book.leaderboard(EXPERIMENT, 1)[0].peer_id == bob
        assert book.standing(EXPERIMENT, alice).rejected == 1


@pytest.mark.slow
def test_reads_in_arrival_order_use_an_index_on_postgresql(private_postgres: Any) -> None:
    """``rowid > ?`` (candidates followed by cursor, the credit tally's new verdicts) is a range scan on
    PostgreSQL as it is in SQLite, where the rowid is the table's key: every table's rowid is indexed."""
    import psycopg

    url = private_postgres.create_database("arrival_order")
    PostgresStore(url).close()
    with psycopg.connect(url) as connection:
        tables = {row[0] for row in connection.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        indexed = {
            row[0]
            for row in connection.execute("SELECT tablename, indexdef FROM pg_indexes WHERE schemaname = 'public'")
            if row[1].endswith("(rowid)")
        }
    assert {"candidates", "verdicts", "leases"} <= tables and indexed == tables


def test_the_sqlite_file_holding_the_edge_seed_is_its_owners_alone(tmp_path: Path) -> None:
    """The edge's signing seed and the tokens' digests live in the SQLite file: 0600, and so are the
    WAL and shared-memory files SQLite makes beside it, whatever the umask."""
    path = tmp_path / "edge.sqlite3"
    store = Store(path)
    try:
        store.edge_seed()
        files = [path, *tmp_path.glob("edge.sqlite3-*")]
        assert len(files) == 3 and all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    finally:
        store.close()


def test_network_signatures_are_kept_one_per_validator(opener: Opener) -> None:
    first, again = opener(), opener()  # another edge on the same database sees them
    first.keep_network_signature("key-a", "sig-1")
    first.keep_network_signature("key-b", "sig-2")
    first.keep_network_signature("key-a", "sig-3")  # a validator that signs again replaces its signature
    assert again.network_signatures() == {"key-a": "sig-3", "key-b": "sig-2"}


def test_run_control_orders_apply_once_in_sequence_and_outlive_the_store(opener: Opener) -> None:
    order = RunControl("test-net", EXPERIMENT, "pause", sequence=1, issued_at_ms=5)
    store = opener()
    assert store.run_state(EXPERIMENT) == RunState()
    assert store.apply_run_control(SignedRunControl.of(order, [VALIDATOR]), 10, 0) == RunState(1, paused=True)
    with pytest.raises(Conflict, match="sequence 1 was already used"):
        store.apply_run_control(SignedRunControl.of(order, [VALIDATOR]), 11, 0)
    again = opener()  # another edge on the same database, or this one restarted
    assert again.run_state(EXPERIMENT) == RunState(1, paused=True)
    assert [(signed.order, at) for signed, at in again.run_orders(EXPERIMENT)] == [(order, 10)]


def test_network_revisions_are_taken_once_in_sequence_and_outlive_the_store(opener: Opener) -> None:
    network = NetworkManifest("test-net", (VALIDATOR.public_key,), (experiment_spec(),))
    added = experiment_spec(ExperimentKey.parse("study/added/rev-1"))
    first = SignedNetworkRevision.of(NetworkRevision.of(network, 5, experiments=[added]), [VALIDATOR])
    second = SignedNetworkRevision.of(
        NetworkRevision.of(
            first.apply(network),
            6,
            quorum=1,
            validator_keys=[VALIDATOR.public_key, PureSigner(b"\x77" * 32).public_key],
        ),
        [VALIDATOR],
    )
    store = opener()
    with pytest.raises(Conflict, match="revision 2 does not follow revision 0"):
        store.add_network_revision(second, 9)
    store.add_network_revision(first, 10)
    with pytest.raises(Conflict, match="revision 1 does not follow revision 1"):
        store.add_network_revision(first, 11)
    store.add_network_revision(second, 12)
    again = opener()  # another edge on the same database, or this one restarted
    assert again.network_revisions() == [(first, 10), (second, 12)]
    assert again.network_revisions(after=1) == [(second, 12)]


def test_a_revision_is_checked_in_its_transaction_and_shuts_out_what_was_certified_before_it(opener: Opener) -> None:
    """The handover check reads the heads and orders in the transaction that keeps the revision, and a
    head or order certified under the revision before is refused once a later one is held (by this
    edge or another sharing the store): nothing the old validators certified slips in between."""
    network = NetworkManifest("test-net", (VALIDATOR.public_key,), (experiment_spec(),))
    other = PureSigner(b"\x77" * 32)
    change = SignedNetworkRevision.of(
        NetworkRevision.of(network, 5, quorum=1, validator_keys=[other.public_key]), [VALIDATOR]
    )
    store, again = opener(), opener()
    genesis, child = _chain(store, 2)
    order = RunControl("test-net", EXPERIMENT, "pause", sequence=1, issued_at_ms=5)
    store.apply_run_control(SignedRunControl.of(order, [VALIDATOR]), 10, 0)
    seen: list[tuple[dict[ExperimentKey, list[HeadDescriptor]], dict[ExperimentKey, int]]] = []

    def refuse(lineages: dict[ExperimentKey, list[HeadDescriptor]], sequences: dict[ExperimentKey, int]) -> str:
        seen.append((lineages, sequences))
        return "moved past the handover"

    with pytest.raises(Conflict, match="moved past the handover"):
        store.add_network_revision(change, 20, refuse)
    assert seen == [({EXPERIMENT: [genesis, child]}, {EXPERIMENT: 1})] and store.network_revisions() == []
    store.add_network_revision(change, 21, lambda lineages, sequences: None)
    late, _ = head_envelope(parent=child.head_id, window=2)
    with pytest.raises(Conflict, match="certified under network revision 0, and the network is at revision 1"):
        again.promote_head(late, 22, 0)
    resume = RunControl("test-net", EXPERIMENT, "resume", sequence=2, issued_at_ms=6)
    with pytest.raises(Conflict, match="network is at revision 1"):
        again.apply_run_control(SignedRunControl.of(resume, [VALIDATOR]), 23, 0)
    assert again.current_head(EXPERIMENT) == child and again.run_state(EXPERIMENT) == RunState(1, paused=True)
    assert again.promote_head(late, 24, 1)  # certified under the revision held
