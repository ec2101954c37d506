"""Staged uploads and ranged downloads as sans-I/O plans: what to ask the edge next, and what an answer
means, written once for the native client (sync httpx) and the browser peer (async ``fetch``).

A plan does no I/O. Its driver loops: ``next_step()`` is a ``Request`` to send, a ``Wait`` to sleep
through or ``Done``; the driver sends the request its own way and hands back what happened,
``receive(response)`` or ``broken(reason)`` (the transfer failed: no answer, or one cut short). A
plan raises ``TransferFailed`` when it gives up, ``IntegrityError`` when downloaded bytes are not the
content id asked for. Drivers add what is theirs to each request: the admission token, a
validator's read proof.

The rules (``RetryPolicy``), the same for every client:

- A transfer that fails (no answer, or ``TRANSIENT`` from a balancer or an edge going away) is sent
  again after ``protocol.backoff`` delays; ``tries`` failures in a row end the plan. Any other answer
  resets the count.
- A staged upload (``protocol.uploads``) asks the edge's offset first, then sends chunks from it, the
  next from the offset each answer names. A chunk that failed to travel is sent again as it was: the
  edge takes a chunk whole or not at all, and answers 409 to one it already took, after which the plan
  asks the offset again and goes on from there (``conflicts`` times per upload). Once the edge holds
  every byte, the envelope without artifact bytes is published; a publish answered ``STAGE_MISSING``
  (it reached an edge without the stage) stages again from the offset that edge reports and publishes
  once more (``restages`` times). Any other refusal ends the plan.
- A ranged download asks from the bytes it holds (``Range: bytes=<have>-``, or pieces of
  ``piece_bytes``); after a break it asks again from there, keeping what arrived. A 200 is the whole
  artifact from byte 0. Once complete, the bytes must hash to the content id asked for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from .backoff import Backoff
from .errors import InvalidMessage, ProtocolError
from .hashing import content_id, verify_content
from .ids import ExperimentKey
from .uploads import STAGE_MISSING, UPLOAD_HEADER, content_range, parse_content_range, upload_path

__all__ = [
    "TRANSIENT",
    "Done",
    "Exchange",
    "RangedDownload",
    "Request",
    "Response",
    "RetryPolicy",
    "StagedUpload",
    "TransferFailed",
    "Wait",
]

TRANSIENT = frozenset({502, 503, 504})  # answered by a balancer or an edge going away: sent again


@dataclass(frozen=True)
class Request:
    """One request for the driver to send to the edge (``path`` from its root)."""

    method: str
    path: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | None = None


@dataclass(frozen=True)
class Response:
    """An answer as the plan reads it: header names in lower case."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> dict[str, object]:
        try:
            value = json.loads(self.body)
        except ValueError as exc:
            raise InvalidMessage(f"expected a JSON answer, got {self.body[:80]!r}") from exc
        if not isinstance(value, dict):
            raise InvalidMessage(f"expected a JSON object, got {type(value).__name__}")
        return value


@dataclass(frozen=True)
class Wait:
    """Sleep ``seconds`` before the next step: ``reason`` is the failure that asks for it."""

    seconds: float
    reason: str


@dataclass(frozen=True)
class Done:
    """The plan succeeded: ``value`` is its result (a ``Response``, or a download's bytes)."""

    value: object


class TransferFailed(ProtocolError):
    """A plan gave up: ``response`` is the answer that ended it, ``None`` when transfers kept failing."""

    def __init__(self, reason: str, response: Response | None = None) -> None:
        super().__init__(reason)
        self.response = response


@dataclass(frozen=True)
class RetryPolicy:
    """How often a plan tries before it gives up, and how long it waits between tries."""

    tries: int = 4  # a request that fails to travel this often in a row ends the plan
    conflicts: int = 3  # chunks answered 409 (resumed from the edge's offset) per upload
    restages: int = 3  # publishes that found no stage (staged again) per upload
    initial_s: float = 0.5
    max_s: float = 4.0

    @classmethod
    def retrying(cls, retries: int) -> RetryPolicy:
        """``retries`` of each kind: ``retries + 1`` tries of a request."""
        return cls(tries=retries + 1, conflicts=retries, restages=retries)

    def backoff(self) -> Backoff:
        return Backoff(initial_s=self.initial_s, max_s=self.max_s)


Step = Request | Wait | Done


class _Plan:
    """What every plan shares: failed transfers, counted and waited for."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self._backoff = policy.backoff()
        self._failures = 0
        self._wait: Wait | None = None
        self._done: Done | None = None

    def next_step(self) -> Step:
        if self._wait is not None:
            wait, self._wait = self._wait, None
            return wait
        if self._done is not None:
            return self._done
        return self._request()

    def receive(self, response: Response) -> None:
        """The answer to the last ``Request``."""
        self._check_sent()
        if response.status in TRANSIENT:
            self._failed(f"HTTP {response.status}", response)
            return
        self._progressed()
        self._answer(response)

    def broken(self, reason: str) -> None:
        """The last ``Request`` got no (complete) answer: ``reason`` says why."""
        self._check_sent()
        self._failed(reason, None)

    def _progressed(self) -> None:
        """An answer came: the next failure is the first in a row again."""
        self._failures = 0
        self._backoff.reset()

    def _failed(self, reason: str, response: Response | None) -> None:
        self._failures += 1
        if self._failures >= self.policy.tries:
            tries = f"{self._failures} tries in a row failed, the last with {reason}"
            raise TransferFailed(f"{self._what()}: {tries}", response)
        self._wait = Wait(self._backoff.next_delay_s(), reason)

    def _check_sent(self) -> None:
        if self._done is not None or self._wait is not None:
            raise RuntimeError("no request is outstanding")

    def _finish(self, value: object) -> None:
        self._done = Done(value)

    def _refused(self, response: Response) -> TransferFailed:
        return TransferFailed(f"{self._what()}: refused with HTTP {response.status}", response)

    def _request(self) -> Request:
        raise NotImplementedError

    def _answer(self, response: Response) -> None:
        raise NotImplementedError

    def _what(self) -> str:
        raise NotImplementedError


class Exchange(_Plan):
    """One request, sent again while it fails to travel; ``Done(response)`` with whatever the edge
    answers otherwise, refusals included (the driver reads them)."""

    def __init__(self, request: Request, policy: RetryPolicy | None = None) -> None:
        super().__init__(policy or RetryPolicy())
        self.request = request

    def _request(self) -> Request:
        return self.request

    def _answer(self, response: Response) -> None:
        self._finish(response)

    def _what(self) -> str:
        return f"{self.request.method} {self.request.path}"


class StagedUpload(_Plan):
    """Stage ``artifact`` on the edge in chunks, then publish ``envelope`` (its descriptor without the
    artifact) by ``POST publish_path``; ``Done(response)`` with the publish's answer. Every request names
    the stage (``UPLOAD_HEADER``)."""

    def __init__(
        self,
        key: ExperimentKey,
        artifact: bytes,
        publish_path: str,
        envelope: bytes,
        *,
        chunk_bytes: int,
        policy: RetryPolicy | None = None,
    ) -> None:
        super().__init__(policy or RetryPolicy())
        self.cid = content_id(artifact)
        self._artifact, self._publish_path, self._envelope = artifact, publish_path, envelope
        self._path, self._named = upload_path(key, self.cid), {UPLOAD_HEADER: self.cid}
        self._chunk_bytes = chunk_bytes
        self._offset: int | None = None  # None: ask the edge
        self.conflicts = self.restages = 0

    def _request(self) -> Request:
        total = len(self._artifact)
        if self._offset is None:
            return Request("GET", self._path, self._named)
        if self._offset < total:
            end = min(self._offset + self._chunk_bytes, total)
            headers = {"content-range": content_range(self._offset, end, total)} | self._named
            return Request("PUT", self._path, headers, self._artifact[self._offset : end])
        return Request("POST", self._publish_path, self._named, self._envelope)

    def _answer(self, response: Response) -> None:
        total = len(self._artifact)
        asked = "GET" if self._offset is None else "PUT" if self._offset < total else "POST"
        if asked == "POST":
            if response.status < 300:
                self._finish(response)
            elif response.status in STAGE_MISSING and self.restages < self.policy.restages:
                self.restages += 1
                self._offset = None  # stage again, from what the edge that answers now holds
            else:
                raise self._refused(response)
        elif asked == "PUT" and response.status == 409 and self.conflicts < self.policy.conflicts:
            self.conflicts += 1
            self._offset = None  # the edge holds another offset: ask it
        elif response.status >= 300:
            raise self._refused(response)
        else:
            held = response.json()
            self._offset = _count(held.get("offset"), "an offset", 0, total)
            if asked == "GET":
                chunk_bytes = _count(held.get("chunk_bytes"), "a chunk size", 1, None)
                self._chunk_bytes = min(self._chunk_bytes, chunk_bytes)

    def _what(self) -> str:
        return f"staging {self.cid}"


def _count(value: object, what: str, least: int, most: int | None) -> int:
    """``value`` from an edge's answer, an integer from ``least`` to ``most``; else ``InvalidMessage``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < least or (most is not None and value > most):
        raise InvalidMessage(f"the edge answered {what} of {value!r}")
    return value


class RangedDownload(_Plan):
    """Download the artifact ``cid`` at ``path``, from the ``have`` bytes already held (a partial file):
    in pieces of ``piece_bytes`` when given, else whatever one answer carries; ``Done(bytes)``, verified.

    A driver that streams an answer's body hands it over as it arrives: ``begin`` with its status and
    headers, ``feed`` per chunk, ``end``; ``receive`` does all three for a whole answer."""

    def __init__(
        self,
        path: str,
        cid: str,
        *,
        have: bytes = b"",
        piece_bytes: int | None = None,
        policy: RetryPolicy | None = None,
    ) -> None:
        super().__init__(policy or RetryPolicy())
        self.path, self.cid, self._piece_bytes = path, cid, piece_bytes
        self._data = bytearray(have)
        self._total: int | None = None
        self._streaming = False

    @property
    def have(self) -> int:
        """How many bytes of the artifact are held."""
        return len(self._data)

    def _request(self) -> Request:
        have = len(self._data)
        if self._piece_bytes is not None:
            return Request("GET", self.path, {"range": f"bytes={have}-{have + self._piece_bytes - 1}"})
        return Request("GET", self.path, {"range": f"bytes={have}-"} if have else {})

    def begin(self, status: int, headers: Mapping[str, str]) -> int:
        """A 2xx answer's status and headers, its body to follow (any other answer goes to ``receive``
        whole); returns the offset that body starts at: 0 drops the bytes held so far."""
        self._check_sent()
        if not 200 <= status < 300:
            raise ValueError(f"begin takes a 2xx answer, not {status}: receive it whole")
        self._progressed()
        return self._start(status, headers)

    def feed(self, chunk: bytes) -> None:
        """Body bytes of the answer ``begin`` took, as they arrive."""
        if not self._streaming:
            raise RuntimeError("feed before begin")
        self._data += chunk
        if self._total is not None and len(self._data) > self._total:
            raise InvalidMessage(f"{self.path} sent more than its {self._total} bytes")

    def end(self) -> None:
        """The body of the answer ``begin`` took ended as it should."""
        if not self._streaming:
            raise RuntimeError("end before begin")
        self._streaming = False
        if self._total is None or len(self._data) >= self._total:
            self._complete()

    def broken(self, reason: str) -> None:
        self._streaming = False  # what arrived before the break is kept
        super().broken(reason)

    def _answer(self, response: Response) -> None:
        if response.status >= 300:
            raise self._refused(response)
        self._start(response.status, response.headers)
        self.feed(response.body)
        self.end()

    def _start(self, status: int, headers: Mapping[str, str]) -> int:
        if status == 206:
            start, _, total = parse_content_range(headers.get("content-range"))
            if start != len(self._data):
                raise InvalidMessage(f"asked for {self.path} from byte {len(self._data)}, got bytes from {start}")
            self._total = total
        else:  # the whole artifact, from byte 0
            self._data.clear()
            self._total = None
        self._streaming = True
        return len(self._data)

    def _complete(self) -> None:
        data = bytes(self._data)
        self._data.clear()  # bytes that do not hash to the content id are dropped, not resumed
        verify_content(data, self.cid)
        self._finish(data)

    def _what(self) -> str:
        return f"downloading {self.cid}"
