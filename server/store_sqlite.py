"""``SqliteDatabase``: the store's embedded engine, one SQLite file (``server.store``).

Writes run in ``BEGIN IMMEDIATE`` transactions and commit with ``synchronous=FULL``; one connection
per process, behind a lock. The schema version is ``PRAGMA user_version``. The file holds the edge's
signing seed and the admission tokens' digests, so it is created readable by its owner alone (0600;
SQLite gives its WAL and shared-memory files the same mode).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .store_engine import Run

__all__ = ["SqliteDatabase"]


class SqliteDatabase:
    def __init__(self, path: Path, schema: str, version: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))  # created 0600, never readable by others
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        found = self._db.execute("PRAGMA user_version").fetchone()[0]
        empty = self._db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0
        if not empty and found != version:
            self._db.close()
            raise RuntimeError(
                f"{path} holds edge schema v{found}; this edge needs v{version}: "
                "move the data dir aside (it is not migrated) and start again"
            )
        self._db.executescript(schema)
        self._db.execute(f"PRAGMA user_version = {version}")

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[Run]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield lambda sql, *args: self._db.execute(sql, args)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def query(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()
