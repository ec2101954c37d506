"""The edge's durable state: heads (canonical, and proposed ones with their attestations), the
validators' evaluations of heads, candidates, leases, verdicts, tokens, peers, its own key.

Everything a peer needs after an edge restart lives here or in the blob store. ``EdgeStore`` holds
every query, written once in the SQL that SQLite and PostgreSQL share, over a ``Database``: the
small engine interface (a transaction, a query, close; ``server.store_engine``) that each engine implements.

    Store(path)          the embedded default: SQLite in one file (``server.store_sqlite``)
    PostgresStore(url)   PostgreSQL, shared by several edges (``server.store_postgres``)
    open_store(...)      the one the edge's settings name (``store_url``; empty: SQLite)

Writes commit durably before the caller acknowledges anything, and a write transaction excludes
every other writer of the same database, in any process: what makes a lease's shards exclusive
across edges (``grant_lease``). The schema has a version; a database of another version is refused
with a clear error, never half-read. A table added beside the others (none changed) is created when
an older database of the same version opens: the version moves when a table changes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from protocol.ids import ContentId, ExperimentKey, HeadId, LeaseId, PeerId
from protocol.messages import Attestation, Candidate, Evaluation, HeadDescriptor, Lease, Verdict
from protocol.network_revisions import SignedNetworkRevision
from protocol.run_control import RunState, SignedRunControl
from protocol.signing import b64encode

from .errors import Conflict
from .store_engine import Database, Run
from .store_sqlite import SqliteDatabase

__all__ = ["SCHEMA", "SCHEMA_VERSION", "EdgeStore", "PostgresStore", "Store", "open_store"]

# The shared dialect: ``?`` placeholders, ``rowid`` for arrival order, ``ON CONFLICT`` upserts,
# ``IS NOT DISTINCT FROM``, ``RETURNING``, ``"window"`` quoted (a reserved word in PostgreSQL).
# ``server.store_postgres`` maps the few differences.
SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS heads (
    experiment TEXT NOT NULL, head_id TEXT NOT NULL, parent TEXT, "window" INTEGER NOT NULL,
    descriptor TEXT NOT NULL, received_at_ms INTEGER NOT NULL, PRIMARY KEY (experiment, head_id));
CREATE TABLE IF NOT EXISTS current_heads (experiment TEXT PRIMARY KEY, head_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS candidates (
    experiment TEXT NOT NULL, candidate_id TEXT NOT NULL, base_head TEXT NOT NULL, peer_id TEXT NOT NULL,
    lease_id TEXT NOT NULL, descriptor TEXT NOT NULL, received_at_ms INTEGER NOT NULL,
    size_bytes INTEGER NOT NULL, blob_kept INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (experiment, candidate_id));
CREATE INDEX IF NOT EXISTS candidates_by_base ON candidates (experiment, base_head);
CREATE UNIQUE INDEX IF NOT EXISTS candidates_by_lease ON candidates (lease_id);
CREATE INDEX IF NOT EXISTS candidates_by_id ON candidates (candidate_id);
CREATE INDEX IF NOT EXISTS heads_by_id ON heads (head_id);
CREATE TABLE IF NOT EXISTS leases (
    lease_id TEXT PRIMARY KEY, experiment TEXT NOT NULL, peer_id TEXT NOT NULL, base_head TEXT NOT NULL,
    descriptor TEXT NOT NULL, expires_at_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS leases_by_window ON leases (experiment, base_head);
CREATE TABLE IF NOT EXISTS lease_holders (
    lease_id TEXT PRIMARY KEY, experiment TEXT NOT NULL, "window" INTEGER NOT NULL, peer_id TEXT NOT NULL,
    principal TEXT, address TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS lease_holders_by_window ON lease_holders (experiment, "window");
CREATE TABLE IF NOT EXISTS released_leases (lease_id TEXT PRIMARY KEY, released_at_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS verdicts (
    experiment TEXT NOT NULL, candidate_id TEXT NOT NULL, peer_id TEXT NOT NULL, accepted INTEGER NOT NULL,
    descriptor TEXT NOT NULL, examples INTEGER NOT NULL, PRIMARY KEY (experiment, candidate_id));
CREATE TABLE IF NOT EXISTS verdict_votes (
    experiment TEXT NOT NULL, candidate_id TEXT NOT NULL, validator_key TEXT NOT NULL, descriptor TEXT NOT NULL,
    PRIMARY KEY (experiment, candidate_id, validator_key));
CREATE TABLE IF NOT EXISTS tokens (
    digest TEXT PRIMARY KEY, role TEXT NOT NULL, label TEXT NOT NULL, issued_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS proposals (
    experiment TEXT NOT NULL, head_id TEXT NOT NULL, parent TEXT, validator_key TEXT NOT NULL,
    descriptor TEXT NOT NULL, received_at_ms INTEGER NOT NULL, PRIMARY KEY (experiment, head_id));
CREATE INDEX IF NOT EXISTS proposals_by_parent ON proposals (experiment, parent);
CREATE TABLE IF NOT EXISTS validator_uploads (
    experiment TEXT NOT NULL, parent TEXT NOT NULL, validator_key TEXT NOT NULL, content_id TEXT NOT NULL,
    size_bytes INTEGER NOT NULL, PRIMARY KEY (experiment, parent, validator_key, content_id));
CREATE TABLE IF NOT EXISTS attestations (
    experiment TEXT NOT NULL, head_id TEXT NOT NULL, validator_key TEXT NOT NULL, descriptor TEXT NOT NULL,
    PRIMARY KEY (experiment, head_id, validator_key));
CREATE TABLE IF NOT EXISTS evaluations (
    experiment TEXT NOT NULL, head_id TEXT NOT NULL, validator_key TEXT NOT NULL, split TEXT NOT NULL,
    "window" INTEGER NOT NULL, descriptor TEXT NOT NULL, PRIMARY KEY (experiment, head_id, validator_key, split));
CREATE INDEX IF NOT EXISTS evaluations_by_window ON evaluations (experiment, "window");
CREATE TABLE IF NOT EXISTS token_keys (
    digest TEXT NOT NULL, peer_id TEXT NOT NULL, bound_at_ms INTEGER NOT NULL, PRIMARY KEY (digest, peer_id));
CREATE TABLE IF NOT EXISTS token_limits (digest TEXT PRIMARY KEY, max_keys INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS peers (
    peer_id TEXT PRIMARY KEY, kind TEXT NOT NULL, first_seen_ms INTEGER NOT NULL, last_seen_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS run_states (experiment TEXT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS run_orders (
    experiment TEXT NOT NULL, sequence INTEGER NOT NULL, signed TEXT NOT NULL, applied_at_ms INTEGER NOT NULL,
    PRIMARY KEY (experiment, sequence));
CREATE TABLE IF NOT EXISTS network_revisions (
    number INTEGER PRIMARY KEY, signed TEXT NOT NULL, applied_at_ms INTEGER NOT NULL);
"""

SCHEMA_VERSION = 3


def _head(text: object) -> HeadDescriptor:
    return HeadDescriptor.from_wire(json.loads(str(text)))


# given the canonical heads (genesis first) and last run-control sequence of each experiment: why a
# network revision must not apply, or ``None`` (``protocol.network_revisions.handover_refusal``)
HandoverCheck = Callable[[dict[ExperimentKey, list[HeadDescriptor]], dict[ExperimentKey, int]], str | None]


def _last_revision(run: Run) -> int:
    return int(run("SELECT COALESCE(MAX(number), 0) FROM network_revisions").fetchone()[0])


def _same_revision(run: Run, revision: int, what: str) -> None:
    """``Conflict`` when the store holds a network revision after ``revision``, the one ``what`` was
    checked against."""
    if (last := _last_revision(run)) > revision:
        raise Conflict(
            f"{what} was certified under network revision {revision}, and the network is at revision {last} now: "
            "send it again under the revised network"
        )


def _run_state(text: object) -> RunState:
    return RunState.from_wire(json.loads(str(text)))


def _candidate(text: object) -> Candidate:
    return Candidate.from_wire(json.loads(str(text)))


def _lease(text: object) -> Lease:
    return Lease.from_wire(json.loads(str(text)))


def _released(lease_id: str) -> str:
    return f"lease {lease_id} was given back undelivered when its holder left: ask for a new lease"


PARSED_LEASES = 1 << 16  # leases kept parsed by id (a lease's descriptor never changes)


class EdgeStore:
    """Every query of the edge's state, over one ``Database``."""

    def __init__(self, database: Database) -> None:
        self._db = database
        self._parsed: dict[str, Lease] = {}  # lease id -> its descriptor, parsed once

    def _live_lease(self, lease_id: object, text: object) -> Lease:
        """The lease stored as ``text`` under ``lease_id``, parsed once: a window's every grant reads all
        its live leases, and parsing them each time made a window of n leases cost O(n²) parses (49 ms
        a lease at 1,000 a window: docs/results/2026-12-simulated-fleet.md)."""
        lease = self._parsed.get(str(lease_id))
        if lease is None:
            if len(self._parsed) >= PARSED_LEASES:
                self._parsed.clear()
            lease = self._parsed[str(lease_id)] = _lease(text)
        return lease

    def close(self) -> None:
        self._db.close()

    # -- the edge's own signing seed (edges sharing a database share it) -------------------------
    def edge_seed(self) -> bytes:
        with self._db.transaction() as run:
            row = run("SELECT value FROM settings WHERE key = 'edge_seed'").fetchone()
            if row is None:
                seed = os.urandom(32)
                run("INSERT INTO settings (key, value) VALUES ('edge_seed', ?)", seed)
                return seed
            return bytes(row[0])

    # -- validators' signatures over the network's terms (``protocol.network_pins``) -------------
    def keep_network_signature(self, validator_key: str, signature: str) -> None:
        """Hold ``signature`` (base64) as ``validator_key``'s (base64), replacing one held before."""
        with self._db.transaction() as run:
            run(
                "INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                f"network_signature/{validator_key}",
                signature.encode(),
            )

    def network_signatures(self) -> dict[str, str]:
        """The signatures held, by validator key (both base64)."""
        rows = self._db.query("SELECT key, value FROM settings WHERE key LIKE ?", "network_signature/%")
        return {str(key).removeprefix("network_signature/"): bytes(value).decode() for key, value in rows}

    # -- heads -----------------------------------------------------------------------------
    def promote_head(self, head: HeadDescriptor, now_ms: int, revision: int) -> bool:
        """Make ``head`` current if its parent is the current head; False if it already is current.
        ``revision`` is the network revision whose validators certified it: ``Conflict`` once the store
        holds a later one (applied meanwhile, by this edge or another sharing the store), whose
        validators may not be the same."""
        with self._db.transaction() as run:
            _same_revision(run, revision, f"head {head.head_id}")
            row = run("SELECT head_id FROM current_heads WHERE experiment = ?", head.experiment).fetchone()
            current = None if row is None else row[0]
            if current == head.head_id:
                return False
            if head.parent != current:
                raise Conflict(f"head parent {head.parent} is not the current head {current}")
            run(
                'INSERT INTO heads (experiment, head_id, parent, "window", descriptor, received_at_ms)'
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                head.experiment,
                head.head_id,
                head.parent,
                head.window,
                json.dumps(head.to_wire()),
                now_ms,
            )
            run(
                "INSERT INTO current_heads (experiment, head_id) VALUES (?, ?)"
                " ON CONFLICT (experiment) DO UPDATE SET head_id = excluded.head_id",
                head.experiment,
                head.head_id,
            )
            return True

    _CURRENT = "FROM current_heads c JOIN heads h ON h.experiment = c.experiment AND h.head_id = c.head_id"
    _CURRENT_HEAD = f"SELECT h.descriptor {_CURRENT} WHERE c.experiment = ?"

    def current_head(self, experiment: ExperimentKey) -> HeadDescriptor | None:
        rows = self._db.query(self._CURRENT_HEAD, experiment)
        return _head(rows[0][0]) if rows else None

    def heads(self, experiment: ExperimentKey) -> list[HeadDescriptor]:
        rows = self._db.query('SELECT descriptor FROM heads WHERE experiment = ? ORDER BY "window"', experiment)
        return [_head(r[0]) for r in rows]

    def head(self, experiment: ExperimentKey, head_id: HeadId) -> HeadDescriptor | None:
        rows = self._db.query("SELECT descriptor FROM heads WHERE experiment = ? AND head_id = ?", experiment, head_id)
        return _head(rows[0][0]) if rows else None

    # -- candidates ------------------------------------------------------------------------
    def add_candidate(self, candidate: Candidate, size_bytes: int, now_ms: int) -> bool:
        """Record a candidate; False when it was already there (an idempotent re-upload).

        Raises ``Conflict`` when its lease already delivered another candidate (one per lease), or was
        given back undelivered (``release_leases``)."""
        with self._db.transaction() as run:
            row = run("SELECT candidate_id FROM candidates WHERE lease_id = ?", candidate.lease_id).fetchone()
            if row is not None:
                if row[0] == candidate.candidate_id:
                    return False
                raise Conflict(f"lease {candidate.lease_id} already delivered candidate {row[0]}")
            if run("SELECT 1 FROM released_leases WHERE lease_id = ?", candidate.lease_id).fetchone() is not None:
                raise Conflict(_released(candidate.lease_id))
            run(
                "INSERT INTO candidates (experiment, candidate_id, base_head, peer_id, lease_id, descriptor,"
                " received_at_ms, size_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                candidate.experiment,
                candidate.candidate_id,
                candidate.base_head,
                candidate.peer_id,
                candidate.lease_id,
                json.dumps(candidate.to_wire()),
                now_ms,
                size_bytes,
            )
            return True

    def lease_delivered(self, lease_id: LeaseId) -> str | None:
        """The candidate id a lease delivered, if any; ``Conflict`` for a lease given back undelivered
        (``release_leases``): it delivers nothing."""
        rows = self._db.query("SELECT candidate_id FROM candidates WHERE lease_id = ?", lease_id)
        if rows:
            return str(rows[0][0])
        if self._db.query("SELECT 1 FROM released_leases WHERE lease_id = ?", lease_id):
            raise Conflict(_released(lease_id))
        return None

    def window_bytes(self, experiment: ExperimentKey, base_head: HeadId) -> int:
        """Bytes of candidate artifacts stored for one window."""
        rows = self._db.query(
            "SELECT COALESCE(SUM(size_bytes), 0) FROM candidates WHERE experiment = ? AND base_head = ?",
            experiment,
            base_head,
        )
        return int(rows[0][0])

    def retire_candidates(self, experiment: ExperimentKey, keep_windows: int) -> list[str]:
        """Candidate ids whose artifacts may go: their window is ``keep_windows`` or more heads behind
        the current head. They are marked as gone (descriptors and verdicts stay)."""
        with self._db.transaction() as run:
            row = run(f'SELECT h."window" {self._CURRENT} WHERE c.experiment = ?', experiment).fetchone()
            if row is None:
                return []
            rows = run(
                "UPDATE candidates SET blob_kept = 0 WHERE experiment = ? AND blob_kept = 1 AND base_head IN"
                ' (SELECT head_id FROM heads WHERE experiment = ? AND "window" <= ?) RETURNING candidate_id',
                experiment,
                experiment,
                int(row[0]) - keep_windows,
            ).fetchall()
            return sorted(str(r[0]) for r in rows)

    def candidates_since(
        self, experiment: ExperimentKey, since: int, limit: int, base_head: HeadId | None = None
    ) -> list[tuple[int, Candidate]]:
        """At most ``limit`` candidates received after cursor ``since`` (of ``base_head`` when given), in
        arrival order, each with its own cursor."""
        head_clause = "" if base_head is None else " AND base_head = ?"
        rows = self._db.query(
            f"SELECT rowid, descriptor FROM candidates WHERE experiment = ? AND rowid > ?{head_clause}"
            " ORDER BY rowid LIMIT ?",
            *(experiment, since, *(() if base_head is None else (base_head,)), limit),
        )
        return [(int(r[0]), _candidate(r[1])) for r in rows]

    def candidate_window(self, cid: ContentId) -> tuple[ExperimentKey, HeadId] | None:
        """For an artifact that a candidate uploaded and that is no head (heads are public): the
        experiment and base head of the window it was trained for; ``None`` otherwise."""
        rows = self._db.query(
            "SELECT experiment, base_head FROM candidates WHERE candidate_id = ?"
            " AND NOT EXISTS (SELECT 1 FROM heads WHERE head_id = ?) LIMIT 1",
            cid,
            cid,
        )
        return (ExperimentKey.parse(str(rows[0][0])), HeadId(str(rows[0][1]))) if rows else None

    def decided_by(
        self, experiment: ExperimentKey, cid: ContentId, count: int
    ) -> tuple[Candidate, Lease | None, list[HeadDescriptor]] | None:
        """Candidate ``cid`` of ``experiment`` (``None``: none was received), the lease it names, and
        the ``count`` canonical heads after its base, as far as they exist (``protocol.credit``: the
        heads that can decide it)."""
        rows = self._db.query(
            'SELECT c.descriptor, h."window", l.descriptor FROM candidates c JOIN heads h'
            " ON h.experiment = c.experiment AND h.head_id = c.base_head"
            " LEFT JOIN leases l ON l.lease_id = c.lease_id WHERE c.experiment = ? AND c.candidate_id = ?",
            experiment,
            cid,
        )
        if not rows:
            return None
        text, window, lease = rows[0]
        after = self._db.query(
            'SELECT descriptor FROM heads WHERE experiment = ? AND "window" > ? ORDER BY "window" LIMIT ?',
            experiment,
            int(window),
            count,
        )
        return _candidate(text), None if lease is None else _lease(lease), [_head(row[0]) for row in after]

    # -- leases ----------------------------------------------------------------------------
    def grant_lease(
        self,
        experiment: ExperimentKey,
        now_ms: int,
        choose: Callable[[HeadDescriptor | None, list[Lease]], Lease],
        seen: tuple[PeerId, str] | None = None,
        address: str = "",
    ) -> tuple[Lease, bool]:
        """Lease in the current window of ``experiment`` or the one after it, atomically across every
        edge on this database: ``choose(current head, live leases granted on it or on its parent)``
        returns one of those leases (asking again) or a new one (or raises), and a new one is stored
        before any other lease of the database is granted, with its holder (peer, principal and the
        ``address`` group it asked from: ``lapsed_holders``). Returns the lease and whether it is new.
        ``seen``: the peer asking and its kind, remembered in the same transaction (``saw_peer``)."""
        with self._db.transaction() as run:
            if seen is not None:
                self._saw_peer(run, *seen, now_ms)
            row = run(self._CURRENT_HEAD, experiment).fetchone()
            head = None if row is None else _head(row[0])
            live: list[Lease] = []
            if head is not None:
                rows = run(
                    "SELECT lease_id, descriptor FROM leases"
                    " WHERE experiment = ? AND base_head IN (?, ?) AND expires_at_ms > ? ORDER BY rowid",
                    experiment,
                    head.head_id,
                    head.parent or head.head_id,
                    now_ms,
                ).fetchall()
                live = [self._live_lease(r[0], r[1]) for r in rows]
            lease = choose(head, live)
            if lease in live:
                return lease, False
            run(
                "INSERT INTO leases (lease_id, experiment, peer_id, base_head, descriptor, expires_at_ms)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                lease.lease_id,
                lease.experiment,
                lease.peer_id,
                lease.base_head,
                json.dumps(lease.to_wire()),
                lease.expires_at_ms,
            )
            run(
                'INSERT INTO lease_holders (lease_id, experiment, "window", peer_id, principal, address)'
                " VALUES (?, ?, ?, ?, ?, ?)",
                lease.lease_id,
                lease.experiment,
                lease.window,
                lease.peer_id,
                lease.principal,
                address,
            )
            return lease, True

    def lapsed_holders(self, experiment: ExperimentKey, first: int, last: int) -> list[tuple[str, str | None, str]]:
        """(peer id, principal, address group) of each lease of ``experiment``'s windows ``first`` to
        ``last`` that delivered no candidate (leases granted before holders were recorded: none)."""
        rows = self._db.query(
            "SELECT peer_id, principal, address FROM lease_holders h"
            ' WHERE h.experiment = ? AND h."window" BETWEEN ? AND ?'
            " AND NOT EXISTS (SELECT 1 FROM candidates c WHERE c.lease_id = h.lease_id)",
            experiment,
            first,
            last,
        )
        return [(str(r[0]), None if r[1] is None else str(r[1]), str(r[2])) for r in rows]

    def release_leases(
        self, lease_ids: Iterable[LeaseId], now_ms: int, resign: Callable[[Lease], Lease]
    ) -> list[Lease]:
        """Give back each of ``lease_ids`` that is live and delivered nothing: stored as ``resign`` makes
        it (the edge's signature over it, lapsed at ``now_ms``), so that its shards are free for the
        window's other leases and validators wait for it no longer, and marked released, so that it
        never delivers (``add_candidate``). Returns the leases as given back."""
        released: list[Lease] = []
        with self._db.transaction() as run:
            for lease_id in lease_ids:
                row = run(
                    "SELECT descriptor FROM leases l WHERE lease_id = ? AND expires_at_ms > ?"
                    " AND NOT EXISTS (SELECT 1 FROM candidates c WHERE c.lease_id = l.lease_id)",
                    lease_id,
                    now_ms,
                ).fetchone()
                if row is None:
                    continue
                lease = resign(replace(_lease(row[0]), expires_at_ms=now_ms))
                run(
                    "UPDATE leases SET descriptor = ?, expires_at_ms = ? WHERE lease_id = ?",
                    json.dumps(lease.to_wire()),
                    now_ms,
                    lease_id,
                )
                run("INSERT INTO released_leases (lease_id, released_at_ms) VALUES (?, ?)", lease_id, now_ms)
                self._parsed.pop(lease_id, None)
                released.append(lease)
        return released

    def retire_leases(self, experiment: ExperimentKey, keep_windows: int) -> int:
        """Forget the leases of ``experiment`` whose window is ``keep_windows`` or more heads behind the
        current head, with their holders and release marks (a candidate keeps its lease id); how many."""
        with self._db.transaction() as run:
            row = run(f'SELECT h."window" {self._CURRENT} WHERE c.experiment = ?', experiment).fetchone()
            if row is None:
                return 0
            last = int(row[0]) - keep_windows
            gone = [
                str(r[0])
                for r in run(
                    "DELETE FROM leases WHERE experiment = ? AND base_head IN"
                    ' (SELECT head_id FROM heads WHERE experiment = ? AND "window" <= ?) RETURNING lease_id',
                    experiment,
                    experiment,
                    last,
                ).fetchall()
            ]
            run('DELETE FROM lease_holders WHERE experiment = ? AND "window" <= ?', experiment, last)
            for lease_id in gone:
                run("DELETE FROM released_leases WHERE lease_id = ?", lease_id)
                self._parsed.pop(lease_id, None)
            return len(gone)

    def lease(self, lease_id: LeaseId) -> Lease | None:
        rows = self._db.query("SELECT descriptor FROM leases WHERE lease_id = ?", lease_id)
        return _lease(rows[0][0]) if rows else None

    def leases(self, experiment: ExperimentKey, base_head: HeadId) -> list[Lease]:
        rows = self._db.query(
            "SELECT descriptor FROM leases WHERE experiment = ? AND base_head = ? ORDER BY rowid", experiment, base_head
        )
        return [_lease(r[0]) for r in rows]

    # -- proposals and attestations (quorum) -----------------------------------------------
    def _insert_new(self, table: str, columns: str, *row: object) -> bool:
        """Insert ``row`` into ``table`` (one of this module's fixed names) unless its key is there;
        True when it was new."""
        marks = ", ".join("?" * len(row))
        with self._db.transaction() as run:
            return run(f"INSERT INTO {table} ({columns}) VALUES ({marks}) ON CONFLICT DO NOTHING", *row).rowcount == 1

    def add_proposal(self, head: HeadDescriptor, now_ms: int, budget: int | None = None) -> bool | None:
        """Keep a validator-signed head until enough validators vouch for it: True when new, False if
        already kept, ``None`` when its proposer holds ``budget`` proposals on its parent already (counted
        and inserted in one write transaction, so requests in flight at once cannot pass it together)."""
        key = b64encode(head.validator_key)
        with self._db.transaction() as run:
            if run(
                "SELECT 1 FROM proposals WHERE experiment = ? AND head_id = ?", head.experiment, head.head_id
            ).fetchone():
                return False
            if budget is not None:
                held = run(
                    "SELECT COUNT(*) FROM proposals WHERE experiment = ? AND parent IS NOT DISTINCT FROM ?"
                    " AND validator_key = ?",
                    head.experiment,
                    head.parent,
                    key,
                ).fetchone()[0]
                if int(held) >= budget:
                    return None
            run(
                "INSERT INTO proposals (experiment, head_id, parent, validator_key, descriptor, received_at_ms)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                *(head.experiment, head.head_id, head.parent, key, json.dumps(head.to_wire()), now_ms),
            )
            return True

    def take_over_proposal(self, head: HeadDescriptor, retired_key: bytes) -> bool:
        """Keep ``head`` in place of the proposal of the same head that ``retired_key`` made (a validator
        a revision retired, whose proposal can never be certified); the attestations received for that
        head stay, as they name its content, not its proposer. False when that proposal is gone or
        another proposer took it over meanwhile."""
        with self._db.transaction() as run:
            taken = run(
                "UPDATE proposals SET validator_key = ?, descriptor = ?"
                " WHERE experiment = ? AND head_id = ? AND validator_key = ?",
                b64encode(head.validator_key),
                json.dumps(replace(head, certificate=()).to_wire()),
                *(head.experiment, head.head_id, b64encode(retired_key)),
            )
            return taken.rowcount == 1

    def proposed_by(self, experiment: ExperimentKey, parent: HeadId | None, validator_key: bytes) -> int:
        """How many heads ``validator_key`` proposed on top of ``parent`` (``None``: genesis)."""
        rows = self._db.query(
            "SELECT COUNT(*) FROM proposals WHERE experiment = ? AND parent IS NOT DISTINCT FROM ?"
            " AND validator_key = ?",
            experiment,
            parent,
            b64encode(validator_key),
        )
        return int(rows[0][0])

    def charge_validator(self, head: HeadDescriptor, cid: ContentId, size: int, budget: int) -> int | None:
        """Charge ``size`` bytes stored as ``cid`` (``head`` or the outer state it names) to ``head``'s
        proposer in the window on its parent, once per artifact, atomically across edges: ``None`` when
        charged (or charged already), else the bytes charged so far, which ``size`` more would take
        past ``budget``."""
        window = (head.experiment, head.parent or "", b64encode(head.validator_key))
        where = "experiment = ? AND parent = ? AND validator_key = ?"
        with self._db.transaction() as run:
            if run(f"SELECT 1 FROM validator_uploads WHERE {where} AND content_id = ?", *window, cid).fetchone():
                return None
            used = int(
                run(f"SELECT COALESCE(SUM(size_bytes), 0) FROM validator_uploads WHERE {where}", *window).fetchone()[0]
            )
            if used + size > budget:
                return used
            run(
                "INSERT INTO validator_uploads (experiment, parent, validator_key, content_id, size_bytes)"
                " VALUES (?, ?, ?, ?, ?)",
                *window,
                cid,
                size,
            )
            return None

    def proposal(self, experiment: ExperimentKey, head_id: HeadId) -> HeadDescriptor | None:
        """The proposed head ``head_id`` with every attestation received for it as its certificate."""
        rows = self._db.query(
            "SELECT descriptor FROM proposals WHERE experiment = ? AND head_id = ?", experiment, head_id
        )
        if not rows:
            return None
        return replace(_head(rows[0][0]), certificate=tuple(self.attestations(experiment, head_id)))

    def proposals(self, experiment: ExperimentKey, parent: HeadId | None) -> list[HeadDescriptor]:
        """Every head proposed on top of ``parent`` (``None``: genesis), oldest first, with certificates."""
        rows = self._db.query(
            "SELECT head_id FROM proposals WHERE experiment = ? AND parent IS NOT DISTINCT FROM ?"
            " ORDER BY received_at_ms, rowid",
            experiment,
            parent,
        )
        return [head for (head_id,) in rows if (head := self.proposal(experiment, HeadId(str(head_id)))) is not None]

    def add_attestation(self, attestation: Attestation) -> bool:
        key, descriptor = b64encode(attestation.validator_key), json.dumps(attestation.to_wire())
        return self._insert_new(
            "attestations",
            "experiment, head_id, validator_key, descriptor",
            *(attestation.experiment, attestation.head_id, key, descriptor),
        )

    def attestations(self, experiment: ExperimentKey, head_id: HeadId) -> list[Attestation]:
        rows = self._db.query(
            "SELECT descriptor FROM attestations WHERE experiment = ? AND head_id = ? ORDER BY rowid",
            experiment,
            head_id,
        )
        return [Attestation.from_wire(json.loads(str(r[0]))) for r in rows]

    # -- evaluations ------------------------------------------------------------------------
    def add_evaluation(self, evaluation: Evaluation) -> bool:
        """Keep ``evaluation`` unless its validator evaluated that head on that split already (the first
        copy stays); True when it was new."""
        return self._insert_new(
            "evaluations",
            'experiment, head_id, validator_key, split, "window", descriptor',
            *(evaluation.experiment, evaluation.head_id, b64encode(evaluation.validator_key), evaluation.split),
            *(evaluation.window, json.dumps(evaluation.to_wire())),
        )

    def evaluations(
        self, experiment: ExperimentKey, since_window: int = 0, limit: int | None = None
    ) -> list[Evaluation]:
        """``experiment``'s evaluations of heads of window ``since_window`` or later, by window then
        arrival; ``limit`` at most when given."""
        rows = self._db.query(
            'SELECT descriptor FROM evaluations WHERE experiment = ? AND "window" >= ? ORDER BY "window", rowid'
            + ("" if limit is None else " LIMIT ?"),
            experiment,
            since_window,
            *(() if limit is None else (limit,)),
        )
        return [Evaluation.from_wire(json.loads(str(r[0]))) for r in rows]

    # -- verdicts --------------------------------------------------------------------------
    def add_verdict(self, verdict: Verdict, examples: int) -> bool:
        """Keep the verdict that counts for its candidate (the first one), crediting ``examples`` when it
        accepts; False when its candidate has one already."""
        descriptor = json.dumps(verdict.to_wire())
        credited = examples if verdict.accepted else 0
        return self._insert_new(
            "verdicts",
            "experiment, candidate_id, peer_id, accepted, descriptor, examples",
            *(verdict.experiment, verdict.candidate_id, verdict.peer_id, int(verdict.accepted), descriptor, credited),
        )

    def counted_verdict(self, experiment: ExperimentKey, cid: ContentId) -> Verdict | None:
        """The verdict that counts for candidate ``cid``, if one does."""
        rows = self._db.query(
            "SELECT descriptor FROM verdicts WHERE experiment = ? AND candidate_id = ?", experiment, cid
        )
        return Verdict.from_wire(json.loads(str(rows[0][0]))) if rows else None

    def add_vote(self, verdict: Verdict) -> bool:
        """Hold a verdict that does not count yet (``protocol.credit``: pending), one per validator and
        candidate; False when that validator's vote on it is held already."""
        key, descriptor = b64encode(verdict.validator_key), json.dumps(verdict.to_wire())
        return self._insert_new(
            "verdict_votes",
            "experiment, candidate_id, validator_key, descriptor",
            *(verdict.experiment, verdict.candidate_id, key, descriptor),
        )

    def votes(self, experiment: ExperimentKey, cid: ContentId) -> list[Verdict]:
        """The verdicts held on candidate ``cid`` as votes, in arrival order: pending a quorum, or the
        agreeing ones that made its verdict count."""
        rows = self._db.query(
            "SELECT descriptor FROM verdict_votes WHERE experiment = ? AND candidate_id = ? ORDER BY rowid",
            experiment,
            cid,
        )
        return [Verdict.from_wire(json.loads(str(r[0]))) for r in rows]

    def votes_after(self, experiment: ExperimentKey, position: int, limit: int = 5000) -> list[tuple[int, Verdict]]:
        """Votes held after ``position`` (0: from the first), oldest first, each with its position."""
        rows = self._db.query(
            "SELECT rowid, descriptor FROM verdict_votes WHERE experiment = ? AND rowid > ? ORDER BY rowid LIMIT ?",
            experiment,
            position,
            limit,
        )
        return [(int(r[0]), Verdict.from_wire(json.loads(str(r[1])))) for r in rows]

    def drop_votes(self, experiment: ExperimentKey, cid: ContentId, validator_key: bytes | None = None) -> None:
        """Drop the votes held on ``cid`` (of one validator when ``validator_key`` is given)."""
        key_clause = "" if validator_key is None else " AND validator_key = ?"
        with self._db.transaction() as run:
            run(
                f"DELETE FROM verdict_votes WHERE experiment = ? AND candidate_id = ?{key_clause}",
                *(experiment, cid, *(() if validator_key is None else (b64encode(validator_key),))),
            )

    def voted_candidates(self, experiment: ExperimentKey, base_heads: tuple[HeadId, ...]) -> list[ContentId]:
        """The candidates on one of ``base_heads`` with votes held and no verdict that counts yet."""
        marks = ", ".join("?" * len(base_heads))
        rows = self._db.query(
            "SELECT DISTINCT v.candidate_id FROM verdict_votes v"
            " JOIN candidates c ON c.experiment = v.experiment AND c.candidate_id = v.candidate_id"
            f" WHERE v.experiment = ? AND c.base_head IN ({marks})"
            " AND NOT EXISTS (SELECT 1 FROM verdicts d WHERE d.experiment = v.experiment AND d.candidate_id = v.candidate_id)",
            experiment,
            *base_heads,
        )
        return [ContentId(str(r[0])) for r in rows]

    def verdicts(self, experiment: ExperimentKey, peer_id: PeerId | None = None, limit: int = 500) -> list[Verdict]:
        if peer_id is None:
            rows = self._db.query(
                "SELECT descriptor FROM verdicts WHERE experiment = ? ORDER BY rowid DESC LIMIT ?", experiment, limit
            )
        else:
            rows = self._db.query(
                "SELECT descriptor FROM verdicts WHERE experiment = ? AND peer_id = ? ORDER BY rowid DESC LIMIT ?",
                experiment,
                peer_id,
                limit,
            )
        return [Verdict.from_wire(json.loads(str(r[0]))) for r in rows]

    def verdicts_after(
        self, experiment: ExperimentKey, position: int, limit: int = 5000
    ) -> list[tuple[int, Verdict, int]]:
        """Verdicts stored after ``position`` (0: from the first), oldest first, each with its position
        and the examples it credits."""
        rows = self._db.query(
            "SELECT rowid, descriptor, examples FROM verdicts WHERE experiment = ? AND rowid > ?"
            " ORDER BY rowid LIMIT ?",
            experiment,
            position,
            limit,
        )
        return [(int(r[0]), Verdict.from_wire(json.loads(str(r[1]))), int(r[2])) for r in rows]

    def verdict_counts(self, experiment: ExperimentKey) -> dict[str, int]:
        rows = self._db.query(
            "SELECT accepted, COUNT(*) FROM verdicts WHERE experiment = ? GROUP BY accepted", experiment
        )
        counts = {"accepted": 0, "rejected": 0}
        for accepted, count in rows:
            counts["accepted" if accepted else "rejected"] = int(count)
        return counts

    # -- admission tokens (sha256 digests only) ----------------------------------------------
    def add_token(
        self, digest: str, role: str, label: str, issued_at_ms: int, expires_at_ms: int, max_keys: int = 1
    ) -> None:
        with self._db.transaction() as run:
            run(
                "INSERT INTO tokens (digest, role, label, issued_at_ms, expires_at_ms) VALUES (?, ?, ?, ?, ?)",
                *(digest, role, label, issued_at_ms, expires_at_ms),
            )
            run("INSERT INTO token_limits (digest, max_keys) VALUES (?, ?)", digest, max_keys)

    def bind_token_key(self, digest: str, peer_id: str, now_ms: int) -> bool:
        """Bind ``peer_id`` to the token (once); False when the token already has its ``max_keys``
        other keys bound (a token without a recorded limit binds one)."""
        with self._db.transaction() as run:
            if run("SELECT 1 FROM token_keys WHERE digest = ? AND peer_id = ?", digest, peer_id).fetchone():
                return True
            row = run("SELECT max_keys FROM token_limits WHERE digest = ?", digest).fetchone()
            bound = run("SELECT COUNT(*) FROM token_keys WHERE digest = ?", digest).fetchone()[0]
            if bound >= (1 if row is None else int(row[0])):
                return False
            run("INSERT INTO token_keys (digest, peer_id, bound_at_ms) VALUES (?, ?, ?)", digest, peer_id, now_ms)
            return True

    def token(self, digest: str) -> tuple[str, int] | None:
        rows = self._db.query("SELECT role, expires_at_ms FROM tokens WHERE digest = ?", digest)
        return (str(rows[0][0]), int(rows[0][1])) if rows else None

    _TOKEN_FIELDS = ("digest", "role", "label", "issued_at_ms", "expires_at_ms")

    def tokens(self) -> list[dict[str, object]]:
        rows = self._db.query(f"SELECT {', '.join(self._TOKEN_FIELDS)} FROM tokens ORDER BY issued_at_ms")
        return [dict(zip(self._TOKEN_FIELDS, r, strict=True)) for r in rows]

    def delete_tokens(self, digest_prefix: str) -> int:
        """Delete the tokens whose digest starts with ``digest_prefix`` (hex digits); how many were deleted."""
        if not all(c in "0123456789abcdef" for c in digest_prefix):
            raise ValueError(f"a token digest is hex digits, not {digest_prefix!r}")
        with self._db.transaction() as run:
            pattern = digest_prefix + "%"
            run("DELETE FROM token_keys WHERE digest LIKE ?", pattern)
            run("DELETE FROM token_limits WHERE digest LIKE ?", pattern)
            return run("DELETE FROM tokens WHERE digest LIKE ?", pattern).rowcount

    # -- run control (``protocol.run_control``) ------------------------------------------------
    def apply_run_control(self, signed: SignedRunControl, now_ms: int, revision: int) -> RunState:
        """Apply ``signed`` (its signatures already checked against network revision ``revision``) to its
        experiment and keep it: the state it leaves. ``Conflict`` with ``RunState.refusal``'s reason for a
        replay or an order after ``stop``, or once the store holds a later revision (``promote_head``);
        read and written in one transaction, so edges sharing a store apply each sequence once."""
        order = signed.order
        with self._db.transaction() as run:
            _same_revision(run, revision, f"run-control order {order.sequence}")
            row = run("SELECT state FROM run_states WHERE experiment = ?", order.experiment).fetchone()
            state = RunState() if row is None else _run_state(row[0])
            if (refusal := state.refusal(order)) is not None:
                raise Conflict(refusal)
            state = state.after(order)
            run(
                "INSERT INTO run_states (experiment, state) VALUES (?, ?)"
                " ON CONFLICT (experiment) DO UPDATE SET state = excluded.state",
                *(order.experiment, json.dumps(state.to_wire())),
            )
            run(
                "INSERT INTO run_orders (experiment, sequence, signed, applied_at_ms) VALUES (?, ?, ?, ?)",
                *(order.experiment, order.sequence, json.dumps(signed.to_wire()), now_ms),
            )
            return state

    def run_state(self, experiment: ExperimentKey) -> RunState:
        """What the orders applied to ``experiment`` leave (running, when none was)."""
        rows = self._db.query("SELECT state FROM run_states WHERE experiment = ?", experiment)
        return _run_state(rows[0][0]) if rows else RunState()

    def run_orders(self, experiment: ExperimentKey) -> list[tuple[SignedRunControl, int]]:
        """The orders applied to ``experiment``, in sequence, each with when this store applied it."""
        rows = self._db.query(
            "SELECT signed, applied_at_ms FROM run_orders WHERE experiment = ? ORDER BY sequence", experiment
        )
        return [(SignedRunControl.from_wire(json.loads(str(signed))), int(at)) for signed, at in rows]

    # -- network revisions (``protocol.network_revisions``) ---------------------------------------
    def add_network_revision(
        self, signed: SignedNetworkRevision, now_ms: int, refusal: HandoverCheck | None = None
    ) -> None:
        """Keep ``signed`` (checked against the terms before it by the caller) as the next revision:
        ``Conflict`` unless it is the one after the last held, or with the reason ``refusal`` gives when
        it is given the canonical heads (genesis first) and the last run-control sequence of every
        experiment (``protocol.network_revisions.handover_refusal``). All read and written in one
        transaction: edges sharing a store take each revision once, and no head or order is taken
        between the check and the revision (``promote_head`` and ``apply_run_control`` refuse one
        certified under an earlier revision)."""
        number = signed.revision.number
        with self._db.transaction() as run:
            last = _last_revision(run)
            if number != last + 1:
                raise Conflict(f"network revision {number} does not follow revision {last}, the last this edge holds")
            if refusal is not None:
                lineages: dict[ExperimentKey, list[HeadDescriptor]] = {}
                for (descriptor,) in run('SELECT descriptor FROM heads ORDER BY "window"').fetchall():
                    head = _head(descriptor)
                    lineages.setdefault(head.experiment, []).append(head)
                sequences = {
                    ExperimentKey.parse(str(key)): _run_state(state).sequence
                    for key, state in run("SELECT experiment, state FROM run_states").fetchall()
                }
                if (reason := refusal(lineages, sequences)) is not None:
                    raise Conflict(reason)
            run(
                "INSERT INTO network_revisions (number, signed, applied_at_ms) VALUES (?, ?, ?)",
                *(number, json.dumps(signed.to_wire()), now_ms),
            )

    def network_revisions(self, after: int = 0) -> list[tuple[SignedNetworkRevision, int]]:
        """The revisions held above number ``after``, in order, each with when this store took it."""
        rows = self._db.query(
            "SELECT signed, applied_at_ms FROM network_revisions WHERE number > ? ORDER BY number", after
        )
        return [(SignedNetworkRevision.from_wire(json.loads(str(signed))), int(at)) for signed, at in rows]

    # -- peers -----------------------------------------------------------------------------
    def saw_peer(self, peer_id: PeerId, kind: str, now_ms: int) -> None:
        with self._db.transaction() as run:
            self._saw_peer(run, peer_id, kind, now_ms)

    @staticmethod
    def _saw_peer(run: Run, peer_id: PeerId, kind: str, now_ms: int) -> None:
        run(
            "INSERT INTO peers (peer_id, kind, first_seen_ms, last_seen_ms) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (peer_id) DO UPDATE SET last_seen_ms = excluded.last_seen_ms, kind = excluded.kind",
            *(peer_id, kind, now_ms, now_ms),
        )

    _PEER_FIELDS = ("peer_id", "kind", "first_seen_ms", "last_seen_ms")

    def peers_page(self, after: str, limit: int) -> list[dict[str, object]]:
        """At most ``limit`` peers whose id sorts after ``after`` ("": from the first), by id."""
        rows = self._db.query(
            f"SELECT {', '.join(self._PEER_FIELDS)} FROM peers WHERE peer_id > ? ORDER BY peer_id LIMIT ?", after, limit
        )
        return [dict(zip(self._PEER_FIELDS, r, strict=True)) for r in rows]

    def peers(self) -> list[dict[str, object]]:
        rows = self._db.query(f"SELECT {', '.join(self._PEER_FIELDS)} FROM peers ORDER BY last_seen_ms DESC")
        return [dict(zip(self._PEER_FIELDS, r, strict=True)) for r in rows]


class Store(EdgeStore):
    """The embedded default: SQLite in the file ``path`` (one edge process)."""

    def __init__(self, path: Path) -> None:
        super().__init__(SqliteDatabase(path, SCHEMA, SCHEMA_VERSION))


class PostgresStore(EdgeStore):
    """PostgreSQL at ``url`` (``postgresql://user@host:port/db``), which several edges may share."""

    def __init__(self, url: str) -> None:
        from .store_postgres import PostgresDatabase  # psycopg is optional: the `scale` extra

        super().__init__(PostgresDatabase(url, SCHEMA, SCHEMA_VERSION))


def open_store(store_url: str, data_dir: Path) -> EdgeStore:
    """The store the edge's settings name: PostgreSQL for a ``postgresql://`` ``store_url``, else
    SQLite in ``data_dir``."""
    return PostgresStore(store_url) if store_url else Store(data_dir / "edge.sqlite3")
