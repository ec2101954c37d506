"""What a validator holds of an experiment's canonical lineage, so that an edge that lost it (a new,
empty store) gets it back instead of a new genesis.

``LineageJournal``: the canonical heads as this node read them, each with its certificate, one JSON
line per head in window order (genesis first) in ``<storage>/experiments/<key>/lineage.jsonl``; their
artifacts and outer states stay in the node's head files (``StorageConfig.head_path``). ``extend``
appends a head read as canonical (verified by the caller) and any of its ancestors the node did not
read (asked of the edge through ``parent_of``, each verified; back to genesis for a journal begun on
a running network); a head whose lineage does not run
through the journal's last head is not appended (another lineage: a warning). ``after(head_id)``
lists what the journal holds past the edge's current head: what the edge lost.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from protocol.ids import HeadId
from protocol.messages import HeadDescriptor

__all__ = ["LineageJournal"]

log = logging.getLogger(__name__)


class LineageJournal:
    def __init__(self, path: Path) -> None:
        self.path = path
        text = path.read_text() if path.exists() else ""
        lines = text.splitlines()[: text.count("\n")]  # a line cut short by a crash was never written
        self.heads = [HeadDescriptor.from_wire(json.loads(line)) for line in lines]
        self._index = {head.head_id: i for i, head in enumerate(self.heads)}

    @property
    def last(self) -> HeadDescriptor | None:
        return self.heads[-1] if self.heads else None

    def after(self, head_id: HeadId | None) -> list[HeadDescriptor]:
        """The heads past ``head_id`` (``None``: every head, from genesis); none when ``head_id`` is
        not in the journal."""
        if head_id is None:
            return list(self.heads)
        at = self._index.get(head_id)
        return [] if at is None else self.heads[at + 1 :]

    def extend(
        self, head: HeadDescriptor, parent_of: Callable[[HeadId], HeadDescriptor | None]
    ) -> list[HeadDescriptor]:
        """Append canonical ``head`` and the ancestors between it and the last head held; returns what
        was appended, oldest first."""
        if head.head_id in self._index:
            return []
        last = self.last
        missing = [head]
        while missing[-1].parent != (None if last is None else last.head_id):
            child = missing[-1]
            found = None if child.parent is None else parent_of(child.parent)
            if found is None or found.window != child.window - 1:  # windows fall: the walk ends
                log.warning(
                    "%s: head %s of window %d does not continue the lineage held here (last: window %s); not kept",
                    head.experiment,
                    head.head_id[:19],
                    head.window,
                    None if last is None else last.window,
                )
                return []
            missing.append(found)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as handle:
            for ancestor in reversed(missing):
                handle.write(json.dumps(ancestor.to_wire()) + "\n")
                self._index[ancestor.head_id] = len(self.heads)
                self.heads.append(ancestor)
        return missing[::-1]
