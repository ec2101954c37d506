"""HTTP client for the edge, as native peers and validators use it.

Every refusal becomes ``EdgeRequestError`` carrying the edge's status and error name. What to send,
and when to send it again, comes from ``protocol.transfers``, the plans the browser peer drives too:
requests that fail to travel are sent again after a back-off (``Exchange``); downloads are resumed
with ``Range`` after a broken transfer and verified against their content id (``RangedDownload``);
candidates, heads and outer states whose artifact is larger than ``chunk_bytes`` are staged in chunks
first and published by an envelope without the artifact, every request naming the stage so that a
balancer keeps them on one edge (``StagedUpload``). This module only sends them, with httpx. It is the
only door to the edge's HTTP API: peers, validators and the lab use its public methods, nothing else.

A client may be given several edges of one network (a list, or one comma-separated string: edges
that follow one another, ``server.follower``). It talks to one at a time, the first to begin with;
when that one is unreachable (a request that kept failing to travel) or fails (5xx), the request is
sent to the next one, each edge once per request, and the client stays there. ``failovers`` counts
the moves: whoever keeps per-edge state (a cursor into an edge's candidates) checks it, and reads
the network again as after a replaced edge (``native_peer.network_chain``: every edge signs with its own key).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from protocol.clock import SYSTEM_CLOCK, Clock
from protocol.edge_urls import edge_urls
from protocol.envelope import pack_envelope, unpack_envelope
from protocol.errors import IntegrityError, InvalidMessage, ProtocolError
from protocol.fields import read_int, read_list, read_object, read_str
from protocol.hashing import content_id
from protocol.ids import ContentId, ExperimentKey, HeadId, LeaseId, PeerId, ShardId
from protocol.manifests import MAX_VALIDATORS, FetchManifest, NetworkManifest
from protocol.messages import (
    CANDIDATE_PAGE,
    CURRENT_HEAD_HEADER,
    EVALUATION_PAGE,
    LEASE_SECRET_HEADER,
    NEXT_SINCE_HEADER,
    READ_PROOF_HEADER,
    VERDICT_BATCH,
    Attestation,
    Candidate,
    Evaluation,
    HeadDescriptor,
    Lease,
    LeaseGrant,
    PeerProof,
    Verdict,
    evaluated_metrics,
)
from protocol.network_pins import NetworkSignature
from protocol.network_revisions import MAX_REVISIONS, SignedNetworkRevision
from protocol.run_control import MAX_ORDERS, SignedRunControl
from protocol.signing import Signer, b64decode
from protocol.transfers import (
    Done,
    Exchange,
    RangedDownload,
    Request,
    Response,
    RetryPolicy,
    StagedUpload,
    TransferFailed,
    Wait,
)
from protocol.uploads import UPLOAD_CHUNK_BYTES
from protocol.window import lease_window

__all__ = ["Activity", "EdgeClient", "EdgeRequestError"]

T = TypeVar("T")


@dataclass(frozen=True)
class Activity:
    """An answer of the edge's activity long poll: its token, the key the edge signs leases with
    (``None``: the edge did not say) and the revision of the network it serves, so a waiter notices a
    replaced edge or a revised network without asking for the network."""

    since: str
    edge_key: bytes | None
    network_revision: int = 0

    @classmethod
    def from_wire(cls, value: object) -> Activity:
        d = read_object(value, "activity")
        key = d.get("edge_key")
        revision = read_int(d, "network_revision", low=0) if "network_revision" in d else 0
        return cls(read_str(d, "since", max_len=80), None if key is None else b64decode(key, size=32), revision)


class EdgeRequestError(Exception):
    """A refusal by the edge; ``retry_after_s`` is its ``Retry-After`` (seconds) when it sent one."""

    def __init__(self, status: int, error: str, detail: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status, self.error, self.detail, self.retry_after_s = status, error, detail, retry_after_s


def _answer(response: httpx.Response) -> Response:
    return Response(response.status_code, response.headers, response.content)


def _refusal(answer: Response) -> EdgeRequestError:
    retry = answer.headers.get("retry-after", "")
    try:
        body = answer.json()
        error, detail = str(body.get("error", "")), str(body.get("detail", ""))
    except ProtocolError:
        error, detail = "", answer.body[:200].decode(errors="replace")
    return EdgeRequestError(answer.status, error, detail, float(retry) if retry.isdigit() else None)


def _canonical(response: httpx.Response) -> HeadDescriptor | None:
    """The head a publish of a head or an attestation answered, when the edge holds it canonical (201)."""
    return HeadDescriptor.from_wire(response.json()) if response.status_code == 201 else None


class EdgeClient:
    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        token: str | None = None,
        reader: Signer | None = None,
        timeout_s: float = 30.0,
        retries: int = 3,
        clock: Clock = SYSTEM_CLOCK,
        chunk_bytes: int = UPLOAD_CHUNK_BYTES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``base_url``: the edge, or the edges in the order they are tried (``protocol.edge_urls``).
        ``transport``: how requests travel (default: httpx's own; e.g. one bound to a source
        address, as ``lab.simulated`` spreads its simulated trainers over loopback addresses)."""
        self.urls = edge_urls(base_url)
        if not self.urls:
            raise ValueError("an edge client needs an edge URL")
        headers = {} if token is None else {"authorization": f"Bearer {token}"}
        self._clients = [
            httpx.Client(base_url=url, timeout=timeout_s, headers=headers, transport=transport) for url in self.urls
        ]
        self._at = 0  # the edge in use
        self._moving = threading.Lock()
        self.failovers = 0
        self._policy = RetryPolicy.retrying(retries)
        self._clock = clock
        self._manifests: dict[str, FetchManifest] = {}
        self._reader = reader
        self._chunk_bytes = chunk_bytes

    def _read_proof(self, path: str) -> dict[str, str]:
        """With a ``reader`` (a validator's key): the signed proof that lets it read an open window's
        candidates (``READ_PROOF_HEADER``), good for one request; without one, nothing."""
        if self._reader is None:
            return {}
        return {READ_PROOF_HEADER: PeerProof.for_read(self._reader, "validator", path, self._clock.now_ms())}

    @property
    def url(self) -> str:
        """The edge in use."""
        return self.urls[self._at]

    @property
    def _http(self) -> httpx.Client:
        return self._clients[self._at]

    def close(self) -> None:
        for client in self._clients:
            client.close()

    def _on_any_edge(self, call: Callable[[], T]) -> T:
        """``call()`` on the edge in use; when that edge is unreachable (``httpx.TransportError``, or an
        ``EdgeRequestError`` of status 0) or fails (5xx), on the next one, each edge once at most; the
        last edge's failure is raised."""
        for tried in range(len(self._clients)):
            at = self._at
            try:
                return call()
            except (httpx.TransportError, EdgeRequestError) as exc:
                status = exc.status if isinstance(exc, EdgeRequestError) else 0
                if 0 < status < 500 or tried == len(self._clients) - 1:
                    raise
                with self._moving:
                    if self._at == at:  # not moved on meanwhile by another thread's failure
                        self._at = (at + 1) % len(self._clients)
                        self.failovers += 1
        raise AssertionError("unreachable")

    def _request(self, method: str, path: str, *, read_proof: bool = False, **options: Any) -> httpx.Response:
        """``method`` ``path`` with httpx's ``options``, sent again while it fails to travel
        (``protocol.transfers.Exchange``), then to the next edge (``_on_any_edge``); a refusal is raised
        as ``EdgeRequestError``. ``read_proof``: each attempt with a fresh read proof (``_read_proof``;
        the edge takes one once)."""
        fresh = (lambda: self._read_proof(path)) if read_proof else None

        def send() -> httpx.Response:
            response = self._drive(Exchange(Request(method, path), self._policy), fresh=fresh, **options)
            if response.status_code >= 400:
                raise _refusal(_answer(response))
            return response

        return self._on_any_edge(send)

    def _drive(
        self, plan: Exchange | StagedUpload, *, fresh: Callable[[], dict[str, str]] | None = None, **options: Any
    ) -> httpx.Response:
        """Send what ``plan`` asks (``protocol.transfers``) until it is done; its last answer. A refusal
        that ends it is raised as ``EdgeRequestError``, transfers that kept failing as the last
        ``httpx.TransportError``. ``fresh``: headers made anew for every request sent."""
        response: httpx.Response | None = None
        while not isinstance(step := plan.next_step(), Done):
            if isinstance(step, Wait):
                time.sleep(step.seconds)
                continue
            sent = {**options, "headers": {**step.headers, **options.get("headers", {}), **(fresh() if fresh else {})}}
            if step.body is not None:
                sent["content"] = step.body
            try:
                response = self._http.request(step.method, step.path, **sent)
            except httpx.TransportError as exc:
                try:
                    plan.broken(f"{type(exc).__name__}: {exc}")
                except TransferFailed:
                    raise exc from None
                continue
            try:
                plan.receive(_answer(response))
            except TransferFailed as exc:
                assert exc.response is not None
                raise _refusal(exc.response) from None
        assert response is not None
        return response

    @staticmethod
    def _experiment_path(key: ExperimentKey) -> str:
        return f"/v1/experiments/{key}"

    # -- reads ------------------------------------------------------------------------------
    def network(self) -> NetworkManifest:
        return NetworkManifest.from_wire(self._request("GET", "/v1/network").json())

    def network_signatures(self) -> list[NetworkSignature]:
        """The validators' signatures over the network's terms the edge holds (``protocol.network_pins``)."""
        answer = self._request("GET", "/v1/network/signatures").json()
        if not isinstance(answer, list) or len(answer) > MAX_VALIDATORS:
            raise InvalidMessage(f"network signatures must be a list of at most {MAX_VALIDATORS}")
        return [NetworkSignature.from_wire(s) for s in answer]

    def sign_network(self, signature: NetworkSignature) -> None:
        """Give the edge this validator's signature over the network's terms."""
        self._request("POST", "/v1/network/signatures", json=signature.to_wire())

    def network_revisions(self) -> list[SignedNetworkRevision]:
        """The revisions of the network's terms the edge applied, in order, as it serves them (unchecked:
        ``protocol.network_revisions.follow`` checks each against the terms before it)."""
        answer = self._request("GET", "/v1/network/revisions").json()
        if not isinstance(answer, list) or len(answer) > MAX_REVISIONS:
            raise InvalidMessage(f"network revisions must be a list of at most {MAX_REVISIONS}")
        return [SignedNetworkRevision.from_wire(r) for r in answer]

    def submit_revision(self, signed: SignedNetworkRevision) -> dict[str, Any]:
        """Give the edge a signed revision; its answer: the revision as applied."""
        answer: dict[str, Any] = self._request("POST", "/v1/network/revisions", json=signed.to_wire()).json()
        return answer

    def current_head(
        self, key: ExperimentKey, *, after: HeadId | None = None, wait_s: float = 0.0
    ) -> HeadDescriptor | None:
        params: dict[str, Any] = {} if after is None else {"after": after, "wait_s": wait_s}
        try:
            response = self._request("GET", f"{self._experiment_path(key)}/head", params=params, timeout=wait_s + 30)
        except EdgeRequestError as exc:
            if exc.status == 404:
                return None
            raise
        return HeadDescriptor.from_wire(response.json())

    def head(self, key: ExperimentKey, head_id: HeadId) -> HeadDescriptor | None:
        """One head of ``key``'s lineage (``None``: the edge has no such head)."""
        try:
            return HeadDescriptor.from_wire(
                self._request("GET", f"{self._experiment_path(key)}/heads/{head_id}").json()
            )
        except EdgeRequestError as exc:
            if exc.status == 404:
                return None
            raise

    def heads(self, key: ExperimentKey) -> list[HeadDescriptor]:
        return [HeadDescriptor.from_wire(h) for h in self._request("GET", f"{self._experiment_path(key)}/heads").json()]

    def evaluations(self, key: ExperimentKey) -> list[Evaluation]:
        """Every evaluation the edge holds of ``key``'s heads, by window (unchecked: read them through
        ``protocol.messages.evaluated_metrics``)."""
        found: list[Evaluation] = []
        since = 0
        while True:
            params = {"since_window": since, "limit": EVALUATION_PAGE}
            page = [
                Evaluation.from_wire(e)
                for e in self._request("GET", f"{self._experiment_path(key)}/evaluations", params=params).json()
            ]
            if len(page) < EVALUATION_PAGE:
                return found + page
            last = page[-1].window
            if page[0].window == last:  # one window fills a page: take it, read on after it
                found += page
                since = last + 1
            else:  # the page may end inside its last window: read that window again
                found += [e for e in page if e.window < last]
                since = last

    def evaluated(self, key: ExperimentKey, validator_keys: frozenset[bytes]) -> dict[HeadId, dict[str, float]]:
        """Each of ``key``'s heads' evaluated metrics (``test_accuracy`` ...) that validators in
        ``validator_keys`` signed (``protocol.messages.evaluated_metrics``); a head not measured yet has none."""
        return evaluated_metrics(self.evaluations(key), validator_keys)

    def run_orders(self, key: ExperimentKey) -> list[SignedRunControl]:
        """The run-control orders the edge applied to ``key``, in sequence, as it serves them
        (unchecked: ``RunState.of`` checks each)."""
        answer = read_object(self._request("GET", f"{self._experiment_path(key)}/control").json(), "run control")
        return read_list(answer, "orders", SignedRunControl.from_wire, max_len=MAX_ORDERS)

    def submit_order(self, signed: SignedRunControl) -> dict[str, Any]:
        """Give the edge a signed order; its answer: the order applied, with the state it leaves."""
        path = f"{self._experiment_path(signed.order.experiment)}/control"
        answer: dict[str, Any] = self._request("POST", path, json=signed.to_wire()).json()
        return answer

    def proposals(self, key: ExperimentKey, parent: HeadId | None) -> list[HeadDescriptor]:
        """Heads proposed on top of ``parent`` (``None``: genesis), each with its certificate so far."""
        params = {} if parent is None else {"parent": parent}
        response = self._request("GET", f"{self._experiment_path(key)}/proposals", params=params)
        return [HeadDescriptor.from_wire(h) for h in response.json()]

    def candidates_since(
        self, key: ExperimentKey, since: int, base_head: HeadId | None = None
    ) -> tuple[list[Candidate], int, HeadId | None]:
        """The candidates received after cursor ``since`` (0: from the start; of ``base_head`` when
        given), every page of them, the cursor to continue from (a follower that never lists history
        twice), and the experiment's current head id as the last page was read (``None``: no head yet)."""
        path = f"{self._experiment_path(key)}/candidates"
        params: dict[str, Any] = {"limit": CANDIDATE_PAGE} | ({} if base_head is None else {"base_head": base_head})
        found: list[Candidate] = []
        while True:
            response = self._request("GET", path, params={**params, "since": since}, read_proof=True)
            page = [Candidate.from_wire(c) for c in response.json()]
            found += page
            since = int(response.headers[NEXT_SINCE_HEADER])
            if len(page) < CANDIDATE_PAGE:  # nothing more for now
                current = response.headers.get(CURRENT_HEAD_HEADER)
                return found, since, None if current is None else HeadId(current)

    def candidates(self, key: ExperimentKey, base_head: HeadId | None = None) -> list[Candidate]:
        """Every candidate this client may read (of ``base_head`` when given), page after page."""
        return self.candidates_since(key, 0, base_head)[0]

    def leases(self, key: ExperimentKey, *base_heads: HeadId) -> list[Lease]:
        """The leases granted on ``base_heads`` (one or two heads), in one request."""
        response = self._request("GET", f"{self._experiment_path(key)}/leases", params={"base_head": base_heads})
        return [Lease.from_wire(lease) for lease in response.json()]

    def window_leases(self, key: ExperimentKey, head: HeadDescriptor) -> list[Lease]:
        """The leases of the window on ``head``: those granted on it for its window, and those granted
        ahead on its parent (``protocol.window.lease_window``)."""
        granted = self.leases(key, head.head_id, *([head.parent] if head.parent else []))
        return [lease for lease in granted if lease_window(lease, head)]

    def lease(self, lease_id: LeaseId) -> Lease | None:
        try:
            return Lease.from_wire(self._request("GET", f"/v1/leases/{lease_id}").json())
        except EdgeRequestError as exc:
            if exc.status == 404:
                return None
            raise

    def verdicts(self, key: ExperimentKey, peer_id: PeerId | None = None) -> list[Verdict]:
        params = {} if peer_id is None else {"peer_id": peer_id}
        response = self._request("GET", f"{self._experiment_path(key)}/verdicts", params=params)
        return [Verdict.from_wire(v) for v in response.json()]

    def peers(self) -> dict[str, Any]:
        """The peer directory: ``{"connected": [...], "known": [{"peer_id", "kind", ...}]}``, every page of
        ``known``."""
        directory = self._request("GET", "/v1/peers").json()
        while directory.get("next") is not None:
            more = self._request("GET", "/v1/peers", params={"cursor": directory["next"]}).json()
            directory = {**more, "known": directory["known"] + more["known"]}
        return dict(directory)

    def portal_snapshot(self) -> dict[str, Any]:
        """What the viewer shows: experiments with their heads and verdict counts, peers by kind."""
        return dict(self._request("GET", "/portal/snapshot").json())

    def fetch_manifest(self, dataset_id: str) -> FetchManifest:
        """A dataset's fetch-manifest, fetched once per client (a dataset's shards do not change)."""
        if dataset_id not in self._manifests:
            response = self._request("GET", f"/v1/datasets/{dataset_id}/fetch-manifest.json")
            self._manifests[dataset_id] = FetchManifest.from_wire(response.json())
        return self._manifests[dataset_id]

    def shard(self, grant: LeaseGrant, shard_id: ShardId) -> bytes:
        """One shard of a lease this client was granted (its secret unlocks the bytes)."""
        path = f"/v1/datasets/{grant.lease.dataset_id}/shards/{shard_id}"
        headers = {LEASE_SECRET_HEADER: grant.secret}
        return self._request("GET", path, params={"lease": grant.lease.lease_id}, headers=headers).content

    def artifact(self, cid: ContentId, destination: Path) -> bytes:
        """The artifact ``cid``, kept at ``destination``: read from there when it already holds exactly
        those bytes, else downloaded (``protocol.transfers.RangedDownload``: streamed into a partial
        file, resumed from it after a broken transfer, also by a later call, or from the next edge:
        the bytes are the same) and verified by content id."""
        if destination.exists():
            data = destination.read_bytes()
            if content_id(data) == cid:
                return data
        return self._on_any_edge(lambda: self._download(cid, destination))

    def _download(self, cid: ContentId, destination: Path) -> bytes:
        partial = destination.with_name(destination.name + ".part")
        destination.parent.mkdir(parents=True, exist_ok=True)
        have = partial.read_bytes() if partial.exists() else b""
        plan = RangedDownload(f"/v1/artifacts/{cid}", cid, have=have, policy=self._policy)
        try:
            while not isinstance(step := plan.next_step(), Done):
                if isinstance(step, Wait):
                    time.sleep(step.seconds)
                    continue
                try:
                    self._stream(plan, step, partial)
                except httpx.TransportError as exc:
                    plan.broken(f"{type(exc).__name__}: {exc}")
        except TransferFailed as exc:
            if exc.response is None:
                raise EdgeRequestError(0, "TransportError", f"could not download {cid}") from exc
            raise _refusal(exc.response) from None
        except IntegrityError:
            partial.unlink(missing_ok=True)  # not these bytes: the next download starts from 0
            raise
        partial.replace(destination)
        assert isinstance(step.value, bytes)
        return step.value

    def head_delta(self, key: ExperimentKey, head_id: HeadId, base: HeadId, max_bytes: int) -> bytes | None:
        """Head ``head_id`` as a delta from its parent ``base`` (``protocol.head_delta``; unchecked), in one
        request: None when the edge serves none, the transfer fails or the answer runs past ``max_bytes``
        (the caller downloads the head instead)."""
        path = f"{self._experiment_path(key)}/heads/{head_id}/delta"
        try:
            with self._http.stream("GET", path, params={"from": base}) as response:
                if response.status_code != 200:
                    return None
                data = bytearray()
                for chunk in response.iter_bytes():
                    data += chunk
                    if len(data) > max_bytes:
                        return None
                return bytes(data)
        except httpx.TransportError:
            return None

    def _stream(self, plan: RangedDownload, step: Request, partial: Path) -> None:
        """One answer to ``step``, its body written to ``partial`` as it arrives, where ``plan`` says."""
        headers = {**step.headers, **self._read_proof(step.path)}
        with self._http.stream(step.method, step.path, headers=headers) as response:
            if not 200 <= response.status_code < 300:
                response.read()
                plan.receive(_answer(response))
                return
            offset = plan.begin(response.status_code, response.headers)
            with open(partial, "ab" if offset else "wb") as handle:
                for chunk in response.iter_bytes():
                    plan.feed(chunk)
                    handle.write(chunk)
        plan.end()

    # -- writes -----------------------------------------------------------------------------
    def request_lease(
        self,
        key: ExperimentKey,
        signer: Signer,
        peer_kind: str,
        *,
        after: HeadId | None = None,
        shards: int | None = None,
        cache_bytes: int | None = None,
        work: int | None = None,
    ) -> LeaseGrant:
        """A lease in the current window, or ``after`` the current head: in the next (``server.leasing``);
        of ``shards`` shards when given (the edge bounds it by the experiment's); ``cache_bytes``: the
        bytes of shards this peer keeps (``protocol.leases.keeps_home``); ``work``: its proof of work,
        where the experiment asks for one (``protocol.lease_work.lease_work``)."""
        proof = PeerProof("lease", signer.public_key, peer_kind, "-", self._clock.now_ms()).signed(signer)
        params: dict[str, str | int] = {} if after is None else {"after": after}
        if shards is not None:
            params["shards"] = shards
        if cache_bytes is not None:
            params["cache_bytes"] = cache_bytes
        if work is not None:
            params["work"] = work
        return LeaseGrant.from_wire(
            self._request("POST", f"{self._experiment_path(key)}/leases", json=proof.to_wire(), params=params).json()
        )

    def publish_candidate(self, key: ExperimentKey, envelope: bytes) -> None:
        self._publish(key, "candidates", envelope)

    def publish_head(self, key: ExperimentKey, envelope: bytes) -> HeadDescriptor | None:
        """Propose a head; the head as the edge then holds it when that made it canonical (201: with its
        certificate, unverified), ``None`` while it waits for attestations (202)."""
        return _canonical(self._publish(key, "heads", envelope))

    def publish_outer_state(self, key: ExperimentKey, envelope: bytes) -> None:
        """The outer optimizer state a proposed head names: its envelope of (head, state), before the head."""
        self._publish(key, "outer-states", envelope)

    def _publish(self, key: ExperimentKey, collection: str, envelope: bytes) -> httpx.Response:
        """POST ``envelope`` to the experiment's ``collection``; an artifact over ``chunk_bytes`` is
        staged first and the envelope sent without it (``protocol.transfers.StagedUpload``: from the
        edge's offset, staged again where a publish finds no stage). The publish's answer."""
        path = f"{self._experiment_path(key)}/{collection}"
        descriptor, artifact = unpack_envelope(envelope)
        if len(artifact) <= self._chunk_bytes:
            return self._request("POST", path, content=envelope)
        bare = pack_envelope(descriptor, b"")
        return self._on_any_edge(
            lambda: self._drive(
                StagedUpload(key, artifact, path, bare, chunk_bytes=self._chunk_bytes, policy=self._policy)
            )
        )

    def publish_attestation(self, attestation: Attestation) -> HeadDescriptor | None:
        """Vouch for a proposed head; the head when that made it canonical, as ``publish_head``."""
        path = f"{self._experiment_path(attestation.experiment)}/attestations"
        return _canonical(self._request("POST", path, json=attestation.to_wire()))

    def publish_evaluation(self, evaluation: Evaluation) -> None:
        self._request("POST", f"{self._experiment_path(evaluation.experiment)}/evaluations", json=evaluation.to_wire())

    def publish_verdict(self, verdict: Verdict) -> None:
        self._request("POST", f"{self._experiment_path(verdict.experiment)}/verdicts", json=verdict.to_wire())

    def publish_verdicts(self, key: ExperimentKey, verdicts: Sequence[Verdict]) -> None:
        """``verdicts`` of ``key`` in batches of ``VERDICT_BATCH``, one request each."""
        for start in range(0, len(verdicts), VERDICT_BATCH):
            batch = [v.to_wire() for v in verdicts[start : start + VERDICT_BATCH]]
            self._request("POST", f"{self._experiment_path(key)}/verdict-batches", json=batch)

    def activity(self, since: str | None, wait_s: float) -> Activity:
        """The edge's activity once its token moved past ``since``, or after ``wait_s`` (``server.hub``)."""
        params: dict[str, Any] = {"wait_s": wait_s} if since is None else {"since": since, "wait_s": wait_s}
        return Activity.from_wire(self._request("GET", "/v1/activity", params=params, timeout=wait_s + 30).json())
