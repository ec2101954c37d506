"""``PostgresDatabase``: the store's engine when several edges share one state (``server.store``).

The store's dialect maps onto PostgreSQL in three ways: ``?`` placeholders become ``%s``; every
table gets an identity column ``rowid`` (SQLite's implicit arrival order); ``INTEGER`` columns are
``BIGINT`` (milliseconds since 1970 do not fit 32 bits) and ``BLOB`` is ``BYTEA``.

Every write transaction first takes one transaction-level advisory lock, so writers exclude each
other across every edge process as SQLite's ``BEGIN IMMEDIATE`` does within one host: a lease's
shards are chosen and stored before any other edge chooses. Reads run outside transactions
(autocommit) and see what has committed. The schema version is kept in the ``settings`` table.

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
    from .store import Run

__all__ = ["PostgresDatabase"]

WRITE_LOCK = 0x64746E  # the advisory lock every write transaction holds ("dtn")
CONNECT_TIMEOUT_S = 10


@functools.cache
def _statement(sql: str) -> str:
    return sql.replace("?", "%s")


def _ddl(schema: str) -> list[str]:
    """The shared schema's statements in PostgreSQL's types, each table with its ``rowid``."""
    schema = re.sub(r"\bINTEGER\b", "BIGINT", schema).replace(" BLOB ", " BYTEA ")
    schema = re.sub(r"(CREATE TABLE IF NOT EXISTS \w+ \()", r"\1rowid BIGINT GENERATED ALWAYS AS IDENTITY, ", schema)
    return [statement.strip() for statement in schema.split(";") if statement.strip()]


class PostgresDatabase:
    def __init__(self, url: str, schema: str, version: int) -> None:
        self._url = url
        try:
            self._db = self._connect()
        except Unavailable as exc:
            raise RuntimeError(str(exc)) from None
        self._lock = threading.Lock()
        with self.transaction() as run:
            if run("SELECT to_regclass('settings')").fetchone()[0] is not None:
                row = run("SELECT value FROM settings WHERE key = 'schema_version'").fetchone()
                found = "none" if row is None else bytes(row[0]).decode()
                if found != str(version):
                    self._db.close()
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

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.OperationalError as exc:
            raise Unavailable(f"cannot reach the PostgreSQL store at {_redacted(self._url)}: {exc}") from None

    def _live(self) -> psycopg.Connection[Any]:
        """The connection, made again where the last one was lost (call with the lock held)."""
        if self._db.closed or self._db.broken:
            self._db = self._connect()
        return self._db

    def _lost(self, exc: psycopg.OperationalError) -> Unavailable:
        return Unavailable(f"lost the PostgreSQL store at {_redacted(self._url)}: {exc}".strip())

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[Run]:
        with self._lock:
            db = self._live()
            try:
                with db.transaction():
                    db.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
                    yield lambda sql, *args: db.execute(_statement(sql), args)
            except psycopg.OperationalError as exc:
                if db.closed or db.broken:
                    raise self._lost(exc) from exc
                raise

    def query(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        with self._lock:
            db = self._live()
            try:
                return db.execute(_statement(sql), args).fetchall()
            except psycopg.OperationalError:
                if not (db.closed or db.broken):
                    raise
            try:  # a read: once more, on a new connection
                return self._live().execute(_statement(sql), args).fetchall()
            except psycopg.OperationalError as exc:
                raise self._lost(exc) from exc


def _redacted(url: str) -> str:
    """``url`` without a password."""
    return re.sub(r"://([^:/@]*):[^@]*@", r"://\1:***@", url)
