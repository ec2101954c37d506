"""A peer's record in the lineage, and the merge weight it earns (issue #27: identities cost
something until they have a record).

A peer's **record** at a window is the number of the last ``RECORD_HEADS`` canonical heads (the
window's base head and those before it) that merged a candidate of its. Every validator of a quorum
reads it from the same public data (the canonical heads' ``merged`` candidate ids and those
candidates' signed descriptors), never from its own trust book, so a validator that lost its disk
weighs every candidate as the others do (a first attempt that read it from each validator's trust
book broke a quorum's agreement: docs/results/2026-12-attack-suite.md).

Its update weighs ``record_weight(record)`` = (1 + min(record, ``FULL_RECORD``)) / (1 + ``FULL_RECORD``)
of an established peer's in a merge: a new identity a quarter, a peer merged in three of the recent
windows fully. The weights are multiples of a quarter, so every validator's float64 merge of the same
rows is the same bytes. A window whose peers are all new (a lone trainer, a first cohort) is not
changed: the merge normalizes the weights. A Sybil majority of fresh keys weighs as a minority; an
attacker that keeps its key earns a record as an honest peer does (measured: docs/results/2026-12-attack-suite.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from .judging import Submission

__all__ = ["FULL_RECORD", "RECORD_HEADS", "peer_records", "record_weight", "weigh_by_record"]

RECORD_HEADS = 8  # the canonical heads a record counts: the window's base head and the 7 before it
FULL_RECORD = 3  # heads merging a peer's work after which its update weighs fully


def peer_records(merged_peers: Iterable[Iterable[str]]) -> dict[str, int]:
    """Each peer's record from the peers each of the last ``RECORD_HEADS`` canonical heads merged a
    candidate of (one collection per head; a peer counts once per head)."""
    return dict(Counter(peer for peers in merged_peers for peer in set(peers)))


def record_weight(record: int) -> float:
    """What an update weighs in a merge relative to an established peer's: a multiple of a quarter."""
    return (1 + min(record, FULL_RECORD)) / (1 + FULL_RECORD)


def weigh_by_record(
    submissions: Sequence[Submission], records: Mapping[str, int], caps: Mapping[str, float]
) -> list[Submission]:
    """``submissions`` with each one's merge weight (its examples, capped per peer kind by ``caps``)
    times its peer's ``record_weight``."""
    return [
        replace(
            s, examples=min(s.examples, caps.get(s.peer_kind, s.examples)) * record_weight(records.get(s.peer_id, 0))
        )
        for s in submissions
    ]
