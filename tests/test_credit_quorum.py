"""Credit and standing follow the quorum, against a real edge of a 2-of-3 network in which one
validator key (``BYZANTINE``) signs whatever it likes.

Heads are signed and attested here with the validators' keys (no training: what is under test is
the edge's intake), candidates are real uploads on real leases. A verdict counts only when the
canonical lineage bears it out or two validators sign the same decision (``protocol.credit``); the
rest is held as pending or refused with a reason; each validator key has a budget of proposals and
of bytes per window.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest

from protocol.codec import encode_tensors
from protocol.credit import Settled, counts, credited_examples, leased_examples, same_decision, settle
from protocol.envelope import pack_envelope
from protocol.hashing import content_id
from protocol.ids import ContentId, HeadId, LeaseId
from protocol.manifests import FetchManifest, NetworkManifest
from protocol.messages import Attestation, Candidate, HeadDescriptor, Lease, Verdict
from protocol.model import init_params
from protocol.reasons import Reason
from protocol.signing import PureSigner, peer_id_from_public_key
from protocol.updates import encode_update
from server.serve import BackgroundEdge

from .support import EXPERIMENT, SPEC, edge_settings, experiment_spec, grant_lease, now_ms, proof

BASE = f"/v1/experiments/{EXPERIMENT}"
HONEST = (PureSigner(b"\x21" * 32), PureSigner(b"\x22" * 32))
BYZANTINE = PureSigner(b"\x23" * 32)
NOBODY = peer_id_from_public_key(b"\x09" * 32)  # a peer that never uploaded anything


def _network(root: Path) -> None:
    """The 2-of-3 network at ``root/network.json``."""
    keys = tuple(signer.public_key for signer in (*HONEST, BYZANTINE))
    network = NetworkManifest("quorum-net", keys, (experiment_spec(),), quorum=2)
    (root / "network.json").write_text(json.dumps(network.to_wire()))


@pytest.fixture
def edge(tmp_path: Path, dataset_root: Path) -> Iterator[BackgroundEdge]:
    _network(tmp_path)
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as started:
        yield started


def _head(
    parent: HeadDescriptor | None, merged: tuple[str, ...], signer: PureSigner, seed: int
) -> tuple[HeadDescriptor, bytes]:
    """A head on ``parent`` merging ``merged``, proposed by ``signer``, and its envelope."""
    artifact = encode_tensors(init_params(SPEC, seed))
    head = HeadDescriptor(
        experiment=EXPERIMENT,
        head_id=HeadId(content_id(artifact)),
        parent=None if parent is None else parent.head_id,
        window=0 if parent is None else parent.window + 1,
        global_step=0,
        merged=tuple(ContentId(c) for c in merged),
        validator_key=signer.public_key,
        created_at_ms=now_ms(),
    ).signed(signer)
    return head, pack_envelope(head.to_wire(), artifact)


def _certify(http: httpx.Client, parent: HeadDescriptor | None, merged: tuple[str, ...], seed: int) -> HeadDescriptor:
    """The honest validators' head on ``parent``: proposed by one, attested by the other: canonical."""
    head, envelope = _head(parent, merged, HONEST[0], seed)
    assert http.post(f"{BASE}/heads", content=envelope).status_code == 202
    attestation = Attestation.of(head, merged, HONEST[1], now_ms())
    assert http.post(f"{BASE}/attestations", json=attestation.to_wire()).status_code == 201
    assert http.get(f"{BASE}/head").json()["head_id"] == head.head_id
    return head


def _upload(http: httpx.Client, trainer: PureSigner, seed: int, examples: int = 64, **headers: str) -> Candidate:
    """A real candidate on a real lease of the current window (asked for with ``headers``)."""
    lease = grant_lease(http, trainer, **headers).lease
    trained = init_params(SPEC, seed)
    zeros = {name: np.zeros_like(value) for name, value in trained.items()}
    artifact = encode_tensors(encode_update(SPEC, zeros, trained, "fp32", None)[0])
    candidate = Candidate.for_lease(
        lease, lease.base_head, artifact, trainer, peer_kind="native", examples=examples, steps=1, created_at_ms=1
    )
    response = http.post(f"{BASE}/candidates", content=pack_envelope(candidate.to_wire(), artifact))
    assert response.status_code == 201, response.text
    return candidate


def _verdict(
    signer: PureSigner, candidate: Candidate, head: HeadDescriptor | None, *, examples: float = 64.0, **changes: object
) -> Verdict:
    """``signer``'s verdict on ``candidate``: accepted into ``head``, or (``head`` None) rejected."""
    reason = Reason.ACCEPTED if head is not None else Reason.REGRESSION
    verdict = Verdict(
        EXPERIMENT, candidate.candidate_id, candidate.base_head, candidate.peer_id, reason.accepted, reason, "",
        signer.public_key, now_ms(), None if head is None else head.head_id, {"examples": examples},
    )  # fmt: skip
    return replace(verdict, **changes).signed(signer)  # type: ignore[arg-type]


def _post(http: httpx.Client, verdict: Verdict) -> httpx.Response:
    return http.post(f"{BASE}/verdicts", json=verdict.to_wire())


def _refused(response: httpx.Response, status: int, reason: str) -> None:
    body = response.json()
    assert response.status_code == status and reason in body["detail"], (response.status_code, body)


def _standing(http: httpx.Client, trainer: PureSigner) -> tuple[int, int, int]:
    s = http.get(f"{BASE}/credit/{peer_id_from_public_key(trainer.public_key)}").json()
    return s["accepted"], s["rejected"], s["examples"]


def test_one_validator_can_neither_mint_nor_erase_credit_and_honest_verdicts_count(edge: BackgroundEdge) -> None:
    alice, bob, carol, dave = (PureSigner(bytes([0x40 + i]) * 32) for i in range(4))
    with httpx.Client(base_url=edge.url) as http:
        genesis = _certify(http, None, (), 0)
        merged, refused = _upload(http, alice, 1), _upload(http, bob, 2)
        first = _certify(http, genesis, (merged.candidate_id,), 1)

        # minting: credit for a peer that uploaded nothing, or for someone else's merged work
        fake = replace(merged, candidate_id=ContentId("sha256:" + "7" * 64), public_key=b"\x09" * 32)
        _refused(_post(http, _verdict(BYZANTINE, fake, first, peer_id=NOBODY)), 404, "was received here")
        _refused(_post(http, _verdict(BYZANTINE, merged, first, peer_id=NOBODY)), 409, f"is {merged.peer_id}'s")
        _refused(_post(http, _verdict(BYZANTINE, refused, first)), 409, "did not merge")
        # erasing: a rejection of work a certified head merged, alone or in a batch with good verdicts
        _refused(_post(http, _verdict(BYZANTINE, merged, None)), 409, f"canonical head {first.head_id} merged")
        batch = [_verdict(HONEST[0], merged, first).to_wire(), _verdict(BYZANTINE, merged, None).to_wire()]
        _refused(http.post(f"{BASE}/verdict-batches", json=batch), 409, "contradicts the canonical lineage")
        assert _standing(http, alice) == (0, 0, 0)  # the refused batch kept nothing

        # an acceptance the certified head bears out counts once two validators vouch for the same
        # credit: the Byzantine key's inflated claim stays a vote; the honest ones count, capped by the
        # candidate's own count (64; its lease covers more)
        assert _post(http, _verdict(BYZANTINE, merged, first, examples=1e11)).status_code == 202
        assert _post(http, _verdict(HONEST[0], merged, first, examples=1e5)).status_code == 202
        assert _standing(http, alice) == (0, 0, 0)
        assert _post(http, _verdict(HONEST[1], merged, first, examples=1e5)).status_code == 201
        assert _standing(http, alice) == (1, 0, 64)
        # once a verdict counts, another decision on its candidate is refused; the same one changes nothing
        _refused(_post(http, _verdict(BYZANTINE, merged, first, examples=0.0)), 409, "decided otherwise")
        assert _post(http, _verdict(HONEST[0], merged, first, examples=1e5)).status_code == 201
        assert _standing(http, alice) == (1, 0, 64)

        # a rejection the lineage does not decide yet (one more head could merge it late) is pending
        # until two validators sign it; the Byzantine key's acceptance of it stays pending
        assert _post(http, _verdict(HONEST[0], refused, None)).status_code == 202
        assert _post(http, _verdict(BYZANTINE, refused, None, head_id=HeadId("sha256:" + "5" * 64), accepted=True,
                                    reason=Reason.ACCEPTED)).status_code == 202  # fmt: skip
        assert _standing(http, bob) == (0, 0, 0)
        answer = http.post(f"{BASE}/verdict-batches", json=[_verdict(HONEST[1], refused, None).to_wire()])
        assert answer.json() == {"published": 1, "counted": 1, "pending": 0}
        assert _standing(http, bob) == (0, 1, 0)

        # the Byzantine key alone rejects honest work of the open window: held, then dropped when the
        # certified head merges it (and its acceptance crediting nothing does not erase the credit);
        # an honest validator alone rejects another: counted once the lineage decides it (two heads
        # later), while the Byzantine acceptance of it is dropped
        late_merged, lone = _upload(http, carol, 3), _upload(http, dave, 4)
        assert _post(http, _verdict(BYZANTINE, late_merged, None)).status_code == 202
        assert _post(http, _verdict(BYZANTINE, lone, first, head_id=HeadId("sha256:" + "6" * 64))).status_code == 202
        second = _certify(http, first, (late_merged.candidate_id,), 2)
        assert _post(http, _verdict(BYZANTINE, late_merged, second, examples=0.0)).status_code == 202
        assert _post(http, _verdict(HONEST[0], late_merged, second)).status_code == 202
        assert _standing(http, carol) == (0, 0, 0)
        assert _post(http, _verdict(HONEST[1], late_merged, second)).status_code == 201
        assert _post(http, _verdict(HONEST[0], lone, None)).status_code == 202
        assert _standing(http, dave) == (0, 0, 0)
        _certify(http, second, (), 3)
        assert (_standing(http, carol), _standing(http, dave)) == ((1, 0, 64), (0, 1, 0))

        board = http.get(f"{BASE}/credit").json()
        assert NOBODY not in {s["peer_id"] for s in board} and max(s["examples"] for s in board) == 64
        listed = http.get(f"{BASE}/verdicts").json()
        assert len(listed) == 4 and {v["candidate_id"] for v in listed} == {
            c.candidate_id for c in (merged, refused, late_merged, lone)
        }


def test_peers_with_accepted_work_are_served_first_in_a_contended_window(edge: BackgroundEdge) -> None:
    """Made-up identities that ask first in a window take only what the least of each expected peer with
    accepted work leaves: those peers still get their least, however many identities came before."""
    alice, bob = PureSigner(b"\x50" * 32), PureSigner(b"\x51" * 32)
    least = experiment_spec().shards_per_lease
    with httpx.Client(base_url=edge.url) as http:
        genesis = _certify(http, None, (), 0)
        merged = (_upload(http, alice, 1), _upload(http, bob, 2))
        first = _certify(http, genesis, tuple(c.candidate_id for c in merged), 1)
        for candidate in merged:
            assert [_post(http, _verdict(v, candidate, first)).status_code for v in HONEST] == [202, 201]
        assert _standing(http, alice)[0] == _standing(http, bob)[0] == 1
        total = len(http.get("/v1/datasets/mnist/fetch-manifest.json").json()["shards"])
        squatted = 0
        for seed in range(0x60, 0x60 + total):  # more identities than the window has shards
            response = http.post(f"{BASE}/leases", json=proof(PureSigner(bytes([seed]) * 32), "lease"))
            if response.status_code == 409:
                break
            assert response.status_code == 200, response.text
            squatted += len(response.json()["lease"]["shard_ids"])
        granted = [len(grant_lease(http, peer).lease.shard_ids) for peer in (alice, bob)]
    assert squatted == total - 2 * least
    assert granted == [least, least]


def test_a_lease_that_delivers_nothing_costs_its_holder_and_its_address_their_place(edge: BackgroundEdge) -> None:
    """A lease that lapsed undelivered (``server.leasing.Arrears``): its peer, though it has accepted
    work, is served as a newcomer (identities from a clean address take its least), and newcomers
    from the address it was leased from are served after every expected peer, recorded or not."""
    alice, bob, carol = (PureSigner(bytes([seed]) * 32) for seed in (0x52, 0x53, 0x54))
    at = {signer: {"X-Forwarded-For": f"198.51.100.{i}"} for i, signer in enumerate((alice, bob, carol), 1)}
    least = experiment_spec().shards_per_lease
    with httpx.Client(base_url=edge.url) as http:
        total = len(http.get("/v1/datasets/mnist/fetch-manifest.json").json()["shards"])

        def squat(first_seed: int, address: str) -> int:
            """Shards fresh identities from ``address`` take, asking until none is left for them."""
            taken = 0
            for seed in range(first_seed, first_seed + total):
                response = http.post(
                    f"{BASE}/leases",
                    json=proof(PureSigner(bytes([seed]) * 32), "lease"),
                    headers={"X-Forwarded-For": address},
                )
                if response.status_code == 409:
                    return taken
                assert response.status_code == 200, response.text
                taken += len(response.json()["lease"]["shard_ids"])
            raise AssertionError("more identities than shards were granted")

        def lease(signer: PureSigner) -> httpx.Response:
            return http.post(f"{BASE}/leases", json=proof(signer, "lease"), headers=at[signer])

        head = _certify(http, None, (), 0)
        merged = (_upload(http, alice, 1), _upload(http, bob, 2))
        head = _certify(http, head, tuple(c.candidate_id for c in merged), 1)
        for candidate in merged:
            assert [_post(http, _verdict(v, candidate, head)).status_code for v in HONEST] == [202, 201]
        assert lease(alice).status_code == 200  # window 1: alice's lease delivers nothing
        head = _certify(http, head, (), 2)
        for seed, signer in enumerate((alice, bob, carol), 3):  # window 2: all three deliver
            _upload(http, signer, seed, **at[signer])
        head = _certify(http, head, (), 3)
        # window 3: window 1 is behind the window that may still deliver late; alice owes for it
        squatted = squat(0x60, "203.0.113.7")
        refused, granted = lease(alice), grant_lease(http, bob, **at[bob])
        _upload(http, bob, 6, **at[bob])  # on that lease
        head = _certify(http, head, (), 4)
        for seed, signer in enumerate((bob, carol), 7):  # window 4: the expected peers of window 5
            _upload(http, signer, seed, **at[signer])
        head = _certify(http, head, (), 5)
        from_alices = squat(0x90, "198.51.100.1")  # window 5: newcomers from where alice's lease came
        clean = http.post(f"{BASE}/leases", json=proof(PureSigner(b"\xc0" * 32), "lease"),
                          headers={"X-Forwarded-For": "203.0.113.9"})  # fmt: skip
        bobs = grant_lease(http, bob, **at[bob])
    assert squatted == total - least  # only bob's least kept: alice's went to the squatters
    assert refused.status_code == 409 and len(granted.lease.shard_ids) == least
    assert from_alices == total - 2 * least  # bob's and carol's least kept from them
    assert clean.status_code == 200 and len(clean.json()["lease"]["shard_ids"]) == least  # carol's, not bob's
    assert len(bobs.lease.shard_ids) == least


def test_the_settling_rule_is_pure_and_credits_what_the_lease_covers(train_manifest: FetchManifest) -> None:
    """``protocol.credit`` without an edge: the cases the edge test goes through, and the credit's caps."""
    trainer = PureSigner(b"\x31" * 32)
    genesis, _ = _head(None, (), HONEST[0], 0)
    lease = Lease(
        LeaseId("l"), EXPERIMENT, peer_id_from_public_key(trainer.public_key), genesis.head_id, 0,
        train_manifest.dataset_id, tuple(s.shard_id for s in train_manifest.shards[:2]), 0, 1,
    )  # fmt: skip
    candidate = Candidate.for_lease(
        lease, genesis.head_id, b"x", trainer, peer_kind="native", examples=10**6, steps=1, created_at_ms=1
    )
    merging, _ = _head(genesis, (candidate.candidate_id,), HONEST[0], 1)
    other, _ = _head(genesis, (), HONEST[0], 2)
    after, _ = _head(other, (), HONEST[0], 3)
    accept, reject = _verdict(HONEST[0], candidate, merging), _verdict(HONEST[0], candidate, None)
    assert settle(accept, candidate, [merging])[0] is Settled.BORNE_OUT
    assert settle(reject, candidate, [merging])[0] is Settled.CONTRADICTS
    assert settle(reject, candidate, [other])[0] is Settled.PENDING
    assert settle(reject, candidate, [other, after])[0] is Settled.BORNE_OUT
    assert settle(_verdict(HONEST[0], candidate, after), candidate, [other, after])[0] is Settled.CONTRADICTS
    assert settle(replace(reject, peer_id=NOBODY), candidate, [other, after])[0] is Settled.CONTRADICTS
    keys = frozenset(s.public_key for s in (*HONEST, BYZANTINE))
    votes = [_verdict(HONEST[1], candidate, None), _verdict(BYZANTINE, candidate, merging, examples=1e9)]
    assert same_decision(reject, votes, keys) == 2 and same_decision(votes[1], votes, keys) == 1
    assert same_decision(accept, votes, keys) == 1  # the Byzantine vote vouches for other examples
    assert same_decision(accept, [_verdict(HONEST[1], candidate, merging)], keys) == 2
    assert same_decision(_verdict(PureSigner(b"\x32" * 32), candidate, None), [], keys) == 0  # not a validator
    assert counts(reject, Settled.BORNE_OUT, 1, 2) and not counts(accept, Settled.BORNE_OUT, 1, 2)
    assert counts(accept, Settled.BORNE_OUT, 2, 2) and not counts(accept, Settled.CONTRADICTS, 3, 2)
    assert not counts(reject, Settled.PENDING, 1, 2) and counts(reject, Settled.PENDING, 2, 2)
    covered = sum(s.examples for s in train_manifest.shards[:2]) * 3
    assert leased_examples(lease, train_manifest, 3) == covered
    claims = _verdict(HONEST[0], candidate, merging, examples=1e9)
    assert credited_examples(claims, candidate, covered) == covered  # a million declared, capped by the lease
    assert credited_examples(_verdict(HONEST[0], candidate, merging, examples=12.0), candidate, covered) == 12
    assert credited_examples(reject, candidate, covered) == 0


def _flood(http: httpx.Client, parent: HeadDescriptor, count: int) -> list[httpx.Response]:
    """``count`` distinct heads the Byzantine key proposes on ``parent``."""
    seeds = range(100 + 10 * parent.window, 100 + 10 * parent.window + count)
    return [http.post(f"{BASE}/heads", content=_head(parent, (), BYZANTINE, seed)[1]) for seed in seeds]


def _blobs(root: Path) -> int:
    return sum(1 for p in (root / "edge" / "blobs").rglob("*") if p.is_file())


def test_a_validator_keys_proposal_flood_is_refused_past_its_budget_and_honest_heads_go_on(
    edge: BackgroundEdge, tmp_path: Path
) -> None:
    with httpx.Client(base_url=edge.url) as http:
        head = _certify(http, None, (), 0)
        for window in range(3):
            before = _blobs(tmp_path)
            answers = _flood(http, head, 6)
            assert [a.status_code for a in answers] == [202, 202, 429, 429, 429, 429]
            assert "proposed its 2 heads for the window" in answers[-1].json()["detail"]
            assert _blobs(tmp_path) - before == 2  # the refused ones stored nothing
            head = _certify(http, head, (), 1 + window)  # the honest keys' proposals of that window go through
        assert head.window == 3 and head.validator_key == HONEST[0].public_key


def test_a_validator_keys_bytes_per_window_are_bounded(tmp_path: Path, dataset_root: Path) -> None:
    """Outer states a key uploads without ever proposing their heads are charged too (413 past the budget)."""
    _network(tmp_path)
    artifact_bytes = len(encode_tensors(init_params(SPEC, 0)))
    settings = edge_settings(tmp_path, dataset_root, validator_window_bytes=3 * artifact_bytes)
    with BackgroundEdge(settings) as started, httpx.Client(base_url=started.url) as http:
        head = _certify(http, None, (), 0)
        statuses = []
        for i in range(5):
            state = encode_tensors(init_params(SPEC, 200 + i))
            proposed, _ = _head(head, (), BYZANTINE, 300 + i)
            proposed = replace(proposed, outer_state=ContentId(content_id(state))).signed(BYZANTINE)
            answer = http.post(f"{BASE}/outer-states", content=pack_envelope(proposed.to_wire(), state))
            statuses.append(answer.status_code)
        assert statuses == [201, 201, 201, 413, 413]
        assert "exceed its" in answer.json()["detail"]
        assert _certify(http, head, (), 1).window == 1  # the honest keys' budgets are their own
