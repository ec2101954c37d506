"""``PostgresDatabase``: the store's engine when several edges share one state (``server.store``).

The store's dialect maps onto PostgreSQL in three ways: ``?`` placeholders become ``%s``; every
table gets an identity column ``rowid`` (SQLite's implicit arrival order); ``INTEGER`` columns are
``BIGINT`` (milliseconds since 1970 do not fit 32 bits) and ``BLOB`` is ``BYTEA``.

Every write transaction first takes one transaction-level advisory lock, so writers exclude each
other across every edge process as SQLite's ``BEGIN IMMEDIATE`` does within one host: a lease's
shards are chosen and stored before any other edge chooses. Reads run outside transactions
(autocommit), on a connection of their own, and see what has committed: a read never waits for a
writer queued on another edge's lock. The schema version is kept in the ``settings`` table.

A lost connection (PostgreSQL restarted, the network between) is ``Unavailable`` (503) for the
request that finds it, and the next one connects again; a read is retried once on a new connection
first. A write is never retried here: whether a lost commit happened is the client's to find out.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg

from .errors import Unavailable

if TYPE_CHECKING:
    from .store_engine import Run

__all__ = ["PostgresDatabase"]

WRITE_LOCK = 0x64746E  # the advisory lock every write transaction holds ("dtn")
CONNECT_TIMEOUT_S = 10


@functools.cache
def _statement(sql: str) -> str:
    return sql.replace("?", "%s")


def _ddl(schema: str) -> list[str]:
    """The shared schema's statements in PostgreSQL's types, each table with its ``rowid``, indexed (reads
    that follow arrival order, ``rowid > ?``, are range scans as in SQLite, where it is the table's key)."""
    schema = re.sub(r"\bINTEGER\b", "BIGINT", schema).replace(" BLOB ", " BYTEA ")
    schema = re.sub(
        r"(CREATE TABLE IF NOT EXISTS \w+ \()", r"\1rowid BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE, ", schema
    )
    return [statement.strip() for statement in schema.split(";") if statement.strip()]


class _Link:
    """One connection to the store, behind a lock, made again where the last one was lost."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.lock = threading.Lock()
        self.db = self._connect()

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.OperationalError as exc:
            raise Unavailable(f"cannot reach the PostgreSQL store at {_redacted(self.url)}: {exc}") from None

    def live(self) -> psycopg.Connection[Any]:
        """The connection (call with ``lock`` held)."""
        if _lost(self.db):
            self.db = self._connect()
        return self.db

    def raise_if_lost(self, db: psycopg.Connection[Any], exc: psycopg.OperationalError) -> None:
        """``Unavailable`` where ``exc`` cost ``db`` its connection (else it was the statement's error)."""
        if _lost(db):
            raise Unavailable(f"lost the PostgreSQL store at {_redacted(self.url)}: {exc}".strip()) from exc


def _lost(db: psycopg.Connection[Any]) -> bool:
    return db.closed or db.broken


class PostgresDatabase:
    def __init__(self, url: str, schema: str, version: int) -> None:
        try:
            self._writer, self._reader = _Link(url), _Link(url)
        except Unavailable as exc:
            raise RuntimeError(str(exc)) from None
        with self.transaction() as run:
            if run("SELECT to_regclass('settings')").fetchone()[0] is not None:
                row = run("SELECT value FROM settings WHERE key = 'schema_version'").fetchone()
                found = "none" if row is None else bytes(row[0]).decode()
                if found != str(version):
                    self.close()
                    raise RuntimeError(
                        f"the PostgreSQL store at {_redacted(url)} holds edge schema v{found}; this edge needs "
                        f"v{version}: give it an empty database (it is not migrated)"
                    )
            for statement in _ddl(schema):
                run(statement)
            run(
                "INSERT INTO settings (key, value) VALUES ('schema_version', ?) ON CONFLICT DO NOTHING",
                str(version).encode(),
            )

    def close(self) -> None:
        self._writer.db.close()
        self._reader.db.close()

    @contextmanager
    def transaction(self) -> Iterator[Run]:
        with self._writer.lock:
            db = self._writer.live()
            try:
                with db.transaction():
                    db.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
                    yield lambda sql, *args: db.execute(_statement(sql), args)
            except psycopg.OperationalError as exc:
                self._writer.raise_if_lost(db, exc)
                raise

    def query(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        link = self._reader
        with link.lock:
            db = link.live()
            try:
                return db.execute(_statement(sql), args).fetchall()
            except psycopg.OperationalError:
                if not _lost(db):
                    raise
            db = link.live()  # a read: once more, on a new connection
            try:
                return db.execute(_statement(sql), args).fetchall()
            except psycopg.OperationalError as exc:
                link.raise_if_lost(db, exc)
                raise


def _redacted(url: str) -> str:
    """``url`` without a password."""
    return re.sub(r"://([^:/@]*):[^@]*@", r"://\1:***@", url)
