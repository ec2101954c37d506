"""``Uploads``: artifacts staged in chunks (``protocol.uploads``) until an envelope publishes them.

A model whose artifact is too large for one request (or one relay frame) reaches the edge as a
staged upload, keyed by its content id within an experiment, then a publish (candidate, head, outer
state) names it with an envelope that carries no bytes, and ``intake`` checks it exactly as if it had
come inline. Until then it is not an artifact: nothing serves it, and it is deleted once stored (a
refused publish leaves it to a corrected retry, or to expiry).

Each chunk is taken whole (read into memory, at most ``upload_chunk_bytes``) and appended only if
it starts where the stage ends, so a broken connection leaves the stage as it was before that chunk.
The bytes are hashed as they arrive; the last one checks the sha256 against the content id and a
mismatch discards the stage (422).

Bounded against hostile clients: a stage counts its declared size (at least one chunk, so tiny
stages cannot be opened by the thousand) from its first chunk on against its client address's
budget (``upload_address_bytes``) and the edge's (``upload_stage_bytes``), past which 507; a stage
untouched for ``upload_idle_s`` is dropped. A reservation is paid for in bytes sent: a stage whose
bytes fall behind ``upload_min_bytes_per_s`` of its age past ``upload_grace_s`` (a stalled upload,
or a complete one nobody publishes) gives way to a new stage that needs its room, the furthest
behind first, so a few addresses that open stages and send nothing hold the staging space for one
grace, not for ``upload_idle_s`` (its client finds no stage and starts again at 0). Stages are this edge's own, in memory and in files under
``data_dir/uploads`` (those an edge left behind are deleted at start-up once as old as that): behind
several edges a client must stage and publish on the same one (its requests name the stage,
``protocol.uploads.UPLOAD_HEADER``, for the balancer to keep them there), and an edge restart loses
its partial uploads (clients start again at offset 0).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from protocol.clock import SYSTEM_CLOCK, Clock
from protocol.errors import IntegrityError, TooLarge
from protocol.ids import ContentId, ExperimentKey
from protocol.uploads import OFFSET_HEADER

from .errors import Conflict, NotFound, QuotaExceeded
from .settings import Settings

__all__ = ["Uploads"]


@dataclass
class _Stage:
    path: Path
    total: int
    address: str
    charge: int  # what it counts against the budgets
    touched_s: float
    opened_s: float
    received: int = 0
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    lock: anyio.Lock = field(default_factory=anyio.Lock)


class Uploads:
    def __init__(self, root: Path, settings: Settings, clock: Clock = SYSTEM_CLOCK) -> None:
        root.mkdir(parents=True, exist_ok=True)
        stale = time.time() - settings.upload_idle_s
        for orphan in root.iterdir():  # of an edge that stopped (their hashes were in its memory)
            if orphan.stat().st_mtime < stale:
                orphan.unlink(missing_ok=True)
        self.root, self.settings, self.clock = root, settings, clock
        self._prefix = secrets.token_hex(4)  # another edge on this directory names its files apart
        self._stages: dict[tuple[ExperimentKey, ContentId], _Stage] = {}

    def staged_bytes(self) -> int:
        """What the stages count against the edge's budget (``dtn_staged_upload_bytes``)."""
        return sum(stage.charge for stage in self._stages.values())

    def offset(self, key: ExperimentKey, cid: ContentId) -> tuple[int, int | None]:
        """How many bytes of ``cid`` are staged, and of how many (``None``: no stage, start at 0)."""
        stage = self._live(key, cid)
        return (0, None) if stage is None else (stage.received, stage.total)

    def expect(self, key: ExperimentKey, cid: ContentId, start: int, total: int, address: str, limit: int) -> None:
        """Check, before its body is read, that a chunk from ``start`` of a ``total``-byte artifact (at most
        ``limit``) sent from ``address`` can be taken; a first chunk opens the stage."""
        stage = self._live(key, cid)
        if stage is None:
            self._open(key, cid, start, total, address, limit)
        elif start != stage.received or total != stage.total:
            raise self._elsewhere(cid, stage)

    async def append(self, key: ExperimentKey, cid: ContentId, start: int, chunk: bytes) -> int:
        """Append ``chunk``, bytes ``start`` on, to the stage ``expect`` checked; the offset after it.
        ``Conflict`` unless it still starts where the stage ends (another request may have come first)."""
        stage = self._live(key, cid)
        if stage is None:
            raise self._elsewhere(cid, None)
        async with stage.lock:
            if self._stages.get((key, cid)) is not stage or start != stage.received:
                raise self._elsewhere(cid, stage)
            stage.touched_s = self.clock.monotonic_s()
            await anyio.to_thread.run_sync(_append, stage.path, chunk)
            stage.digest.update(chunk)
            stage.received += len(chunk)
            if stage.received == stage.total and (got := f"sha256:{stage.digest.hexdigest()}") != cid:
                self.discard(key, cid)
                raise IntegrityError(f"the {stage.total} bytes uploaded are {got}, not {cid}; the upload is discarded")
            return stage.received

    async def take(self, key: ExperimentKey, cid: ContentId) -> bytes:
        """The complete artifact staged as ``cid``, for ``intake`` to check and store."""
        stage = self._live(key, cid)
        if stage is None:
            raise NotFound(f"no upload of {cid} is staged on this edge for {key}; PUT it to its uploads path first")
        if stage.received < stage.total:
            raise Conflict(f"the upload of {cid} holds {stage.received} of {stage.total} bytes")
        return await anyio.Path(stage.path).read_bytes()

    def discard(self, key: ExperimentKey, cid: ContentId) -> None:
        """Forget the stage of ``cid`` and delete its file (a no-op when there is none)."""
        stage = self._stages.pop((key, cid), None)
        if stage is not None:
            stage.path.unlink(missing_ok=True)

    def _live(self, key: ExperimentKey, cid: ContentId) -> _Stage | None:
        """The stage of ``cid``, once the stages untouched for ``upload_idle_s`` are dropped."""
        stale = self.clock.monotonic_s() - self.settings.upload_idle_s
        for old in [k for k, stage in self._stages.items() if stage.touched_s < stale and not stage.lock.locked()]:
            self.discard(*old)
        return self._stages.get((key, cid))

    def _open(self, key: ExperimentKey, cid: ContentId, start: int, total: int, address: str, limit: int) -> None:
        if start != 0:
            raise self._elsewhere(cid, None)
        if total > limit:
            raise TooLarge(f"an artifact of {total} bytes; {key}'s artifacts are at most {limit}")
        charge = max(total, self.settings.upload_chunk_bytes)
        self._make_room(charge, self.settings.upload_address_bytes, address)
        self._make_room(charge, self.settings.upload_stage_bytes)
        held = sum(stage.charge for stage in self._stages.values() if stage.address == address)
        if held + charge > self.settings.upload_address_bytes:
            raise QuotaExceeded(
                f"{address} holds {held} bytes of staged uploads; another {charge} would pass "
                f"{self.settings.upload_address_bytes} (publish or wait for them to expire)"
            )
        if self.staged_bytes() + charge > self.settings.upload_stage_bytes:
            raise QuotaExceeded(f"this edge's staging space is full ({self.staged_bytes()} bytes); try again later")
        name = f"{self._prefix}-{hashlib.sha256(key.encode()).hexdigest()[:16]}-{cid.removeprefix('sha256:')}"
        now = self.clock.monotonic_s()
        stage = _Stage(self.root / name, total, address, charge, now, now)
        stage.path.write_bytes(b"")
        self._stages[(key, cid)] = stage

    def _make_room(self, charge: int, budget: int, address: str | None = None) -> None:
        """Drop stages (``address``'s only, when given) behind the minimum pace, the furthest behind
        first, until ``charge`` more bytes fit in ``budget`` or none is behind."""
        now = self.clock.monotonic_s()
        mine = {k: st for k, st in self._stages.items() if address is None or st.address == address}
        held = sum(st.charge for st in mine.values())
        behind = sorted(
            ((k, st) for k, st in mine.items() if _deficit(st, now, self.settings) > 0 and not st.lock.locked()),
            key=lambda item: -_deficit(item[1], now, self.settings),
        )
        for key, stage in behind:
            if held + charge <= budget:
                return
            self.discard(*key)
            held -= stage.charge

    @staticmethod
    def _elsewhere(cid: ContentId, stage: _Stage | None) -> Conflict:
        """The refusal of a chunk that does not start where the stage of ``cid`` ends."""
        held, total = (0, None) if stage is None else (stage.received, stage.total)
        return Conflict(
            f"this edge holds {held} bytes of {cid} (of {total or 'unknown'}); send it on from byte {held}",
            {OFFSET_HEADER: str(held)},
        )


def _deficit(stage: _Stage, now_s: float, settings: Settings) -> float:
    """Bytes ``stage`` is behind ``upload_min_bytes_per_s`` of its age past ``upload_grace_s`` (≤ 0: on pace)."""
    owed = settings.upload_min_bytes_per_s * (now_s - stage.opened_s - settings.upload_grace_s)
    return min(owed, stage.total) - stage.received if stage.received < stage.total else owed - stage.total


def _append(path: Path, chunk: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(chunk)
