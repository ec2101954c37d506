"""Edges that follow another edge (``server.follower``) and clients given several edges
(``EdgeClient``, ``protocol.edge_urls``): real uvicorn edges on separate SQLite stores, a 2-of-3
network's signed lineage (``tests.test_lineage``) taken into the upstream by ``dtn lineage import``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from native_peer.edge_client import EdgeClient
from native_peer.network_chain import NetworkChain
from protocol.credit import agree
from protocol.edge_urls import MAX_EDGE_URLS, edge_urls
from protocol.errors import IntegrityError, InvalidMessage, SignatureError
from protocol.ids import ContentId
from protocol.lineage import Lineage, write_archive
from protocol.messages import Attestation, Evaluation, HeadDescriptor
from protocol.network_revisions import NetworkRevision, SignedNetworkRevision
from protocol.run_control import RunControl, RunState, SignedRunControl
from protocol.signing import PureSigner, b64decode
from server.admission import issue_token
from server.follower import Upstream, mirror_once
from server.serve import BackgroundEdge
from server.settings import Settings
from server.state import EdgeState
from server.store import EdgeStore, Store

from .support import EXPERIMENT, edge_settings, head_envelope, proof
from .test_lineage import NETWORK, VALIDATORS, _certified, _dtn, _edge_files, _lineage

T = TypeVar("T")


@pytest.fixture(scope="module")
def lineage() -> Lineage:
    return _lineage(3)


def _upstream(root: Path, dataset_root: Path, lineage: Lineage, *, admission: bool = False) -> BackgroundEdge:
    """A running edge on its own store under ``root`` that holds ``lineage`` (asking for admission)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "lineage.tar").write_bytes(write_archive(lineage))
    _dtn(["lineage", "import", str(root / "lineage.tar"), *_edge_files(root)])
    if admission:
        (root / "network.json").write_text(json.dumps(replace(NETWORK, admission_required=True).to_wire()))
    return BackgroundEdge(edge_settings(root, dataset_root)).start()


def _served(url: str) -> list[HeadDescriptor]:
    answer = httpx.get(f"{url}/v1/experiments/{EXPERIMENT}/heads", timeout=10)
    return [HeadDescriptor.from_wire(h) for h in answer.json()] if answer.status_code == 200 else []


def test_a_following_edge_serves_the_upstreams_lineage_verified_and_continues_its_own(
    lineage: Lineage, tmp_path: Path, dataset_root: Path
) -> None:
    upstream = _upstream(tmp_path / "a", dataset_root, lineage)
    evaluations = [  # measured after their heads were published; one of a head the follower holds already
        Evaluation.of(head, "test", {"accuracy": 0.5 + head.window / 10}, VALIDATORS[head.window], 1)
        for head in lineage.heads[1:]
    ]
    for evaluation in evaluations:
        posted = httpx.post(f"{upstream.url}/v1/experiments/{EXPERIMENT}/evaluations", json=evaluation.to_wire())
        assert posted.status_code == 201, posted.text
    follower_root = tmp_path / "b"
    follower_root.mkdir()
    (follower_root / "start.tar").write_bytes(
        write_archive(replace(lineage, heads=lineage.heads[:2], candidates=(), verdicts=(), votes=()))
    )
    _dtn(["lineage", "import", str(follower_root / "start.tar"), *_edge_files(follower_root)])  # a lineage it continues
    follower = BackgroundEdge(
        edge_settings(follower_root, dataset_root, follow=f"http://127.0.0.1:9,{upstream.url}")
    ).start()
    try:
        deadline = time.monotonic() + 30
        while len(_served(follower.url)) < len(lineage.heads) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # verdicts are mirrored after the heads
        with httpx.Client(base_url=follower.url, timeout=10) as http:
            served = _served(follower.url)
            artifacts = [http.get(f"/v1/artifacts/{h.head_id}").content for h in lineage.heads[2:]]
            candidates = http.get(f"/v1/experiments/{EXPERIMENT}/candidates").json()
            edge_keys = {httpx.get(f"{url}/v1/network").json()["edge_key"] for url in (upstream.url, follower.url)}
            mirrored = [Evaluation.from_wire(e) for e in http.get(f"/v1/experiments/{EXPERIMENT}/evaluations").json()]
    finally:
        follower.stop()
        upstream.stop()
    assert served == list(lineage.heads)  # certificates included; none lost, one genesis
    assert artifacts == [lineage.blobs[h.head_id] for h in lineage.heads[2:]]
    assert {c["candidate_id"] for c in candidates} == {c.candidate_id for c in lineage.candidates}
    assert mirrored == evaluations
    store = Store(follower_root / "edge" / "edge.sqlite3")
    try:  # the upstream lists one validator's verdict and keeps the votes that made it count: counted here too
        held = [store.votes(EXPERIMENT, ContentId(v.candidate_id)) for v in lineage.verdicts]
        counted = [store.counted_verdict(EXPERIMENT, ContentId(v.candidate_id)) for v in lineage.verdicts]
    finally:
        store.close()
    assert held == [[vote for vote in lineage.votes if vote.candidate_id == v.candidate_id] for v in lineage.verdicts]
    assert all(c is not None and agree(c, v) for c, v in zip(counted, lineage.verdicts, strict=True))
    assert len(edge_keys) == 2  # two stores, two edge keys: one network


def _served_after(root: Path, dataset_root: Path) -> list[HeadDescriptor]:
    """The heads the edge of ``root`` serves when started again on its store (what it wrote)."""
    with BackgroundEdge(edge_settings(root, dataset_root)) as edge:
        return _served(edge.url)


def _heads(store: EdgeStore) -> list[HeadDescriptor]:
    return store.heads(EXPERIMENT)


def _mirrored(
    root: Path, dataset_root: Path, upstream_url: str, read: Callable[[EdgeStore], T] = _heads, token: str | None = None
) -> T:
    """One ``mirror_once`` of a fresh edge state under ``root`` from ``upstream_url`` (shown ``token``);
    what ``read`` finds in its store after (default: the heads it holds; the error of the mirror is raised)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "network.json").write_text(json.dumps(NETWORK.to_wire()))

    async def run() -> T:
        state = EdgeState.open(edge_settings(root, dataset_root))
        await state.start()
        try:
            async with httpx.AsyncClient(timeout=10) as http:
                try:
                    await mirror_once(state, Upstream(http, upstream_url, 1 << 24, token))
                finally:
                    held = read(state.store)
            return held
        finally:
            await state.close()

    return asyncio.run(run())


def test_a_follower_counts_a_verdict_from_the_votes_that_made_it_count_upstream(
    lineage: Lineage, tmp_path: Path, dataset_root: Path
) -> None:
    """On a 2-of-3 network the upstream counts an acceptance once two validators signed it and keeps
    their votes; a follower given the verdict that counts holds it as one validator's vote, then counts
    it from the upstream's other vote, as the upstream did."""
    upstream = _upstream(tmp_path / "a", dataset_root, replace(lineage, verdicts=(), votes=()))
    try:
        for verdict in lineage.verdicts:
            second = replace(verdict, validator_key=VALIDATORS[1].public_key).signed(VALIDATORS[1])
            for vote, status in ((verdict, 202), (second, 201)):  # held, then counted
                posted = httpx.post(f"{upstream.url}/v1/experiments/{EXPERIMENT}/verdicts", json=vote.to_wire())
                assert posted.status_code == status, posted.text
            votes = httpx.get(f"{upstream.url}/v1/experiments/{EXPERIMENT}/verdicts/{verdict.candidate_id}/votes")
            assert votes.json() == [verdict.to_wire(), second.to_wire()]

        def counted(store: EdgeStore) -> list[bool]:
            return [store.counted_verdict(EXPERIMENT, v.candidate_id) is not None for v in lineage.verdicts]

        assert _mirrored(tmp_path / "b", dataset_root, upstream.url, counted) == [True] * len(lineage.verdicts)
    finally:
        upstream.stop()


def test_a_follower_reads_an_admission_upstreams_candidates_with_a_mirror_token(
    lineage: Lineage, tmp_path: Path, dataset_root: Path
) -> None:
    """Behind admission only validators' and mirrors' tokens list candidates: a follower without one
    mirrors the heads and none of the candidates (so none of their verdicts), with a ``mirror`` token
    the whole lineage; that token reads candidates and nothing else (it joins no relay)."""
    upstream = _upstream(tmp_path / "a", dataset_root, lineage, admission=True)
    try:
        store = Store(tmp_path / "a" / "edge" / "edge.sqlite3")
        try:
            token = issue_token(store, "mirror", "the second operator's edge", 3600)
        finally:
            store.close()

        def held(store: EdgeStore) -> tuple[int, int, int]:
            counted = sum(store.counted_verdict(EXPERIMENT, v.candidate_id) is not None for v in lineage.verdicts)
            return len(store.heads(EXPERIMENT)), len(list(store.candidates_since(EXPERIMENT, 0, 100))), counted

        whole = (len(lineage.heads), len(lineage.candidates), len(lineage.verdicts))
        assert _mirrored(tmp_path / "b", dataset_root, upstream.url, held) == (len(lineage.heads), 0, 0)
        assert _mirrored(tmp_path / "c", dataset_root, upstream.url, held, token) == whole
        with connect(upstream.url.replace("http", "ws") + "/v1/relay", open_timeout=5) as ws:
            challenge = json.loads(ws.recv(timeout=5))
            signer = PureSigner(b"\x51" * 32)
            ws.send(json.dumps({"type": "join", "proof": proof(signer, "join", challenge["nonce"]), "token": token}))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
        assert closed.value.rcvd is not None and "may not" in closed.value.rcvd.reason
    finally:
        upstream.stop()


def test_a_follow_tokens_file_is_read_line_by_line_and_a_bad_line_is_named_not_shown(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# the edges this one follows\nhttps://a.example/ dtn_abcdefghijklmnopqrstuvwx\n\n")
    assert Settings(follow_tokens_file=str(tokens)).follow_tokens == {
        "https://a.example": "dtn_abcdefghijklmnopqrstuvwx"
    }
    tokens.write_text("https://a.example dtn_abcdefghijklmnopqrstuvwx extra\n")
    with pytest.raises(ValueError, match="line 1") as refused:
        Settings(follow_tokens_file=str(tokens))
    assert "dtn_abc" not in str(refused.value)
    with pytest.raises(ValueError, match="cannot be read"):
        Settings(follow_tokens_file=str(tmp_path / "missing"))


def test_a_follower_refuses_an_upstream_whose_heads_other_validators_signed(
    lineage: Lineage, tmp_path: Path, dataset_root: Path
) -> None:
    outsiders = [PureSigner(bytes([i]) * 32) for i in (0x41, 0x42, 0x43)]
    foreign = replace(NETWORK, validator_keys=tuple(v.public_key for v in outsiders))
    root = tmp_path / "foreign"
    root.mkdir()
    (root / "network.json").write_text(json.dumps(foreign.to_wire()))
    (root / "lineage.tar").write_bytes(write_archive(_signed_by(lineage, outsiders)))
    _dtn(
        [
            "lineage",
            "import",
            str(root / "lineage.tar"),
            "--data-dir",
            str(root / "edge"),
            "--network",
            str(root / "network.json"),
        ]
    )
    with BackgroundEdge(edge_settings(root, dataset_root)) as upstream:
        assert len(_served(upstream.url)) == len(lineage.heads)  # it serves them, signed by its own validators
        with pytest.raises(SignatureError):
            _mirrored(tmp_path / "b", dataset_root, upstream.url)
    assert _served_after(tmp_path / "b", dataset_root) == []  # nothing of it was written


def _signed_by(lineage: Lineage, signers: list[PureSigner]) -> Lineage:
    """``lineage``'s heads proposed and certified by ``signers`` instead (no candidates, verdicts)."""
    heads = tuple(
        _certified(
            replace(h, validator_key=signers[i % 3].public_key, certificate=()), signers[i % 3], signers[(i + 1) % 3]
        )
        for i, h in enumerate(lineage.heads)
    )
    return replace(lineage, heads=heads, candidates=(), verdicts=(), votes=())


def test_a_follower_refuses_an_upstream_serving_other_bytes_for_a_head(
    lineage: Lineage, tmp_path: Path, dataset_root: Path
) -> None:
    upstream = _upstream(tmp_path / "a", dataset_root, lineage)
    try:
        path = tmp_path / "a" / "edge" / "blobs" / "sha256"
        target = path / lineage.heads[1].head_id.removeprefix("sha256:")[:2] / lineage.heads[1].head_id[9:]
        data = bytearray(target.read_bytes())
        data[-1] ^= 1
        target.write_bytes(bytes(data))  # the upstream's disk is tampered with
        with pytest.raises(IntegrityError):
            _mirrored(tmp_path / "b", dataset_root, upstream.url)
    finally:
        upstream.stop()
    assert _served_after(tmp_path / "b", dataset_root) == []


def test_a_follower_takes_the_upstreams_run_control_orders_in_sequence_once(
    lineage: Lineage, tmp_path: Path, dataset_root: Path
) -> None:
    """An experiment paused and rolled back upstream is paused here too, with the same orders (the
    rollback to a head the same round mirrored); a second round takes nothing twice."""
    a, b, c = VALIDATORS
    orders = [
        SignedRunControl.of(RunControl(NETWORK.network_id, EXPERIMENT, "pause", 1, 1_000), [a, b]),
        SignedRunControl.of(
            RunControl(NETWORK.network_id, EXPERIMENT, "rollback", 2, 2_000, lineage.heads[1].head_id), [b, c]
        ),
    ]
    root = tmp_path / "b"
    root.mkdir()
    (root / "network.json").write_text(json.dumps(NETWORK.to_wire()))

    async def follow_twice(url: str) -> tuple[RunState, list[SignedRunControl]]:
        state = EdgeState.open(edge_settings(root, dataset_root))
        await state.start()
        try:
            async with httpx.AsyncClient(timeout=10) as http:
                for _ in range(2):
                    await mirror_once(state, Upstream(http, url, 1 << 24))
            return state.store.run_state(EXPERIMENT), [signed for signed, _ in state.store.run_orders(EXPERIMENT)]
        finally:
            await state.close()

    upstream = _upstream(tmp_path / "a", dataset_root, lineage)
    try:
        for signed in orders:
            posted = httpx.post(f"{upstream.url}/v1/experiments/{EXPERIMENT}/control", json=signed.to_wire())
            assert posted.status_code == 201, posted.text
        run_state, taken = asyncio.run(follow_twice(upstream.url))
    finally:
        upstream.stop()
    assert run_state == RunState(sequence=2, paused=True)
    assert taken == orders


def test_a_client_given_several_edges_moves_to_the_next_only_when_one_is_unreachable(
    tmp_path: Path, dataset_root: Path
) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "network.json").write_text(json.dumps(NETWORK.to_wire()))
    first = BackgroundEdge(edge_settings(tmp_path / "a", dataset_root)).start()
    second = BackgroundEdge(edge_settings(tmp_path / "b", dataset_root)).start()
    dead = "http://127.0.0.1:9"
    client = EdgeClient([dead, f"{first.url},{second.url}"], retries=1)
    try:
        keys = {}
        for edge in (first, second):
            keys[edge.url] = httpx.get(f"{edge.url}/v1/network").json()["edge_key"]
        assert client.network().edge_key is not None and client.url == first.url and client.failovers == 1
        assert client.current_head(EXPERIMENT) is None  # a 404 is an answer: no move
        assert client.url == first.url and client.failovers == 1
        first.stop()
        served = client.network()
        assert client.url == second.url and client.failovers == 2
        followed = NetworkChain(replace(served, edge_key=None)).read(client)  # another edge, another key
        assert followed is not None and followed.edge_key == b64decode(keys[second.url], size=32)
        second.stop()
        with pytest.raises(httpx.TransportError):
            client.network()  # every edge tried once: the last one's failure
        assert client.failovers == 4 and client.url == first.url
    finally:
        client.close()
        first.stop()
        second.stop()
    assert keys[first.url] != keys[second.url]


def test_edge_url_lists_are_read_in_order_once_and_hostile_ones_are_refused() -> None:
    assert edge_urls(["https://a.example/", "https://b.example,https://a.example", " "]) == [
        "https://a.example",
        "https://b.example",
    ]
    assert edge_urls("") == []
    for hostile in ("javascript:alert(1)", "https://a.example?x=1", "ftp://a.example", "https://" + "a" * 300):
        with pytest.raises(InvalidMessage):
            edge_urls(hostile)
    with pytest.raises(InvalidMessage):
        edge_urls([f"https://e{i}.example" for i in range(MAX_EDGE_URLS + 1)])
    with pytest.raises(InvalidMessage):
        edge_urls([1, 2])  # type: ignore[list-item]


def test_the_welcome_tells_a_page_about_the_other_edges(tmp_path: Path, dataset_root: Path) -> None:
    (tmp_path / "network.json").write_text(json.dumps(NETWORK.to_wire()))
    mirrors = "https://b.example,https://c.example:8443"
    signer = PureSigner(b"\x31" * 32)
    with (
        BackgroundEdge(edge_settings(tmp_path, dataset_root, mirrors=mirrors)) as edge,
        connect(edge.url.replace("http", "ws", 1) + "/v1/relay") as ws,
    ):
        challenge = json.loads(ws.recv(timeout=5))
        ws.send(json.dumps({"type": "join", "proof": proof(signer, "join", challenge["nonce"], "browser")}))
        welcome = json.loads(ws.recv(timeout=5))
    assert welcome["mirrors"] == ["https://b.example", "https://c.example:8443"]
    assert edge_urls(welcome["mirrors"]) == welcome["mirrors"]  # what the browser peer reads of it


def test_a_follower_takes_the_upstreams_revisions_and_the_lineage_across_a_change_of_validators(
    lineage: Lineage, tmp_path: Path, dataset_root: Path
) -> None:
    """Upstream, the experiment was paused and its third validator replaced at window 2, then a head was
    made by the new quorum: a fresh follower takes the revision (checked as a chain), every head (the
    first three checked against the old validators, the last against the new) and the order, in one
    round."""
    a, b, c = VALIDATORS
    d = PureSigner(b"\x24" * 32)
    upstream = _upstream(tmp_path / "a", dataset_root, lineage)
    try:
        pause = SignedRunControl.of(RunControl(NETWORK.network_id, EXPERIMENT, "pause", 1, 1_000), [a, b])
        assert (
            httpx.post(f"{upstream.url}/v1/experiments/{EXPERIMENT}/control", json=pause.to_wire()).status_code == 201
        )
        keys = (a.public_key, b.public_key, d.public_key)
        change = NetworkRevision.of(
            NETWORK, 2_000, validator_keys=keys, heads={EXPERIMENT: lineage.heads[-1]}, orders={EXPERIMENT: 1}
        )
        signed = SignedNetworkRevision.of(change, [b, c])
        assert httpx.post(f"{upstream.url}/v1/network/revisions", json=signed.to_wire()).status_code == 201
        head, body = head_envelope(parent=lineage.heads[-1].head_id, window=3, signer=a)
        assert httpx.post(f"{upstream.url}/v1/experiments/{EXPERIMENT}/heads", content=body).status_code == 202
        attestation = Attestation.of(head, (), d, 3_000).to_wire()
        assert (
            httpx.post(f"{upstream.url}/v1/experiments/{EXPERIMENT}/attestations", json=attestation).status_code == 201
        )

        def taken(store: EdgeStore) -> tuple[list[HeadDescriptor], list[int], RunState]:
            revisions = [s.revision.number for s, _ in store.network_revisions()]
            return store.heads(EXPERIMENT), revisions, store.run_state(EXPERIMENT)

        heads, revisions, run_state = _mirrored(tmp_path / "b", dataset_root, upstream.url, taken)
    finally:
        upstream.stop()
    assert [h.head_id for h in heads] == [*(h.head_id for h in lineage.heads), head.head_id]
    assert revisions == [1] and run_state == RunState(sequence=1, paused=True)
