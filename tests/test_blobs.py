"""Artifact blob stores, one contract: a directory (``BlobStore``, the default) and an S3-compatible
bucket with local copies (``S3Blobs``), the latter against moto's S3 server on loopback (a real HTTP
S3 endpoint; boto3 talks to it as to any other). Then two real edges on one PostgreSQL store and one
bucket: what one edge stored, the other serves."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol.errors import IntegrityError
from protocol.hashing import content_id
from protocol.ids import ContentId
from server.blobs import Blobs, BlobStore
from server.serve import BackgroundEdge

from .support import EXPERIMENT, edge_settings, head_envelope, missing, private_postgres, write_network

__all__ = ["private_postgres"]  # the fixture, used by name

BUCKET = "dtn-artifacts"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        missing(f"moto's S3 server is needed ({exc.name}; make setup installs the dev extra)")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The AWS environment boto3 reads, pointing at the loopback server; a fresh, empty bucket."""
    import boto3

    for name, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3")
    for obj in client.list_objects_v2(Bucket=BUCKET).get("Contents", []) if _has_bucket(client) else []:
        client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    if not _has_bucket(client):
        client.create_bucket(Bucket=BUCKET)
    return f"s3://{BUCKET}/edge"


def _has_bucket(client: Any) -> bool:
    return any(b["Name"] == BUCKET for b in client.list_buckets().get("Buckets", []))


def _s3(url: str, cache: Path, **options: Any) -> Blobs:
    from server.blobs_s3 import S3Blobs

    return S3Blobs(url, cache, **options)


@pytest.fixture(params=["directory", "s3"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> Blobs:
    if request.param == "directory":
        return BlobStore(tmp_path / "blobs")
    return _s3(request.getfixturevalue("s3_env"), tmp_path / "cache")


def test_blobs_keep_checked_content_by_its_id(blobs: Blobs) -> None:
    data = b"a head artifact" * 100
    cid = content_id(data)
    with pytest.raises(IntegrityError):
        blobs.put(b"other bytes", cid)
    assert not blobs.exists(cid)
    assert blobs.put(data, cid) == cid and blobs.put(data, cid) == cid  # a second write is harmless
    assert blobs.exists(cid) and blobs.read(cid) == data and blobs.path(cid).read_bytes() == data
    blobs.delete(cid)
    assert not blobs.exists(cid)
    blobs.delete(cid)  # gone already: a no-op


def test_an_edge_reads_through_to_the_bucket_and_checks_what_it_gets(s3_env: str, tmp_path: Path) -> None:
    import boto3

    first, second = _s3(s3_env, tmp_path / "a"), _s3(s3_env, tmp_path / "b", cache_bytes=2500)
    artifacts = [bytes([i]) * 1000 for i in range(3)]
    ids = [first.put(data, content_id(data)) for data in artifacts]
    assert all(second.exists(cid) for cid in ids)  # another edge's cache is empty: the bucket answers
    assert [second.read(cid) for cid in ids] == artifacts
    copies = sorted(p for p in (tmp_path / "b" / "sha256").glob("*/*"))
    assert len(copies) == 2  # 2,500 bytes of copies: the least recently used one went
    assert second.read(ids[0]) == artifacts[0]  # and comes back from the bucket when asked for
    # bytes in the bucket that are not what their key names are never served
    forged = ContentId("sha256:" + hashlib.sha256(b"what the key names").hexdigest())
    boto3.client("s3").put_object(Bucket=BUCKET, Key=f"edge/sha256/{forged.removeprefix('sha256:')}", Body=b"forged")
    with pytest.raises(IntegrityError):
        second.path(forged)
    assert not (tmp_path / "b" / "sha256" / forged[7:9] / forged[9:]).exists()


@pytest.mark.slow
def test_two_edges_on_one_store_and_one_bucket_serve_each_others_artifacts(
    s3_env: str, private_postgres: Any, tmp_path: Path, dataset_root: Path
) -> None:
    write_network(tmp_path / "network.json")
    store_url = private_postgres.create_database("s3_blobs")
    settings = {
        name: edge_settings(tmp_path, dataset_root, data_dir=tmp_path / name, store_url=store_url, blobs_url=s3_env)
        for name in ("a", "b")
    }
    with BackgroundEdge(settings["a"]) as a, BackgroundEdge(settings["b"]) as b:
        head, body = head_envelope()
        assert httpx.post(f"{a.url}/v1/experiments/{EXPERIMENT}/heads", content=body).status_code == 201
        served = httpx.get(f"{b.url}/v1/artifacts/{head.head_id}")
        assert served.status_code == 200 and content_id(served.content) == head.head_id
        assert served.headers["etag"] == f'"{head.head_id}"'
        assert httpx.get(f"{b.url}/v1/artifacts/{head.head_id}", headers={"range": "bytes=0-9"}).status_code == 206
