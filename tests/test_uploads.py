"""Staged uploads (``protocol.uploads``, ``server.uploads``) against a real edge: artifacts larger than
one chunk staged across broken connections, then published by envelopes without their bytes and
checked like any upload; the refusals; the budgets and expiry a hostile client meets; native
trainers and validators whose candidates, heads and outer states all go this way."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from lab.demo import CHROMIUM, CHROMIUM_FLAGS, browser_accepted, browser_problem
from lab.stack import Fleet, free_port, prepare_network
from native_peer import StorageConfig, Validator
from native_peer.edge_client import EdgeClient
from native_peer.identity import NodeIdentity
from native_peer.mnist import mlp_learner
from protocol.envelope import pack_envelope, unpack_envelope
from protocol.errors import IntegrityError
from protocol.hashing import content_id
from protocol.ids import ContentId, HeadId
from protocol.messages import Candidate
from protocol.signing import PureSigner
from protocol.uploads import OFFSET_HEADER, UPLOAD_HEADER, content_range, upload_path
from server.serve import BackgroundEdge
from tools.networks import BASELINE, mnist_network

from .support import (
    EXPERIMENT,
    candidate_envelope,
    edge_settings,
    grant_lease,
    head_envelope,
    metric,
    missing,
    mnist_trainer,
    now_ms,
    validator_reads,
    write_network,
)

CHUNK = 64 * 1024
BASE = f"/v1/experiments/{EXPERIMENT}"
TRAINER = PureSigner(b"\x21" * 32)


@contextmanager
def _edge(tmp_path: Path, dataset_root: Path, **settings: Any) -> Iterator[tuple[BackgroundEdge, httpx.Client]]:
    """An edge taking chunks of at most ``CHUNK`` bytes, with its genesis head, and a client of it."""
    write_network(tmp_path / "network.json")
    configured = edge_settings(tmp_path, dataset_root, upload_chunk_bytes=CHUNK, **settings)
    with BackgroundEdge(configured) as edge, httpx.Client(base_url=edge.url, timeout=10) as http:
        assert http.post(f"{BASE}/heads", content=head_envelope()[1]).status_code == 201
        yield edge, http


def _artifact(seed: int) -> bytes:
    """A candidate artifact of the experiment's model (about 400 kB: several chunks)."""
    return unpack_envelope(candidate_envelope(TRAINER, HeadId(content_id(b"base")), seed=seed)[1])[1]


def _put(http: httpx.Client, data: bytes, start: int, end: int, cid: str | None = None) -> httpx.Response:
    path = upload_path(EXPERIMENT, ContentId(cid or content_id(data)))
    return http.put(path, content=data[start:end], headers={"content-range": content_range(start, end, len(data))})


def _stage(http: httpx.Client, data: bytes, start: int = 0, cid: str | None = None) -> httpx.Response:
    """Every chunk of ``data`` from ``start`` on; the last answer."""
    for offset in range(start, len(data), CHUNK):
        response = _put(http, data, offset, min(offset + CHUNK, len(data)), cid)
        assert response.status_code == 200, response.text
    return response


def _held(http: httpx.Client, data: bytes) -> dict[str, Any]:
    answer: dict[str, Any] = http.get(upload_path(EXPERIMENT, content_id(data))).json()
    return answer


def _raw(url: str, request: bytes) -> bytes:
    """Send ``request`` on a connection of its own, close our side, and return what came back."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as conn:
        conn.sendall(request)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def _chunk_head(data: bytes, start: int, end: int, *, total: int | None = None) -> bytes:
    total = len(data) if total is None else total
    return (
        f"PUT {upload_path(EXPERIMENT, content_id(data))} HTTP/1.1\r\nhost: edge\r\n"
        f"content-range: {content_range(start, end, total)}\r\ncontent-length: {end - start}\r\n\r\n"
    ).encode()


def _staged_files(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "edge" / "uploads").iterdir())


def test_a_large_candidate_is_staged_across_a_broken_connection_then_published_without_its_bytes(
    tmp_path: Path, dataset_root: Path
) -> None:
    with _edge(tmp_path, dataset_root) as (edge, http):
        lease = grant_lease(http, TRAINER).lease
        artifact = _artifact(seed=3)
        assert len(artifact) > 5 * CHUNK
        candidate = Candidate.for_lease(lease, lease.base_head, artifact, TRAINER, peer_kind="native", examples=64, steps=1,
                                        created_at_ms=now_ms())  # fmt: skip
        assert _held(http, artifact) == {"offset": 0, "total": None, "complete": False, "chunk_bytes": CHUNK}
        for offset in range(0, 2 * CHUNK, CHUNK):
            assert _put(http, artifact, offset, offset + CHUNK).json()["offset"] == offset + CHUNK
        # the third chunk breaks off halfway: the connection closes with half its body sent
        _raw(edge.url, _chunk_head(artifact, 2 * CHUNK, 3 * CHUNK) + artifact[2 * CHUNK : 2 * CHUNK + CHUNK // 2])
        held = http.get(upload_path(EXPERIMENT, candidate.candidate_id))
        assert held.json()["offset"] == 2 * CHUNK and held.headers[OFFSET_HEADER] == str(2 * CHUNK)
        assert http.head(upload_path(EXPERIMENT, candidate.candidate_id)).headers[OFFSET_HEADER] == str(2 * CHUNK)

        done = _stage(http, artifact, start=2 * CHUNK)  # resumed where the edge says
        assert done.json() == {"offset": len(artifact), "total": len(artifact), "complete": True, "chunk_bytes": CHUNK}
        artifact_path = f"/v1/artifacts/{candidate.candidate_id}"
        assert http.get(artifact_path, headers=validator_reads(artifact_path)).status_code == 404  # staged: nobody's
        before = metric(http, "dtn_staged_upload_bytes")
        assert before == len(artifact)

        published = http.post(f"{BASE}/candidates", content=pack_envelope(candidate.to_wire(), b""))
        assert published.status_code == 201, published.text
        served = http.get(artifact_path, headers=validator_reads(artifact_path))
        assert served.status_code == 200 and served.content == artifact
        assert not _staged_files(tmp_path) and metric(http, "dtn_staged_upload_bytes") == 0
        assert _held(http, artifact)["offset"] == 0
        again = http.post(f"{BASE}/candidates", content=pack_envelope(candidate.to_wire(), b""))
        assert again.status_code == 200  # a retry whose answer was lost: stored already, no stage needed


def test_chunks_out_of_order_over_the_limits_or_unpublished_are_refused(tmp_path: Path, dataset_root: Path) -> None:
    with _edge(tmp_path, dataset_root) as (edge, http):
        artifact = _artifact(seed=4)
        ahead = _put(http, artifact, CHUNK, 2 * CHUNK)
        assert (ahead.status_code, ahead.headers[OFFSET_HEADER]) == (409, "0")
        assert _put(http, artifact, 0, CHUNK).status_code == 200
        for start, end in ((0, CHUNK), (CHUNK // 2, CHUNK + CHUNK // 2), (2 * CHUNK, 3 * CHUNK)):
            refused = _put(http, artifact, start, end)  # again, overlapping, past the end
            assert (refused.status_code, refused.json()["error"]) == (409, "Conflict"), refused.text
            assert refused.headers[OFFSET_HEADER] == str(CHUNK) and f"from byte {CHUNK}" in refused.json()["detail"]
        assert _put(http, artifact, CHUNK, 3 * CHUNK + 1).status_code == 413  # a chunk over the limit
        assert _held(http, artifact)["offset"] == CHUNK

        real = _artifact(seed=11)
        forged = real[:-1] + bytes([real[-1] ^ 1])  # its last byte is not the artifact's
        answers = [_put(http, forged, offset, min(offset + CHUNK, len(forged)), cid=content_id(real))
                   for offset in range(0, len(forged), CHUNK)]  # fmt: skip
        assert [a.status_code for a in answers[:-1]] == [200] * (len(answers) - 1)
        assert (answers[-1].status_code, answers[-1].json()["error"]) == (422, "IntegrityError")
        assert "discarded" in answers[-1].json()["detail"] and _held(http, real)["offset"] == 0
        assert len(_staged_files(tmp_path)) == 1  # the other upload's, not the forged one

        # an artifact over the experiment's limit is refused on its headers, before any body is sent
        over = _raw(edge.url, _chunk_head(_artifact(seed=5), 0, CHUNK, total=10_000_000))
        assert over.startswith(b"HTTP/1.1 413") and b"at most" in over

        bad = http.put(upload_path(EXPERIMENT, content_id(artifact)), content=b"x", headers={"content-range": "0-1"})
        assert bad.status_code == 400 and "Content-Range" in bad.json()["detail"]
        short = http.put(upload_path(EXPERIMENT, content_id(artifact)), content=b"x" * 10,
                         headers={"content-range": content_range(CHUNK, CHUNK + 20, len(artifact))})  # fmt: skip
        assert short.status_code == 400 and "the body has 10" in short.json()["detail"]

        lease = grant_lease(http, TRAINER).lease
        candidate = Candidate.for_lease(lease, lease.base_head, artifact, TRAINER, peer_kind="native", examples=64, steps=1,
                                        created_at_ms=now_ms())  # fmt: skip
        partial = http.post(f"{BASE}/candidates", content=pack_envelope(candidate.to_wire(), b""))
        assert partial.status_code == 409 and f"holds {CHUNK} of" in partial.json()["detail"]
        other = Candidate.for_lease(lease, lease.base_head, _artifact(seed=6), TRAINER, peer_kind="native", examples=64, steps=1,
                                    created_at_ms=now_ms())  # fmt: skip
        unstaged = http.post(f"{BASE}/candidates", content=pack_envelope(other.to_wire(), b""))
        assert unstaged.status_code == 404 and "staged" in unstaged.json()["detail"]


def test_partial_uploads_expire_when_left_alone(tmp_path: Path, dataset_root: Path) -> None:
    with _edge(tmp_path, dataset_root, upload_idle_s=0.5) as (_, http):
        artifact = _artifact(seed=7)
        assert _put(http, artifact, 0, CHUNK).status_code == 200
        time.sleep(0.2)
        assert _put(http, artifact, CHUNK, 2 * CHUNK).status_code == 200  # touched: kept
        time.sleep(0.4)
        assert _held(http, artifact)["offset"] == 2 * CHUNK
        time.sleep(0.7)
        assert _held(http, artifact) == {"offset": 0, "total": None, "complete": False, "chunk_bytes": CHUNK}
        assert not _staged_files(tmp_path)
        assert _put(http, artifact, 2 * CHUNK, 3 * CHUNK).status_code == 409  # start again from 0


def test_staged_bytes_are_bounded_per_client_address_and_per_edge(tmp_path: Path, dataset_root: Path) -> None:
    first, second, third = (_artifact(seed) for seed in (8, 9, 10))
    budget = {"upload_address_bytes": len(first) + CHUNK, "upload_stage_bytes": 2 * len(first) + CHUNK}
    with _edge(tmp_path, dataset_root, **budget) as (edge, http):
        assert _put(http, first, 0, CHUNK).status_code == 200  # counts its whole size from its first chunk
        refused = _put(http, second, 0, CHUNK)
        assert (refused.status_code, refused.json()["error"]) == (507, "QuotaExceeded")
        assert refused.json()["detail"].startswith("127.0.0.1 holds")
        elsewhere = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=edge.url, transport=elsewhere) as other:
            assert _put(other, second, 0, CHUNK).status_code == 200
        with httpx.Client(base_url=edge.url, transport=httpx.HTTPTransport(local_address="127.0.0.3")) as third_client:
            full = _put(third_client, third, 0, CHUNK)
            assert full.status_code == 507 and "staging space is full" in full.json()["detail"]
        assert metric(http, "dtn_staged_upload_bytes") == len(first) + len(second)
        assert metric(http, "dtn_rejected_uploads_total", error="QuotaExceeded") == 2


def test_a_reservation_is_paid_for_in_bytes_sent_a_stalled_stage_gives_way(tmp_path: Path, dataset_root: Path) -> None:
    """Room for two stages. A stalled one (one chunk, then nothing) and one that keeps sending hold it;
    a third client is refused while both are within their grace, then admitted in the stalled one's
    place, whose client finds no stage; the one that kept its pace keeps its bytes."""
    stalled, paced, third = (_artifact(seed) for seed in (11, 12, 13))
    rate = 100 * 1024  # bytes a second a stage must keep past its grace
    budget = {"upload_stage_bytes": 2 * len(stalled) + CHUNK, "upload_address_bytes": 4 * len(stalled)}
    with _edge(tmp_path, dataset_root, upload_grace_s=1.0, upload_min_bytes_per_s=rate, **budget) as (edge, _):
        clients = [
            httpx.Client(base_url=edge.url, transport=httpx.HTTPTransport(local_address=f"127.0.0.{i}"))
            for i in (2, 3, 4)
        ]
        try:
            opened = time.monotonic()
            assert _put(clients[0], stalled, 0, CHUNK).status_code == 200
            assert _put(clients[1], paced, 0, CHUNK).status_code == 200
            assert _put(clients[2], third, 0, CHUNK).status_code == 507  # both within their grace
            for offset in range(CHUNK, len(paced), CHUNK):  # about 250 kB/s, above the pace asked for
                time.sleep(0.25)
                assert _put(clients[1], paced, offset, min(offset + CHUNK, len(paced))).status_code == 200
            time.sleep(max(0.0, opened + 2.2 - time.monotonic()))  # the stalled one is 56 kB behind by now
            assert _put(clients[2], third, 0, CHUNK).status_code == 200
            assert _put(clients[0], stalled, CHUNK, 2 * CHUNK).status_code == 409  # it starts again from 0
            assert _held(clients[1], paced)["offset"] == len(paced)
        finally:
            for client in clients:
                client.close()


class _Network(httpx.HTTPTransport):
    """Records the artifacts staged through it; a ``flaky`` one breaks staged uploads as a bad network
    does: the first chunk never arrives, the answer to the next one is lost after the edge took it."""

    def __init__(self, flaky: bool) -> None:
        super().__init__()
        self.flaky, self.puts, self.staged = flaky, 0, set[str]()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            self.puts += 1
            self.staged.add(request.url.path.rsplit("/", 1)[-1])
            if not self.flaky:
                return super().handle_request(request)
            if self.puts == 1:
                raise httpx.WriteError("connection reset", request=request)
            if self.puts == 2:
                super().handle_request(request).close()
                raise httpx.ReadError("connection reset", request=request)
        return super().handle_request(request)


class _LatePublish(httpx.HTTPTransport):
    """Records each request's method and ``UPLOAD_HEADER``; holds the first publish back until the edge
    has dropped its stage, as when a publish reaches another edge than its chunks (theirs went away)."""

    def __init__(self, idle_s: float) -> None:
        super().__init__()
        self.idle_s, self.sent = idle_s, list[tuple[str, str | None]]()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.method, request.headers.get(UPLOAD_HEADER)))
        if request.method == "POST" and [m for m, _ in self.sent].count("POST") == 1:
            time.sleep(2 * self.idle_s)
        return super().handle_request(request)


def test_every_request_of_a_stage_names_it_and_a_publish_that_finds_no_stage_stages_again(
    tmp_path: Path, dataset_root: Path
) -> None:
    with _edge(tmp_path, dataset_root, upload_idle_s=1.0) as (edge, http):
        lease = grant_lease(http, TRAINER).lease
        artifact = _artifact(seed=12)
        candidate = Candidate.for_lease(lease, lease.base_head, artifact, TRAINER, peer_kind="native", examples=64, steps=1,
                                        created_at_ms=now_ms())  # fmt: skip
        late = _LatePublish(idle_s=1.0)
        client = EdgeClient(edge.url, chunk_bytes=CHUNK)
        client._http.close()
        client._clients[0] = httpx.Client(base_url=edge.url, transport=late)  # below the client
        client.publish_candidate(EXPERIMENT, pack_envelope(candidate.to_wire(), artifact))
        client.close()
        path = f"/v1/artifacts/{candidate.candidate_id}"
        assert http.get(path, headers=validator_reads(path)).content == artifact
        assert metric(http, "dtn_rejected_uploads_total", error="NotFound") == 1  # the first publish
    chunks = -(-len(artifact) // CHUNK)
    assert late.sent.count(("PUT", candidate.candidate_id)) == 2 * chunks  # staged again from 0
    assert [method for method, _ in late.sent].count("POST") == 2
    assert {named for _, named in late.sent} == {candidate.candidate_id}  # every request names the stage


def test_native_trainers_and_validators_stage_candidates_heads_and_outer_states(
    tmp_path: Path, dataset_root: Path
) -> None:
    identity = NodeIdentity.load_or_create(tmp_path / "validator" / "identity.key")
    network = mnist_network(identity.public_key)
    nesterov = replace(network.experiment(BASELINE), outer_optimizer="nesterov")
    network = replace(network, experiments=(nesterov,))
    (tmp_path / "network.json").write_text(json.dumps(network.to_wire()))
    with BackgroundEdge(edge_settings(tmp_path, dataset_root, upload_chunk_bytes=CHUNK)) as edge:
        validator = Validator(mlp_learner(), network, StorageConfig(tmp_path / "validator"), edge.url, dataset_root)
        trainer = mnist_trainer(network, tmp_path / "trainer", edge.url)
        flaky, steady = _Network(flaky=True), _Network(flaky=False)
        for client, network in ((trainer.edge, flaky), (validator.edge, steady)):
            client._http.close()
            client._clients[0] = httpx.Client(base_url=edge.url, transport=network)  # below the client
            client._chunk_bytes = CHUNK  # every artifact of this model is over it: all are staged
        genesis = validator.ensure_genesis(nesterov)
        outcome = trainer.train_window_once(trainer.experiment(*BASELINE.parts))
        candidate = httpx.get(f"{edge.url}/v1/artifacts/{outcome.candidate_id}",
                              headers=validator_reads(f"/v1/artifacts/{outcome.candidate_id}", identity))  # fmt: skip
        assert candidate.status_code == 200, candidate.text
        chunks = -(-len(candidate.content) // CHUNK)
        assert chunks > 1 and flaky.puts == chunks + 2  # every chunk, once more the lost one, and its 409
        report = validator.poll(nesterov)
        assert report is not None and report.head.merged == (outcome.candidate_id,), [
            str(v.reason) for v in report.verdicts
        ]
        assert report.head.parent == genesis.head_id and report.head.outer_state is not None
        assert flaky.staged == {outcome.candidate_id}
        assert steady.staged == {genesis.head_id, report.head.head_id, report.head.outer_state}
        for cid in (genesis.head_id, report.head.head_id, report.head.outer_state, outcome.candidate_id):
            served = httpx.get(f"{edge.url}/v1/artifacts/{cid}")  # the window is judged: public
            assert served.status_code == 200 and content_id(served.content) == cid
        assert not _staged_files(tmp_path)  # each stage deleted once published
        trainer.close()
        validator.close()


@pytest.mark.slow
def test_a_tab_in_chromium_stages_its_candidate_when_it_is_over_the_relays_frame_limit(
    tmp_path: Path, dataset_root: Path
) -> None:
    """The ``pyfetch`` path (``browser_peer.js_bridge``): with a frame limit below the candidate, a tab's
    candidate can reach the edge only staged over HTTP; the validator accepts it."""
    if (problem := browser_problem()) is not None:
        missing(problem)
    local = prepare_network(tmp_path, datasets=dataset_root)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with Fleet(tmp_path) as fleet:
        # every candidate artifact kept (retention 0): the accepted one is read back after more windows passed
        flags = ("--max-frame-bytes", "65536", "--upload-chunk-bytes", "32768", "--candidate-retention-windows", "0")
        fleet.start_edge_and_validator(local, port, *flags)
        page = f"{url}/?contribute=1&experiment={BASELINE}"
        fleet.start("browser", [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}", page])
        edge = EdgeClient(url)
        deadline = time.monotonic() + 240
        while browser_accepted(edge, BASELINE) < 1:
            fleet.check_alive()
            assert time.monotonic() < deadline, "no candidate of the tab accepted in 240 s"
            time.sleep(2)
        metrics = httpx.get(f"{url}/metrics").text
        browsers = {p["peer_id"] for p in edge.peers()["known"] if p["kind"] == "browser"}
        accepted = next(v.candidate_id for v in edge.verdicts(BASELINE) if v.accepted and v.peer_id in browsers)
        artifact = httpx.get(f"{url}/v1/artifacts/{accepted}")  # judged: public
        edge.close()
    assert artifact.status_code == 200, artifact.text
    assert len(artifact.content) > 65536  # no frame could have carried it
    assert 'dtn_candidates_total{via="http"}' in metrics  # staged, then published over HTTP, not the relay
    assert 'dtn_ws_closes_total{code="1009"}' not in metrics  # never a frame over the limit


class _Cut(httpx.SyncByteStream):
    """A body that breaks after ``after`` bytes, as a dropped connection does."""

    def __init__(self, stream: httpx.SyncByteStream, after: int) -> None:
        self.stream, self.after = stream, after

    def __iter__(self) -> Iterator[bytes]:
        sent = 0
        for chunk in self.stream:
            yield chunk[: self.after - sent]
            sent += len(chunk[: self.after - sent])
            if sent >= self.after:
                raise httpx.ReadError("connection reset")

    def close(self) -> None:
        self.stream.close()


class _CutsTheFirstDownload(httpx.HTTPTransport):
    """Records each artifact request's ``Range``; the body of the first breaks after 1000 bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.ranges = list[str | None]()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if not request.url.path.startswith("/v1/artifacts/"):
            return response
        self.ranges.append(request.headers.get("range"))
        if len(self.ranges) > 1:
            return response
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpx.Response(response.status_code, headers=response.headers, stream=_Cut(response.stream, 1000))


def test_a_native_download_resumes_after_a_broken_body_and_drops_a_partial_file_of_wrong_bytes(
    tmp_path: Path, dataset_root: Path
) -> None:
    head, _ = head_envelope()
    with _edge(tmp_path, dataset_root) as (edge, _http):
        cut = _CutsTheFirstDownload()
        client = EdgeClient(edge.url)
        client._http.close()
        client._clients[0] = httpx.Client(base_url=edge.url, transport=cut)  # below the client
        destination = tmp_path / "heads" / "genesis"
        data = client.artifact(head.head_id, destination)
        assert content_id(data) == head.head_id and destination.read_bytes() == data
        assert cut.ranges == [None, "bytes=1000-"]  # asked again from the bytes that arrived
        other = tmp_path / "heads" / "other"
        other.with_name("other.part").write_bytes(b"\xff" * 1000)  # not the artifact's first bytes
        with pytest.raises(IntegrityError):
            client.artifact(head.head_id, other)
        assert not other.with_name("other.part").exists()  # so the next download starts from 0
        assert client.artifact(head.head_id, other) == data
        client.close()
