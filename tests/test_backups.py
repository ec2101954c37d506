"""Backups of a serving edge (``server.backup``, ``python -m tools backup | restore``): an online copy of
its SQLite store and artifacts, restored into a fresh edge that serves the same heads with the same key;
and the runbook's PostgreSQL commands (``pg_dump`` of a serving edge's store, ``pg_restore`` into a new
database, the blobs directory copied) the same way."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol.codec import encode_tensors
from protocol.messages import HeadDescriptor
from protocol.model import init_params
from server.serve import BackgroundEdge
from server.settings import Settings

from .support import EXPERIMENT, SPEC, edge_settings, head_envelope, private_postgres, tools_output, write_network

__all__ = ["private_postgres"]  # the fixture, used by name

BASE = f"/v1/experiments/{EXPERIMENT}"


def _publish(http: httpx.Client, parent: HeadDescriptor | None) -> HeadDescriptor:
    window = 0 if parent is None else parent.window + 1
    head, body = head_envelope(
        init_params(SPEC, window), parent=None if parent is None else parent.head_id, window=window
    )
    response = http.post(f"{BASE}/heads", content=body)
    assert response.status_code == 201, response.text
    return head


def _assert_restored(settings: Settings, held: list[HeadDescriptor], later: HeadDescriptor, key: str) -> None:
    """A restored edge serves the ``held`` heads, their artifacts and the old ``key``, and the lineage goes
    on from its last head (to ``later``, certified after the backup and published again)."""
    genesis, first = held
    with BackgroundEdge(settings) as edge, httpx.Client(base_url=edge.url, timeout=10) as http:
        assert [h["head_id"] for h in http.get(f"{BASE}/heads").json()] == [genesis.head_id, first.head_id]
        assert http.get("/v1/network").json()["edge_key"] == key  # peers go on without a new key
        assert http.get(f"/v1/artifacts/{first.head_id}").content == encode_tensors(init_params(SPEC, 1))
        _, body = head_envelope(init_params(SPEC, 2), parent=first.head_id, window=2)
        assert http.post(f"{BASE}/heads", content=body).status_code == 201  # the lineage goes on from it
        assert http.get(f"{BASE}/head").json()["head_id"] == later.head_id


def test_a_backup_taken_while_the_edge_serves_restores_into_a_fresh_edge(tmp_path: Path, dataset_root: Path) -> None:
    write_network(tmp_path / "network.json")
    settings = edge_settings(tmp_path, dataset_root)
    with BackgroundEdge(settings) as edge, httpx.Client(base_url=edge.url, timeout=10) as http:
        genesis = _publish(http, None)
        first = _publish(http, genesis)
        printed = tools_output(["backup", "--data-dir", str(tmp_path / "edge"), "--out", str(tmp_path / "backup")])
        later = _publish(http, first)  # certified after the backup: a validator gives it back (test_edge_replacement)
        key = http.get("/v1/network").json()["edge_key"]
    assert "2 artifacts" in printed
    assert (tmp_path / "backup" / "edge.sqlite3").stat().st_mode & 0o077 == 0  # it holds the edge's seed

    fresh = tmp_path / "fresh"
    restored = tools_output(["restore", str(tmp_path / "backup"), "--data-dir", str(fresh / "edge")])
    assert "2 artifacts checked" in restored
    restored_settings = edge_settings(tmp_path, dataset_root, data_dir=fresh / "edge")
    _assert_restored(restored_settings, [genesis, first], later, key)


@pytest.mark.slow  # a PostgreSQL cluster
def test_a_postgresql_store_dumped_while_the_edge_serves_restores_into_a_new_database(
    private_postgres: Any, tmp_path: Path, dataset_root: Path
) -> None:
    from deploy.services import postgres_bin

    write_network(tmp_path / "network.json")
    url, dump = private_postgres.create_database("dumped"), tmp_path / "edge.dump"
    settings = edge_settings(tmp_path, dataset_root, store_url=url)
    with BackgroundEdge(settings) as edge, httpx.Client(base_url=edge.url, timeout=10) as http:
        genesis = _publish(http, None)
        first = _publish(http, genesis)
        subprocess.run([postgres_bin() / "pg_dump", "--format=custom", f"--file={dump}", url], check=True, timeout=60)
        shutil.copytree(tmp_path / "edge" / "blobs", tmp_path / "fresh" / "edge" / "blobs")  # after the dump
        later = _publish(http, first)  # certified after the backup: a validator gives it back
        key = http.get("/v1/network").json()["edge_key"]

    restored = private_postgres.create_database("restored")
    subprocess.run(  # the runbook's command, into a new database
        [postgres_bin() / "pg_restore", "--clean", "--if-exists", f"--dbname={restored}", str(dump)],
        check=True,
        timeout=60,
    )
    fresh = edge_settings(tmp_path, dataset_root, store_url=restored, data_dir=tmp_path / "fresh" / "edge")
    _assert_restored(fresh, [genesis, first], later, key)


def test_a_restore_refuses_a_live_store_and_a_tampered_artifact(tmp_path: Path, dataset_root: Path) -> None:
    write_network(tmp_path / "network.json")
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge, httpx.Client(base_url=edge.url) as http:
        genesis = _publish(http, None)
    edge_dir = str(tmp_path / "edge")
    tools_output(["backup", "--data-dir", edge_dir, "--out", str(tmp_path / "backup")])
    with pytest.raises(SystemExit, match="exists: restore into an edge without a store"):
        tools_output(["restore", str(tmp_path / "backup"), "--data-dir", edge_dir])
    digest = genesis.head_id.removeprefix("sha256:")
    blob = tmp_path / "backup" / "blobs" / "sha256" / digest[:2] / digest[2:]
    blob.write_bytes(blob.read_bytes()[:-1] + b"!")
    with pytest.raises(SystemExit, match="content id mismatch"):
        tools_output(["restore", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "fresh")])
    assert not (tmp_path / "fresh" / "edge.sqlite3").exists()
