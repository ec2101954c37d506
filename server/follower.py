"""An edge that follows another edge of its network (``--follow URL[,URL...]``), so that a second
operator's edge holds the network too and peers given both can move to it (``EdgeClient``).

A background task waits on the upstream's activity (``GET /v1/activity``, a long poll) and after each
change mirrors, for every experiment of this edge's network:

- the canonical heads past this edge's current head, walked back from the upstream's current head
  along their parents, with their certificates, the artifacts and outer states they name, and the
  candidates of the windows they closed (public once a window closed; behind an upstream that asks for
  admission, read with the token ``follow_tokens_file`` names for it, role ``mirror``). They are taken as one lineage
  that continues this edge's own (``server.lineage.import_lineage``): every signature, each head's
  quorum of this edge's validators, the parent chain, the candidates' signatures and every blob
  (its hash and its shape as the experiment's model) are checked before anything is written, the
  check an imported archive gets. A head this edge did not certify itself is never served unchecked.
- the verdicts that count upstream, each taken through this edge's own verdict intake
  (``server.intake.accept_verdicts``: a validator's signature, a candidate held here, not
  contradicted by the lineage); one refused is left out with a warning. With a quorum above one, a
  verdict held here as one validator's vote is counted from the other votes that made it count
  upstream (``.../verdicts/{candidate_id}/votes``), each checked alike.
- the validators' evaluations of mirrored heads (``protocol.messages.Evaluation``), each through this
  edge's own intake (``server.intake.accept_evaluation``: a validator's signature, a head held here);
  one of a head not mirrored yet waits, with those after it, for the next round.
- the run-control orders applied upstream past this edge's last one, in sequence, each through this
  edge's own order intake (``server.intake.accept_order``: the quorum's signatures, a rollback's head
  canonical here), so an experiment paused or stopped upstream is paused or stopped here too and
  stays so when peers move to this edge; one refused is left out with a warning, and a rollback to a
  head not mirrored yet waits (with the orders after it) for the next round.
- the revisions of the network's terms applied upstream past this edge's (``protocol.network_revisions``),
  checked as a chain from the terms this edge serves before anything is taken; heads are checked
  against the validators of their era under those revisions (so a lineage that goes on past a change
  of validators is taken), then each revision is applied through this edge's own revision intake
  (``server.revision_routes.accept_revision``), an experiment it adds mirrored from then on.

Every answer is bounded (a descriptor's bytes, an artifact's ``max_artifact_bytes``, a walk no longer
than the windows between the two heads, pages of candidates) and read as JSON by the strict readers
or as bytes checked against their content id; nothing is executed or unpickled. A failure (the
upstream unreachable, a 5xx, an answer that does not verify, a lineage that is not this edge's) is
logged; the follower backs off (``protocol.backoff``) and tries the next upstream of the list.
Meanwhile this edge serves what it holds, and takes heads, candidates and verdicts as any edge does.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx

from protocol.backoff import Backoff
from protocol.envelope import MAX_DESCRIPTOR_BYTES
from protocol.errors import InvalidMessage, ProtocolError, TooLarge
from protocol.ids import ContentId, ExperimentKey, HeadId
from protocol.lineage import Lineage
from protocol.manifests import MAX_VALIDATORS, ExperimentSpec, NetworkManifest
from protocol.messages import (
    CANDIDATE_PAGE,
    EVALUATION_PAGE,
    NEXT_SINCE_HEADER,
    Candidate,
    Evaluation,
    HeadDescriptor,
    Verdict,
)
from protocol.network_revisions import MAX_REVISIONS, SignedNetworkRevision, revisions_after
from protocol.run_control import MAX_ORDERS, SignedRunControl

from .errors import Conflict, NotFound
from .intake import accept_evaluation, accept_order, accept_verdicts, head_taken
from .lineage import import_lineage
from .revision_routes import accept_revision
from .state import EdgeState

__all__ = ["Upstream", "follow", "mirror_once"]

log = logging.getLogger(__name__)

ACTIVITY_WAIT_S = 10.0  # one long poll on the upstream's activity
HEADS_PER_IMPORT = 16  # heads (and their blobs, in memory) taken as one lineage
MAX_CANDIDATE_PAGES = 64  # pages of candidates (each at most CANDIDATE_PAGE) one round reads
MAX_LIST_BYTES = 64 * 1024 * 1024  # a page of candidates or the verdicts listed
MAX_SEEN_VERDICTS = 100_000  # verdicts remembered as taken (then forgotten: taking one again changes nothing)


class UpstreamError(Exception):
    """The upstream failed (transport, 5xx) or answered what cannot be read."""


class Upstream:
    """Bounded reads of one upstream edge."""

    def __init__(self, http: httpx.AsyncClient, url: str, max_artifact_bytes: int, token: str | None = None) -> None:
        self.http, self.url, self.max_artifact_bytes = http, url.rstrip("/"), max_artifact_bytes
        # an admission token of the upstream's (role mirror): what lets it list its candidates
        self.headers = {} if token is None else {"authorization": f"Bearer {token}"}

    async def get(self, path: str, max_bytes: int, **params: Any) -> tuple[int, httpx.Headers, bytes]:
        """Status, headers and body of ``GET path``; ``TooLarge`` past ``max_bytes``, ``UpstreamError``
        on a transport error or a 5xx."""
        try:
            async with self.http.stream("GET", f"{self.url}{path}", params=params, headers=self.headers) as response:
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > max_bytes:
                        raise TooLarge(f"{self.url}{path} answered more than {max_bytes} bytes")
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{self.url}{path}: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 500:
            raise UpstreamError(f"{self.url}{path} answered {response.status_code}")
        return response.status_code, response.headers, bytes(body)

    async def json(self, path: str, max_bytes: int = MAX_DESCRIPTOR_BYTES, **params: Any) -> tuple[int, Any]:
        """Status and JSON body of ``GET path`` (``None`` for a body on a 4xx)."""
        status, _, body = await self.get(path, max_bytes, **params)
        if status >= 400:
            return status, None
        try:
            return status, json.loads(body)
        except ValueError:
            raise InvalidMessage(f"{self.url}{path} answered no JSON") from None

    async def activity(self, since: str | None) -> str:
        """The upstream's activity token once it moved past ``since`` (or after ``ACTIVITY_WAIT_S``)."""
        params: dict[str, Any] = {"wait_s": ACTIVITY_WAIT_S} | ({} if since is None else {"since": since})
        status, answer = await self.json("/v1/activity", **params)
        if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("since"), str):
            raise UpstreamError(f"{self.url}/v1/activity answered {status}")
        return str(answer["since"])[:40]

    async def head(self, key: ExperimentKey, head_id: HeadId | None = None) -> HeadDescriptor | None:
        """Head ``head_id`` of ``key`` (``None``: the current one); ``None`` when it has none such."""
        path = f"/v1/experiments/{key}/head" if head_id is None else f"/v1/experiments/{key}/heads/{head_id}"
        status, answer = await self.json(path)
        return None if status == 404 else HeadDescriptor.from_wire(answer)

    async def blob(self, cid: ContentId) -> bytes:
        status, _, body = await self.get(f"/v1/artifacts/{cid}", self.max_artifact_bytes)
        if status != 200:
            raise UpstreamError(f"{self.url} answered {status} for artifact {cid}")
        return body

    async def candidates(self, key: ExperimentKey, since: int) -> tuple[list[Candidate], int]:
        """The candidates listed after cursor ``since`` (those of closed windows: the page anyone reads),
        ``MAX_CANDIDATE_PAGES`` pages at most, and the cursor after them; none where the upstream lets
        only validators and mirrors read them (admission) and this edge has no token of its."""
        found: list[Candidate] = []
        for _ in range(MAX_CANDIDATE_PAGES):
            status, headers, body = await self.get(
                f"/v1/experiments/{key}/candidates", MAX_LIST_BYTES, since=since, limit=CANDIDATE_PAGE
            )
            if status in (401, 403):
                return found, since
            if status != 200:
                raise UpstreamError(f"{self.url} answered {status} for the candidates of {key}")
            page = [Candidate.from_wire(c) for c in _json_list(body)]
            since = int(headers.get(NEXT_SINCE_HEADER, since))
            found += page
            if len(page) < CANDIDATE_PAGE:  # nothing more for now
                break
        return found, since

    async def verdicts(self, key: ExperimentKey) -> list[Verdict]:
        """The latest verdicts that count upstream."""
        status, _, body = await self.get(f"/v1/experiments/{key}/verdicts", MAX_LIST_BYTES)
        return [Verdict.from_wire(v) for v in _json_list(body)] if status == 200 else []

    async def votes(self, key: ExperimentKey, cid: ContentId) -> list[Verdict]:
        """The validators' votes held upstream on candidate ``cid``: with a quorum above one, those that
        made its verdict count."""
        status, _, body = await self.get(f"/v1/experiments/{key}/verdicts/{cid}/votes", MAX_LIST_BYTES)
        return [Verdict.from_wire(v) for v in _json_list(body)[:MAX_VALIDATORS]] if status == 200 else []

    async def evaluations(self, key: ExperimentKey, since_window: int) -> list[Evaluation]:
        """One page of the evaluations of ``key``'s heads of window ``since_window`` or later."""
        path = f"/v1/experiments/{key}/evaluations"
        status, _, body = await self.get(path, MAX_LIST_BYTES, since_window=since_window, limit=EVALUATION_PAGE)
        return [Evaluation.from_wire(e) for e in _json_list(body)] if status == 200 else []

    async def revisions(self) -> list[SignedNetworkRevision]:
        """The revisions of the network's terms applied upstream (at most ``MAX_REVISIONS``), unchecked."""
        status, answer = await self.json("/v1/network/revisions", MAX_LIST_BYTES)
        if status != 200:
            return []
        if not isinstance(answer, list) or len(answer) > MAX_REVISIONS:
            raise InvalidMessage(f"{self.url} serves network revisions that are not a list of at most {MAX_REVISIONS}")
        return [SignedNetworkRevision.from_wire(revision) for revision in answer]

    async def orders(self, key: ExperimentKey) -> list[SignedRunControl]:
        """The run-control orders applied upstream, in sequence (at most ``MAX_ORDERS``)."""
        status, answer = await self.json(f"/v1/experiments/{key}/control", MAX_LIST_BYTES)
        if status != 200:
            return []
        orders = answer.get("orders") if isinstance(answer, dict) else None
        if not isinstance(orders, list) or len(orders) > MAX_ORDERS:
            raise InvalidMessage(f"{self.url} serves run control of {key} that is not a list of orders")
        return [SignedRunControl.from_wire(order) for order in orders]


def _json_list(body: bytes) -> list[Any]:
    try:
        found = json.loads(body)
    except ValueError:
        raise InvalidMessage("a listing that is not JSON") from None
    if not isinstance(found, list):
        raise InvalidMessage("a listing that is not a JSON list")
    return found


class _Cursors:
    """Per upstream and experiment: the cursor into its candidates, the verdicts taken."""

    def __init__(self) -> None:
        self.candidates: dict[tuple[str, str], int] = {}
        self.verdicts: set[tuple[str, bytes]] = set()
        self.evaluations: dict[tuple[str, str], int] = {}  # the window of the last evaluation taken


async def mirror_once(state: EdgeState, upstream: Upstream, cursors: _Cursors | None = None) -> int:
    """Mirror what ``upstream`` holds past this edge (revisions, heads, blobs, candidates, verdicts, orders),
    every experiment once; returns how many heads were taken. ``ProtocolError`` or ``Conflict`` when
    the upstream serves what does not verify or another lineage, ``UpstreamError`` when it fails."""
    cursors = cursors or _Cursors()
    revisions = revisions_after(state.network, await upstream.revisions())  # checked as a chain
    history = [*state.networks, *(network for _, network in revisions)]
    taken = 0
    for spec in history[-1].experiments:
        taken += await _mirror_heads(state, upstream, spec, cursors, history)
    for signed, _ in revisions:
        try:
            await accept_revision(state, signed)
        except Conflict as exc:  # its handover is past the heads taken: the next round
            log.warning("network revision %d from %s not taken yet: %s", signed.revision.number, upstream.url, exc)
            break
    for spec in state.network.experiments:
        await _mirror_verdicts(state, upstream, spec.key, cursors)
        await _mirror_evaluations(state, upstream, spec.key, cursors)
        await _mirror_orders(state, upstream, spec.key)
    return taken


async def _mirror_heads(
    state: EdgeState, upstream: Upstream, spec: ExperimentSpec, cursors: _Cursors, history: list[NetworkManifest]
) -> int:
    """Take the heads ``upstream`` holds past this edge's of ``spec``, checked against the validators of
    their era under ``history`` (the network at each revision, those upstream not taken yet included)."""
    ours = state.store.current_head(spec.key)
    newest = await upstream.head(spec.key)
    if newest is None or (ours is not None and newest.window <= ours.window):
        return 0
    history[-1].verify_head(newest)  # before a walk it bounds
    missing = [newest]
    stop = -1 if ours is None else ours.window
    while missing[-1].window - 1 > stop:  # windows fall by one a step: the walk ends at this edge's head
        child = missing[-1]
        parent = None if child.parent is None else await upstream.head(spec.key, child.parent)
        if parent is None or parent.window != child.window - 1:
            raise InvalidMessage(f"{upstream.url} serves head {child.head_id} without its parent")
        missing.append(parent)
    heads = missing[::-1]
    at = (upstream.url, spec.key)
    listed, since = await upstream.candidates(spec.key, cursors.candidates.get(at, 0))
    taken = 0
    for start in range(0, len(heads), HEADS_PER_IMPORT):
        batch = heads[start : start + HEADS_PER_IMPORT]
        on = {head.head_id for head in [*state.store.heads(spec.key), *batch]}
        candidates = [c for c in listed if c.experiment == spec.key and c.base_head in on]
        names = sorted({cid for head in batch for cid in (head.head_id, head.outer_state) if cid is not None})
        lineage = Lineage(
            network_id=state.network.network_id,
            experiment=spec.key,
            heads=tuple(batch),
            candidates=tuple(candidates),
            blobs={ContentId(cid): await upstream.blob(ContentId(cid)) for cid in names},
        )
        # off the event loop: the checks (every signature, every blob's hash) and the writes take a while
        report = await state.offload(import_lineage, state.store, state.blobs, history, lineage, state.clock.now_ms())
        included = {c.candidate_id for c in candidates}
        listed = [c for c in listed if c.candidate_id not in included]
        for head in batch[len(batch) - report.heads :]:
            head_taken(state, head)
        taken += report.heads
    cursors.candidates[at] = since
    log.info("%s: took %d heads from %s, up to window %d", spec.key, taken, upstream.url, newest.window)
    return taken


async def _mirror_verdicts(state: EdgeState, upstream: Upstream, key: ExperimentKey, cursors: _Cursors) -> None:
    for verdict in await upstream.verdicts(key):
        seen = (verdict.candidate_id, verdict.validator_key)
        if seen in cursors.verdicts or state.store.counted_verdict(key, ContentId(verdict.candidate_id)):
            continue
        try:
            counted, _ = accept_verdicts(state, [verdict.to_wire()], route=key)
            if not counted:  # held as one validator's vote: the others that made it count upstream
                cid = ContentId(verdict.candidate_id)
                votes = [
                    v.to_wire() for v in await upstream.votes(key, cid) if v.validator_key != verdict.validator_key
                ]
                if votes:
                    accept_verdicts(state, votes, route=key)
        except NotFound:
            continue  # its candidate is not here yet (its window is open, or listed later)
        except (ProtocolError, Conflict) as exc:
            log.warning("%s: a verdict from %s refused: %s", key, upstream.url, exc)
        if len(cursors.verdicts) >= MAX_SEEN_VERDICTS:
            cursors.verdicts.clear()
        cursors.verdicts.add(seen)


async def _mirror_evaluations(state: EdgeState, upstream: Upstream, key: ExperimentKey, cursors: _Cursors) -> None:
    at = (upstream.url, key)
    for evaluation in await upstream.evaluations(key, cursors.evaluations.get(at, 0)):
        try:
            accept_evaluation(state, evaluation.to_wire(), route=key)
        except NotFound:
            return  # its head is not mirrored yet: it and those after it wait for the next round
        except ProtocolError as exc:
            log.warning("%s: an evaluation from %s refused: %s", key, upstream.url, exc)
        cursors.evaluations[at] = evaluation.window


async def _mirror_orders(state: EdgeState, upstream: Upstream, key: ExperimentKey) -> None:
    last = state.store.run_state(key).sequence
    for signed in sorted(await upstream.orders(key), key=lambda signed: signed.order.sequence):
        if signed.order.sequence <= last:
            continue  # applied here already (mirrored before, or submitted to this edge too)
        try:
            await accept_order(state, signed, route=key)
        except NotFound:
            return  # a rollback to a head not mirrored yet: it and the orders after it wait
        except (ProtocolError, Conflict) as exc:
            log.warning("%s: a run-control order from %s refused: %s", key, upstream.url, exc)
            continue
        last = signed.order.sequence
        log.info("%s: run control %s (sequence %d) taken from %s", key, signed.order.action, last, upstream.url)


async def follow(state: EdgeState, urls: list[str]) -> None:
    """Follow the first of ``urls`` that answers (``mirror_once`` after each change of its activity),
    backing off and moving to the next on failure; runs until cancelled."""
    backoff = Backoff(initial_s=0.5, max_s=30.0)
    cursors = _Cursors()
    tokens = state.settings.follow_tokens
    at = 0
    async with httpx.AsyncClient(timeout=ACTIVITY_WAIT_S + 30) as http:
        while True:
            upstream = Upstream(http, urls[at], state.settings.max_artifact_bytes, tokens.get(urls[at]))
            try:
                since = await upstream.activity(None)  # at once: the token before what it mirrors
                while True:
                    await mirror_once(state, upstream, cursors)
                    backoff.reset()
                    since = await upstream.activity(since)
            except (UpstreamError, ProtocolError, Conflict) as exc:
                log.warning("following %s: %s", upstream.url, exc)
            at = (at + 1) % len(urls)
            await asyncio.sleep(backoff.next_delay_s())
