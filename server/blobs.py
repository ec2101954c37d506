"""Content-addressed artifact files: ``<root>/sha256/ab/cdef...`` written atomically and fsynced.

``Blobs`` is the interface the edge uses; ``BlobStore``, a directory, is its implementation. Several
edges share one directory (``blobs_dir``, on one host or a shared mount): names are content ids, a
file appears whole (written aside, then renamed) and writing the same content twice is harmless.
The edge serves artifacts as files (``path``), so a store that is not a file system (S3-compatible)
needs another way to serve them: not provided.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Protocol

from protocol.hashing import verify_content
from protocol.ids import ContentId

__all__ = ["BlobStore", "Blobs"]


class Blobs(Protocol):
    def path(self, cid: ContentId) -> Path:
        """The file that holds (or would hold) ``cid``."""
        ...

    def exists(self, cid: ContentId) -> bool: ...

    def put(self, data: bytes, expected: str) -> ContentId:
        """Store ``data`` if its content id is ``expected`` (else ``IntegrityError``); durable on return."""
        ...

    def delete(self, cid: ContentId) -> None:
        """Remove the artifact (a no-op when it is not there)."""
        ...

    def read(self, cid: ContentId) -> bytes: ...


class BlobStore:
    """``Blobs`` in the directory ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path(self, cid: ContentId) -> Path:
        digest = cid.removeprefix("sha256:")
        return self.root / "sha256" / digest[:2] / digest[2:]

    def exists(self, cid: ContentId) -> bool:
        return self.path(cid).is_file()

    def put(self, data: bytes, expected: str) -> ContentId:
        cid = verify_content(data, expected)
        target = self.path(cid)
        if target.exists():
            return cid
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")  # unique across hosts
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return cid

    def delete(self, cid: ContentId) -> None:
        self.path(cid).unlink(missing_ok=True)

    def read(self, cid: ContentId) -> bytes:
        return self.path(cid).read_bytes()
