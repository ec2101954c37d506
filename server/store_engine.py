"""The storage engine interface ``server.store.EdgeStore`` runs its SQL over: a write transaction, a
read, close. ``server.store_sqlite`` and ``server.store_postgres`` implement it; statements are in the
dialect ``server.store`` describes."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

__all__ = ["Cursor", "Database", "Run"]


class Cursor(Protocol):
    """What a statement run in a transaction answers (a DB-API cursor)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


Run = Callable[..., Cursor]  # run(sql, *args): one statement of a transaction


class Database(Protocol):
    """One storage engine (``server.store_sqlite``, ``server.store_postgres``): statements in the
    shared dialect, the schema created and its version checked when it opens."""

    def transaction(self) -> AbstractContextManager[Run]:
        """A write transaction that excludes every other writer of the database until it commits
        (or rolls back, on an exception); it yields ``run(sql, *args)``."""
        ...

    def query(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        """Rows of one read, outside any transaction."""
        ...

    def close(self) -> None: ...
