"""``S3Blobs``: artifacts in an S3-compatible bucket, for several edges that share no file system.

The bucket is the store of record: ``put`` returns once the object is there, under its content id
(``<prefix>sha256/<hex>``); a second write of the same content is harmless. Each edge keeps a local
read-through copy (a ``BlobStore`` directory), because the edge serves artifacts as files (ranges,
conditional GET): an artifact another edge stored is fetched from the bucket once, checked against its
content id, and served from disk after. Endpoint and credentials come from the AWS environment boto3
reads (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``),
so MinIO, Ceph, R2 or S3 itself all work alike.

A deleted artifact (a retired candidate) leaves the bucket and the deleting edge's copy. The copies
are a cache of at most ``cache_bytes``: past it, the least recently used go first (other edges'
copies of retired candidates among them).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.exceptions

from protocol.hashing import verify_content
from protocol.ids import ContentId

from .blobs import BlobStore

__all__ = ["S3Blobs"]


def parse_bucket_url(url: str) -> tuple[str, str]:
    """``s3://bucket[/prefix]`` as (bucket, prefix ending in ``/`` or empty); ``ValueError`` otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"blobs_url must look like s3://bucket/prefix, not {url!r}")
    prefix = parts.path.strip("/")
    return parts.netloc, f"{prefix}/" if prefix else ""


class S3Blobs:
    """``Blobs`` in the bucket of ``url`` (``s3://bucket/prefix``), with local copies in ``cache``."""

    def __init__(self, url: str, cache: Path, *, cache_bytes: int = 2 << 30, client: Any = None) -> None:
        self.bucket, self.prefix = parse_bucket_url(url)
        self.cache = BlobStore(cache)
        self.cache_bytes = cache_bytes
        self._s3 = client or boto3.client("s3")
        self._lock = threading.Lock()
        self._cached = sum(f.stat().st_size for f in self._copies())

    def _key(self, cid: ContentId) -> str:
        return f"{self.prefix}sha256/{cid.removeprefix('sha256:')}"

    def path(self, cid: ContentId) -> Path:
        local = self.cache.path(cid)
        if local.is_file():
            os.utime(local)  # recently used
        elif (data := self._get(cid)) is not None:
            self._keep(data, cid)  # checked against its content id before anything serves it
        return local

    def exists(self, cid: ContentId) -> bool:
        if self.cache.exists(cid):
            return True
        try:
            self._s3.head_object(Bucket=self.bucket, Key=self._key(cid))
        except botocore.exceptions.ClientError as exc:
            if _missing(exc):
                return False
            raise
        return True

    def put(self, data: bytes, expected: str) -> ContentId:
        cid = verify_content(data, expected)
        self._s3.put_object(Bucket=self.bucket, Key=self._key(cid), Body=data)
        self._keep(data, cid)
        return cid

    def delete(self, cid: ContentId) -> None:
        self._s3.delete_object(Bucket=self.bucket, Key=self._key(cid))
        self._drop(self.cache.path(cid))

    def read(self, cid: ContentId) -> bytes:
        return self.path(cid).read_bytes()

    def _get(self, cid: ContentId) -> bytes | None:
        try:
            return bytes(self._s3.get_object(Bucket=self.bucket, Key=self._key(cid))["Body"].read())
        except botocore.exceptions.ClientError as exc:
            if _missing(exc):
                return None
            raise

    # -- the local copies -------------------------------------------------------------------
    def _copies(self) -> list[Path]:
        return [f for f in (self.cache.root / "sha256").glob("*/*") if not f.name.startswith(".")]

    def _keep(self, data: bytes, cid: ContentId) -> None:
        if not self.cache.exists(cid):
            self.cache.put(data, cid)
            with self._lock:
                self._cached += len(data)
        if self._cached > self.cache_bytes:
            self._trim(keep=self.cache.path(cid))

    def _drop(self, path: Path) -> None:
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return
        with self._lock:
            self._cached -= size

    def _trim(self, keep: Path) -> None:
        """Least recently used copies out until the cache fits (never ``keep``, about to be served)."""
        for path in sorted(self._copies(), key=_last_used):
            if self._cached <= self.cache_bytes:
                return
            if path != keep:
                self._drop(path)


def _last_used(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # deleted meanwhile
        return 0.0


def _missing(exc: botocore.exceptions.ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")
