"""``EdgeSession``: the browser peer's HTTP to the edge, over its ``Bridge`` (``fetch`` in Pyodide).

Reads are one request each: a refusal is ``HttpError``, a failed transfer the bridge's ``OSError``,
and the peer's session starts again (``BrowserPeer.run``). Head artifacts and staged candidates
follow the plans of ``protocol.transfers``, which the native client drives too: a head larger than
``piece_bytes`` comes in ``Range`` pieces, a broken piece is asked again, the bytes are verified by
content id; a candidate is staged in chunks from the edge's offset and published by ``POST
…/candidates`` naming its stage, staged again where a publish finds none. This module only sends
what a plan asks and sleeps when it says to wait.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from protocol.envelope import pack_envelope
from protocol.ids import ExperimentKey, HeadId
from protocol.messages import Candidate, HeadDescriptor
from protocol.transfers import Done, RangedDownload, Response, StagedUpload, Wait
from protocol.uploads import UPLOAD_CHUNK_BYTES

from .bridge import Bridge, HttpAnswer

__all__ = ["EdgeSession", "HttpError"]


class HttpError(Exception):
    """The edge refused a read: ``status`` is its answer's."""

    def __init__(self, status: int, url: str) -> None:
        super().__init__(f"HTTP {status} for {url}")
        self.status = status


class EdgeSession:
    def __init__(
        self,
        bridge: Bridge,
        edge_url: str,
        token: str | None = None,
        *,
        piece_bytes: int = UPLOAD_CHUNK_BYTES,
        counted: Callable[[int, int], None] = lambda received, sent: None,
        retrying: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """``counted(received, sent)``: the body bytes of each request, both ways; ``retrying(reason)``:
        a plan waits before it sends again."""
        self.bridge, self.edge_url, self.token, self.piece_bytes = bridge, edge_url, token, piece_bytes
        self._counted, self._retrying = counted, retrying

    async def request(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None
    ) -> HttpAnswer:
        """``method`` ``path`` on the edge, with the admission token where the network needs one:
        whatever it answers; ``OSError`` when the transfer fails."""
        if self.token is not None:
            headers = {**(headers or {}), "authorization": f"Bearer {self.token}"}
        answer = await self.bridge.request(method, self.edge_url + path, headers or {}, body)
        self._counted(len(answer.body), len(body or b""))
        return answer

    async def fetch(self, path: str, headers: dict[str, str] | None = None) -> bytes:
        """The body of ``GET path``; ``HttpError`` when the edge refuses."""
        answer = await self.request("GET", path, headers)
        if answer.status >= 400:
            raise HttpError(answer.status, self.edge_url + path)
        return answer.body

    async def fetch_json(self, path: str) -> Any:
        return json.loads(await self.fetch(path))

    async def current_head(self, key: ExperimentKey) -> HeadDescriptor | None:
        """The experiment's current head as the edge serves it; ``None`` before genesis."""
        try:
            return HeadDescriptor.from_wire(await self.fetch_json(f"/v1/experiments/{key}/head"))
        except HttpError as exc:
            if exc.status == 404:
                return None
            raise

    async def download(self, cid: HeadId, max_bytes: int) -> bytes:
        """The artifact ``cid`` (at most ``max_bytes``), verified: one GET when that fits in one piece,
        else piece by piece (``RangedDownload``)."""
        piece = self.piece_bytes if max_bytes > self.piece_bytes else None
        data = await self._drive(RangedDownload(f"/v1/artifacts/{cid}", cid, piece_bytes=piece))
        assert isinstance(data, bytes)
        return data

    async def head_delta(self, key: ExperimentKey, head_id: HeadId, base: HeadId, max_bytes: int) -> bytes | None:
        """Head ``head_id`` as a delta from its parent ``base`` (``protocol.head_delta``; unchecked): None
        when the edge serves none, the transfer fails or it sends more than ``max_bytes`` (the caller
        downloads the head instead)."""
        try:
            answer = await self.request("GET", f"/v1/experiments/{key}/heads/{head_id}/delta?from={base}")
        except OSError:
            return None
        return answer.body if answer.status == 200 and len(answer.body) <= max_bytes else None

    async def publish_staged(self, key: ExperimentKey, candidate: Candidate, artifact: bytes) -> str:
        """Stage the candidate's ``artifact`` and publish it by ``POST …/candidates`` (``StagedUpload``, as
        native trainers do), not on the relay: the POST names the stage, so a balancer in front of
        several edges sends it where the chunks went, which need not be the relay's edge. Returns the
        candidate id the edge stored, which the relay's ``candidate.ack`` names otherwise."""
        path, envelope = f"/v1/experiments/{key}/candidates", pack_envelope(candidate.to_wire(), b"")
        published = await self._drive(StagedUpload(key, artifact, path, envelope, chunk_bytes=UPLOAD_CHUNK_BYTES))
        assert isinstance(published, Response)
        return str(published.json()["candidate_id"])

    async def _drive(self, plan: RangedDownload | StagedUpload) -> object:
        """Send what ``plan`` asks until it is done (its ``TransferFailed`` or ``IntegrityError`` ends
        the peer's session); its result."""
        while not isinstance(step := plan.next_step(), Done):
            if isinstance(step, Wait):
                self._retrying(step.reason)
                await asyncio.sleep(step.seconds)
                continue
            try:
                answer = await self.request(step.method, step.path, dict(step.headers), step.body)
            except OSError as exc:
                plan.broken(str(exc))
                continue
            plan.receive(Response(answer.status, answer.headers, answer.body))
        return step.value
