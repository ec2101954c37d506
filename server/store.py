"""The edge's durable state in SQLite: heads (canonical, and proposed ones with their attestations),
candidates, leases, verdicts, tokens, peers, its own key.

Everything a peer needs after an edge restart lives here or in the blob store. Writes commit with
``synchronous=FULL`` before the caller acknowledges anything. The schema has a version
(``PRAGMA user_version``); a database of another version is refused with a clear error, never
half-read.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from protocol.ids import ContentId, ExperimentKey, HeadId, LeaseId, PeerId
from protocol.messages import Attestation, Candidate, HeadDescriptor, Lease, Verdict
from protocol.signing import b64encode

from .errors import Conflict

__all__ = ["Store"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS heads (
    experiment TEXT NOT NULL, head_id TEXT NOT NULL, parent TEXT, window INTEGER NOT NULL,
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
CREATE TABLE IF NOT EXISTS verdicts (
    experiment TEXT NOT NULL, candidate_id TEXT NOT NULL, peer_id TEXT NOT NULL, accepted INTEGER NOT NULL,
    descriptor TEXT NOT NULL, PRIMARY KEY (experiment, candidate_id));
CREATE TABLE IF NOT EXISTS tokens (
    digest TEXT PRIMARY KEY, role TEXT NOT NULL, label TEXT NOT NULL, issued_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS proposals (
    experiment TEXT NOT NULL, head_id TEXT NOT NULL, parent TEXT, validator_key TEXT NOT NULL,
    descriptor TEXT NOT NULL, received_at_ms INTEGER NOT NULL, PRIMARY KEY (experiment, head_id));
CREATE INDEX IF NOT EXISTS proposals_by_parent ON proposals (experiment, parent);
CREATE TABLE IF NOT EXISTS attestations (
    experiment TEXT NOT NULL, head_id TEXT NOT NULL, validator_key TEXT NOT NULL, descriptor TEXT NOT NULL,
    PRIMARY KEY (experiment, head_id, validator_key));
CREATE TABLE IF NOT EXISTS token_keys (
    digest TEXT NOT NULL, peer_id TEXT NOT NULL, bound_at_ms INTEGER NOT NULL, PRIMARY KEY (digest, peer_id));
CREATE TABLE IF NOT EXISTS token_limits (digest TEXT PRIMARY KEY, max_keys INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS peers (
    peer_id TEXT PRIMARY KEY, kind TEXT NOT NULL, first_seen_ms INTEGER NOT NULL, last_seen_ms INTEGER NOT NULL);
"""


SCHEMA_VERSION = 2


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        empty = self._db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0
        if not empty and version != SCHEMA_VERSION:
            self._db.close()
            raise RuntimeError(
                f"{path} holds edge schema v{version}; this edge needs v{SCHEMA_VERSION}: "
                "move the data dir aside (it is not migrated) and start again"
            )
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, *args: object) -> list[tuple[object, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # -- the edge's own signing seed ------------------------------------------------------
    def edge_seed(self) -> bytes:
        with self._tx() as db:
            row = db.execute("SELECT value FROM settings WHERE key = 'edge_seed'").fetchone()
            if row is None:
                seed = os.urandom(32)
                db.execute("INSERT INTO settings VALUES ('edge_seed', ?)", (seed,))
                return seed
            return bytes(row[0])

    # -- heads -----------------------------------------------------------------------------
    def promote_head(self, head: HeadDescriptor, now_ms: int) -> bool:
        """Make ``head`` current if its parent is the current head; False if it already is current."""
        with self._tx() as db:
            row = db.execute("SELECT head_id FROM current_heads WHERE experiment = ?", (head.experiment,)).fetchone()
            current = None if row is None else row[0]
            if current == head.head_id:
                return False
            if head.parent != current:
                raise Conflict(f"head parent {head.parent} is not the current head {current}")
            db.execute(
                "INSERT OR IGNORE INTO heads VALUES (?, ?, ?, ?, ?, ?)",
                (head.experiment, head.head_id, head.parent, head.window, json.dumps(head.to_wire()), now_ms),
            )
            db.execute("INSERT OR REPLACE INTO current_heads VALUES (?, ?)", (head.experiment, head.head_id))
            return True

    def current_head(self, experiment: ExperimentKey) -> HeadDescriptor | None:
        rows = self._query(
            "SELECT h.descriptor FROM current_heads c JOIN heads h ON h.experiment = c.experiment"
            " AND h.head_id = c.head_id WHERE c.experiment = ?",
            experiment,
        )
        return HeadDescriptor.from_wire(json.loads(str(rows[0][0]))) if rows else None

    def heads(self, experiment: ExperimentKey) -> list[HeadDescriptor]:
        rows = self._query("SELECT descriptor FROM heads WHERE experiment = ? ORDER BY window", experiment)
        return [HeadDescriptor.from_wire(json.loads(str(r[0]))) for r in rows]

    def head(self, experiment: ExperimentKey, head_id: HeadId) -> HeadDescriptor | None:
        rows = self._query("SELECT descriptor FROM heads WHERE experiment = ? AND head_id = ?", experiment, head_id)
        return HeadDescriptor.from_wire(json.loads(str(rows[0][0]))) if rows else None

    # -- candidates ------------------------------------------------------------------------
    def add_candidate(self, candidate: Candidate, size_bytes: int, now_ms: int) -> bool:
        """Record a candidate; False when it was already there (an idempotent re-upload).

        Raises ``Conflict`` when its lease already delivered another candidate (one per lease)."""
        with self._tx() as db:
            row = db.execute("SELECT candidate_id FROM candidates WHERE lease_id = ?", (candidate.lease_id,)).fetchone()
            if row is not None:
                if row[0] == candidate.candidate_id:
                    return False
                raise Conflict(f"lease {candidate.lease_id} already delivered candidate {row[0]}")
            db.execute(
                "INSERT INTO candidates VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1)",
                (
                    candidate.experiment,
                    candidate.candidate_id,
                    candidate.base_head,
                    candidate.peer_id,
                    candidate.lease_id,
                    json.dumps(candidate.to_wire()),
                    now_ms,
                    size_bytes,
                ),
            )
            return True

    def lease_delivered(self, lease_id: LeaseId) -> str | None:
        """The candidate id a lease delivered, if any."""
        rows = self._query("SELECT candidate_id FROM candidates WHERE lease_id = ?", lease_id)
        return str(rows[0][0]) if rows else None

    def window_bytes(self, experiment: ExperimentKey, base_head: HeadId) -> int:
        """Bytes of candidate artifacts stored for one window."""
        rows = self._query(
            "SELECT COALESCE(SUM(size_bytes), 0) FROM candidates WHERE experiment = ? AND base_head = ?",
            experiment,
            base_head,
        )
        return int(rows[0][0])  # type: ignore[call-overload]

    def retire_candidates(self, experiment: ExperimentKey, keep_windows: int) -> list[str]:
        """Candidate ids whose artifacts may go: their window is ``keep_windows`` or more heads behind
        the current head. They are marked as gone (descriptors and verdicts stay)."""
        with self._tx() as db:
            row = db.execute(
                "SELECT h.window FROM current_heads c JOIN heads h ON h.experiment = c.experiment"
                " AND h.head_id = c.head_id WHERE c.experiment = ?",
                (experiment,),
            ).fetchone()
            if row is None:
                return []
            rows = db.execute(
                "SELECT c.candidate_id FROM candidates c JOIN heads h ON h.experiment = c.experiment"
                " AND h.head_id = c.base_head WHERE c.experiment = ? AND c.blob_kept = 1 AND h.window <= ?",
                (experiment, int(row[0]) - keep_windows),
            ).fetchall()
            retired = [str(r[0]) for r in rows]
            db.executemany(
                "UPDATE candidates SET blob_kept = 0 WHERE experiment = ? AND candidate_id = ?",
                [(experiment, cid) for cid in retired],
            )
            return retired

    def candidates(self, experiment: ExperimentKey, base_head: HeadId | None = None) -> list[Candidate]:
        if base_head is None:
            rows = self._query("SELECT descriptor FROM candidates WHERE experiment = ? ORDER BY rowid", experiment)
        else:
            rows = self._query(
                "SELECT descriptor FROM candidates WHERE experiment = ? AND base_head = ? ORDER BY rowid",
                experiment,
                base_head,
            )
        return [Candidate.from_wire(json.loads(str(r[0]))) for r in rows]

    def candidates_since(self, experiment: ExperimentKey, since: int, limit: int) -> list[tuple[int, Candidate]]:
        """At most ``limit`` candidates received after cursor ``since``, each with its own cursor."""
        rows = self._query(
            "SELECT rowid, descriptor FROM candidates WHERE experiment = ? AND rowid > ? ORDER BY rowid LIMIT ?",
            experiment,
            since,
            limit,
        )
        return [(int(str(r[0])), Candidate.from_wire(json.loads(str(r[1])))) for r in rows]

    def candidate_window(self, cid: ContentId) -> tuple[ExperimentKey, HeadId] | None:
        """For an artifact that a candidate uploaded and that is no head (heads are public): the
        experiment and base head of the window it was trained for; ``None`` otherwise."""
        rows = self._query(
            "SELECT experiment, base_head FROM candidates WHERE candidate_id = ?"
            " AND NOT EXISTS (SELECT 1 FROM heads WHERE head_id = ?) LIMIT 1",
            cid,
            cid,
        )
        return (ExperimentKey.parse(str(rows[0][0])), HeadId(str(rows[0][1]))) if rows else None

    # -- leases ----------------------------------------------------------------------------
    def add_lease(self, lease: Lease) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO leases VALUES (?, ?, ?, ?, ?, ?)",
                (
                    lease.lease_id,
                    lease.experiment,
                    lease.peer_id,
                    lease.base_head,
                    json.dumps(lease.to_wire()),
                    lease.expires_at_ms,
                ),
            )

    def lease(self, lease_id: LeaseId) -> Lease | None:
        rows = self._query("SELECT descriptor FROM leases WHERE lease_id = ?", lease_id)
        return Lease.from_wire(json.loads(str(rows[0][0]))) if rows else None

    def leases(self, experiment: ExperimentKey, base_head: HeadId) -> list[Lease]:
        rows = self._query(
            "SELECT descriptor FROM leases WHERE experiment = ? AND base_head = ? ORDER BY rowid", experiment, base_head
        )
        return [Lease.from_wire(json.loads(str(r[0]))) for r in rows]

    # -- proposals and attestations (quorum) -----------------------------------------------
    def _insert_new(self, table: str, *row: object) -> bool:
        """Insert ``row`` into ``table`` (one of this module's fixed names) unless its key is there;
        True when it was new."""
        marks = ", ".join("?" * len(row))
        with self._tx() as db:
            return db.execute(f"INSERT OR IGNORE INTO {table} VALUES ({marks})", row).rowcount == 1

    def add_proposal(self, head: HeadDescriptor, now_ms: int) -> bool:
        """Keep a validator-signed head until enough validators vouch for it; False if already kept."""
        descriptor = json.dumps(head.to_wire())
        key = b64encode(head.validator_key)
        return self._insert_new("proposals", head.experiment, head.head_id, head.parent, key, descriptor, now_ms)

    def proposal(self, experiment: ExperimentKey, head_id: HeadId) -> HeadDescriptor | None:
        """The proposed head ``head_id`` with every attestation received for it as its certificate."""
        rows = self._query("SELECT descriptor FROM proposals WHERE experiment = ? AND head_id = ?", experiment, head_id)
        if not rows:
            return None
        head = HeadDescriptor.from_wire(json.loads(str(rows[0][0])))
        return replace(head, certificate=tuple(self.attestations(experiment, head_id)))

    def proposals(self, experiment: ExperimentKey, parent: HeadId | None) -> list[HeadDescriptor]:
        """Every head proposed on top of ``parent`` (``None``: genesis), oldest first, with certificates."""
        rows = self._query(
            "SELECT head_id FROM proposals WHERE experiment = ? AND parent IS ? ORDER BY received_at_ms, rowid",
            experiment,
            parent,
        )
        return [head for (head_id,) in rows if (head := self.proposal(experiment, HeadId(str(head_id)))) is not None]

    def add_attestation(self, attestation: Attestation) -> bool:
        key, descriptor = b64encode(attestation.validator_key), json.dumps(attestation.to_wire())
        return self._insert_new("attestations", attestation.experiment, attestation.head_id, key, descriptor)

    def attestations(self, experiment: ExperimentKey, head_id: HeadId) -> list[Attestation]:
        rows = self._query(
            "SELECT descriptor FROM attestations WHERE experiment = ? AND head_id = ? ORDER BY rowid",
            experiment,
            head_id,
        )
        return [Attestation.from_wire(json.loads(str(r[0]))) for r in rows]

    # -- verdicts --------------------------------------------------------------------------
    def add_verdict(self, verdict: Verdict) -> bool:
        descriptor = json.dumps(verdict.to_wire())
        row = (verdict.experiment, verdict.candidate_id, verdict.peer_id, int(verdict.accepted), descriptor)
        return self._insert_new("verdicts", *row)

    def verdicts(self, experiment: ExperimentKey, peer_id: PeerId | None = None, limit: int = 500) -> list[Verdict]:
        if peer_id is None:
            rows = self._query(
                "SELECT descriptor FROM verdicts WHERE experiment = ? ORDER BY rowid DESC LIMIT ?", experiment, limit
            )
        else:
            rows = self._query(
                "SELECT descriptor FROM verdicts WHERE experiment = ? AND peer_id = ? ORDER BY rowid DESC LIMIT ?",
                experiment,
                peer_id,
                limit,
            )
        return [Verdict.from_wire(json.loads(str(r[0]))) for r in rows]

    def verdict_counts(self, experiment: ExperimentKey) -> dict[str, int]:
        rows = self._query("SELECT accepted, COUNT(*) FROM verdicts WHERE experiment = ? GROUP BY accepted", experiment)
        counts = {"accepted": 0, "rejected": 0}
        for accepted, count in rows:
            counts["accepted" if accepted else "rejected"] = int(count)  # type: ignore[call-overload]
        return counts

    # -- admission tokens (sha256 digests only) ----------------------------------------------
    def add_token(
        self, digest: str, role: str, label: str, issued_at_ms: int, expires_at_ms: int, max_keys: int = 1
    ) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO tokens VALUES (?, ?, ?, ?, ?)", (digest, role, label, issued_at_ms, expires_at_ms))
            db.execute("INSERT INTO token_limits VALUES (?, ?)", (digest, max_keys))

    def bind_token_key(self, digest: str, peer_id: str, now_ms: int) -> bool:
        """Bind ``peer_id`` to the token (once); False when the token already has its ``max_keys``
        other keys bound (a token without a recorded limit binds one)."""
        with self._tx() as db:
            if db.execute("SELECT 1 FROM token_keys WHERE digest = ? AND peer_id = ?", (digest, peer_id)).fetchone():
                return True
            row = db.execute("SELECT max_keys FROM token_limits WHERE digest = ?", (digest,)).fetchone()
            bound = db.execute("SELECT COUNT(*) FROM token_keys WHERE digest = ?", (digest,)).fetchone()[0]
            if bound >= (1 if row is None else int(row[0])):
                return False
            db.execute("INSERT INTO token_keys VALUES (?, ?, ?)", (digest, peer_id, now_ms))
            return True

    def token(self, digest: str) -> tuple[str, int] | None:
        rows = self._query("SELECT role, expires_at_ms FROM tokens WHERE digest = ?", digest)
        return (str(rows[0][0]), int(rows[0][1])) if rows else None  # type: ignore[call-overload]

    def tokens(self) -> list[dict[str, object]]:
        rows = self._query("SELECT digest, role, label, issued_at_ms, expires_at_ms FROM tokens ORDER BY issued_at_ms")
        return [dict(zip(("digest", "role", "label", "issued_at_ms", "expires_at_ms"), r, strict=True)) for r in rows]

    def delete_tokens(self, digest_prefix: str) -> int:
        """Delete the tokens whose digest starts with ``digest_prefix``; how many were deleted."""
        with self._tx() as db:
            match = (len(digest_prefix), digest_prefix)
            db.execute("DELETE FROM token_keys WHERE substr(digest, 1, ?) = ?", match)
            db.execute("DELETE FROM token_limits WHERE substr(digest, 1, ?) = ?", match)
            return int(db.execute("DELETE FROM tokens WHERE substr(digest, 1, ?) = ?", match).rowcount)

    # -- peers -----------------------------------------------------------------------------
    def saw_peer(self, peer_id: PeerId, kind: str, now_ms: int) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO peers VALUES (?, ?, ?, ?) ON CONFLICT(peer_id) DO UPDATE SET last_seen_ms = ?, kind = ?",
                (peer_id, kind, now_ms, now_ms, now_ms, kind),
            )

    def peers(self) -> list[dict[str, object]]:
        rows = self._query("SELECT peer_id, kind, first_seen_ms, last_seen_ms FROM peers ORDER BY last_seen_ms DESC")
        return [dict(zip(("peer_id", "kind", "first_seen_ms", "last_seen_ms"), r, strict=True)) for r in rows]
