"""A node's storage directory: identity, cached heads and shards, per-experiment state.

<root>/identity.key                       32-byte Ed25519 seed (0600)
<root>/heads/<hex>.safetensors            downloaded head artifacts
<root>/shards/<sha256>.safetensors        shard cache, by content (verified on use)
<root>/experiments/<study>__<exp>__<rev>/state.json, optimizer.safetensors
<root>/outcomes.jsonl                     one line per published candidate
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.ids import ContentId, ExperimentKey

__all__ = ["StorageConfig", "write_atomic"]


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all; writers of the same path at once (threads or
    processes: a shard two leases hold) each write a temporary file of their own, the last rename wins."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@dataclass(frozen=True)
class StorageConfig:
    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def identity_path(self) -> Path:
        return self.root / "identity.key"

    @property
    def network_revisions_path(self) -> Path:
        """The revisions of the network's terms this node followed (``native_peer.network_chain``)."""
        return self.root / "network-revisions.json"

    def head_path(self, cid: ContentId) -> Path:
        return self.root / "heads" / f"{cid.removeprefix('sha256:')}.safetensors"

    @property
    def shards_dir(self) -> Path:
        """The shard cache: ``shard_path`` of each kept shard, nothing else but writers' temporary files."""
        return self.root / "shards"

    def shard_path(self, sha256: str) -> Path:
        """Where a shard whose fetch-manifest sha256 is ``sha256`` is cached (``protocol.content_cache``)."""
        return self.shards_dir / f"{sha256}.safetensors"

    def experiment_dir(self, key: ExperimentKey) -> Path:
        return self.root / "experiments" / key.replace("/", "__")

    @property
    def outcomes_path(self) -> Path:
        return self.root / "outcomes.jsonl"

    def append_outcome(self, record: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.outcomes_path, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    def outcomes(self) -> list[dict[str, Any]]:
        """The outcome records appended so far, oldest first (a line still being written is left out)."""
        if not self.outcomes_path.exists():
            return []
        text = self.outcomes_path.read_text()
        return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]
