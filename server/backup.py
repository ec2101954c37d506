"""Backups of an edge's embedded store and its artifacts, taken while the edge serves, and restoring one
into an edge that has no store yet.

A backup is a directory: ``edge.sqlite3``, a consistent copy of the SQLite store made with SQLite's
online backup API (writers go on while it is copied), and ``blobs/``, the artifact files. Artifacts
are written before the records that name them commit (``server.intake``), and they are immutable and
named by content. Copying them after the store snapshot therefore gives every artifact the snapshot
names. The copy holds the edge's signing seed (its key) and the tokens' digests, so it is created
readable by its owner alone.

``restore_backup`` refuses a target that already has a store. It checks the copy's schema version as
the edge would (``server.store``) and every artifact against its name. The restored edge has the same
key, so peers go on without reading the network again. Heads certified after the backup are given back
by the validators (``native_peer.lineage_journal``).

PostgreSQL stores (``store_url``) are backed up with ``pg_dump`` and restored with ``pg_restore``
(deploy/README.md). An S3 bucket keeps its own versions.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from protocol.hashing import verify_content
from protocol.ids import ContentId

from .store import Store

__all__ = ["BackupReport", "restore_backup", "take_backup"]

STORE_FILE = "edge.sqlite3"  # ``server.store.open_store``'s file in the data dir
_BLOB = re.compile(r"sha256/([0-9a-f]{2})/([0-9a-f]{62})")  # ``server.blobs.BlobStore.path``


@dataclass(frozen=True)
class BackupReport:
    store_bytes: int
    blobs: int


def take_backup(data_dir: Path, blobs_root: Path, out: Path) -> BackupReport:
    """Copy the store in ``data_dir`` and the artifacts under ``blobs_root`` into the new directory ``out``."""
    source = data_dir / STORE_FILE
    if not source.is_file():
        raise FileNotFoundError(f"no edge store at {source}")
    out.mkdir(mode=0o700, parents=True, exist_ok=False)
    target = out / STORE_FILE
    os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o600))
    live, copy = sqlite3.connect(source), sqlite3.connect(target)
    try:
        live.backup(copy)  # a consistent snapshot, page by page, while the edge writes on
    finally:
        live.close()
        copy.close()
    return BackupReport(target.stat().st_size, _copy_blobs(blobs_root, out / "blobs", check=False))


def restore_backup(backup: Path, data_dir: Path, blobs_root: Path) -> BackupReport:
    """Put the backup ``backup`` in place as the store of ``data_dir`` and the artifacts under
    ``blobs_root``; refused when ``data_dir`` has a store already, when the copy is of another schema,
    or when an artifact does not hash to its name."""
    target = data_dir / STORE_FILE
    if target.exists():
        raise FileExistsError(f"{target} exists: restore into an edge without a store (stop it, move its data aside)")
    blobs = _copy_blobs(backup / "blobs", blobs_root, check=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    shutil.copyfile(backup / STORE_FILE, target)
    try:
        Store(target).close()  # the schema version, checked as the edge checks it
    except (RuntimeError, sqlite3.DatabaseError):
        target.unlink()
        raise
    return BackupReport(target.stat().st_size, blobs)


def _copy_blobs(source: Path, target: Path, *, check: bool) -> int:
    """Copy every artifact file under ``source`` (names as ``BlobStore`` makes them; its temporary files
    are left out) to ``target``; with ``check``, each verified against its name first."""
    copied = 0
    for path in sorted(source.glob("sha256/*/*")):
        match = _BLOB.fullmatch(path.relative_to(source).as_posix())
        if match is None or not path.is_file():
            continue
        if check:
            verify_content(path.read_bytes(), ContentId(f"sha256:{match.group(1)}{match.group(2)}"))
        destination = target / path.relative_to(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        if not destination.exists():
            shutil.copyfile(path, destination)
        copied += 1
    return copied
