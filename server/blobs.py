"""Content-addressed artifact files: ``<root>/sha256/ab/cdef...`` written atomically and fsynced."""

from __future__ import annotations

import os
from pathlib import Path

from protocol.hashing import verify_content
from protocol.ids import ContentId

__all__ = ["BlobStore"]


class BlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path(self, cid: ContentId) -> Path:
        digest = cid.removeprefix("sha256:")
        return self.root / "sha256" / digest[:2] / digest[2:]

    def exists(self, cid: ContentId) -> bool:
        return self.path(cid).is_file()

    def put(self, data: bytes, expected: str) -> ContentId:
        """Store ``data`` if its content id is ``expected`` (else ``IntegrityError``); durable on return."""
        cid = verify_content(data, expected)
        target = self.path(cid)
        if target.exists():
            return cid
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
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
        """Remove the artifact (a no-op when it is not there)."""
        self.path(cid).unlink(missing_ok=True)

    def read(self, cid: ContentId) -> bytes:
        return self.path(cid).read_bytes()
