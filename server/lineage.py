"""An experiment's lineage in and out of an edge's store, as a lineage archive (``protocol.lineage``).

``export_lineage`` reads the canonical heads (with their certificates), the artifacts and outer states
they name, the candidates, the verdicts and the votes that made them count. ``import_lineage`` takes an archive into a store: it
verifies the whole archive first (every signature, each head's quorum, the parent chain, the verdicts
against the lineage: ``protocol.lineage.verify_lineage``), that it is of this network and experiment,
that every head and outer state is exactly a float32 artifact of the experiment's model, and that the
store's own lineage of the experiment is a prefix of it; only then are blobs, candidates, heads (in
window order, each on its parent), verdicts and votes written. A verdict credits its examples where
the network's quorum is one, or where the archive's votes on its candidate (``Lineage.votes``) make
the quorum sign its decision; the votes are kept, for an edge that follows this one. Nothing is served before all of it is checked.
A lineage may also continue the store's: its first head at window w > 0 on the store's head of window
w - 1 (what an edge that follows another takes, ``server.follower``); the store's heads before it are
then its start, verified when the store took them.

A candidate taken from an archive has no artifact here (an archive carries heads, not the candidates'
bytes); its descriptor is what its verdicts are checked against.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from protocol.credit import credited_examples, same_decision
from protocol.errors import InvalidMessage
from protocol.ids import ContentId, ExperimentKey
from protocol.lineage import Lineage, verify_lineage
from protocol.manifests import NetworkManifest
from protocol.messages import Candidate, Verdict
from protocol.updates import read_artifact

from .blobs import Blobs
from .errors import Conflict
from .store import EdgeStore

__all__ = ["ImportReport", "export_lineage", "import_lineage"]

_PAGE = 5000
T = TypeVar("T")


def export_lineage(store: EdgeStore, blobs: Blobs, network: NetworkManifest, key: ExperimentKey) -> Lineage:
    """The lineage of ``key`` as ``store`` and ``blobs`` hold it."""
    heads = tuple(store.heads(key))
    if not heads:
        raise InvalidMessage(f"the store holds no head of {key}")
    names = [cid for head in heads for cid in (head.head_id, head.outer_state) if cid is not None]
    verdicts = tuple(_every(lambda at: [(p, v) for p, v, _ in store.verdicts_after(key, at, _PAGE)]))
    decided = {verdict.candidate_id for verdict in verdicts}  # the votes of verdicts that count, not pending ones
    return Lineage(
        network_id=network.network_id,
        experiment=key,
        heads=heads,
        candidates=tuple(_every(lambda since: store.candidates_since(key, since, _PAGE))),
        verdicts=verdicts,
        blobs={ContentId(cid): blobs.read(ContentId(cid)) for cid in names},
        votes=tuple(v for v in _every(lambda at: store.votes_after(key, at, _PAGE)) if v.candidate_id in decided),
    )


def _every(page: Callable[[int], list[tuple[int, T]]]) -> list[T]:
    """Every item of a store listing read ``_PAGE`` at a time: ``page(cursor)`` lists those after
    ``cursor`` (0: from the first), each with its own cursor."""
    found: list[T] = []
    cursor = 0
    while rows := page(cursor):
        found += [item for _, item in rows]
        cursor = rows[-1][0]
    return found


@dataclass(frozen=True)
class ImportReport:
    """What an import added: ``heads`` from window ``first_window`` on, candidates and verdicts."""

    heads: int
    first_window: int
    candidates: int
    verdicts: int


def import_lineage(
    store: EdgeStore, blobs: Blobs, history: Sequence[NetworkManifest], lineage: Lineage, now_ms: int
) -> ImportReport:
    """Take ``lineage`` into ``store`` and ``blobs`` once every check above passed (``ProtocolError``
    otherwise; ``Conflict`` when the store holds another lineage of the experiment). ``history``: the
    network at each of its revisions, in order (``EdgeState.history``; the network alone when never
    revised), the last the one served: heads are checked against the validators of their era."""
    network = history[-1]
    if lineage.network_id != network.network_id:
        raise InvalidMessage(f"the archive is of network {lineage.network_id!r}, not {network.network_id!r}")
    try:
        spec = network.experiment(lineage.experiment)
    except KeyError:
        raise InvalidMessage(f"network {network.network_id!r} runs no experiment {lineage.experiment}") from None
    stored = store.heads(lineage.experiment)
    first = lineage.heads[0].window if lineage.heads else 0
    if first > len(stored):
        raise Conflict(
            f"the lineage begins at window {first}; the store holds {lineage.experiment} up to window {len(stored) - 1}"
        )
    lineage = replace(lineage, heads=(*stored[:first], *lineage.heads))
    verify_lineage(lineage, history, held=first)
    for head in lineage.heads[first:]:
        for cid in (head.head_id, head.outer_state):
            if cid is not None:
                read_artifact(spec.model, lineage.blobs[cid], "fp32")
    held = [head.head_id for head in stored]
    ours = [head.head_id for head in lineage.heads[: len(held)]]
    if held != ours:
        at = next((i for i, (a, b) in enumerate(zip(held, ours, strict=False)) if a != b), len(ours))
        raise Conflict(f"the store holds another lineage of {lineage.experiment} (it differs at window {at})")
    for cid, data in lineage.blobs.items():
        blobs.put(data, cid)
    candidates = sum(store.add_candidate(candidate, 0, now_ms) for candidate in lineage.candidates)
    for head in lineage.heads[len(held) :]:
        store.promote_head(head, now_ms, network.revision)
    candidates_by_id = {c.candidate_id: c for c in lineage.candidates}
    votes: dict[str, list[Verdict]] = defaultdict(list)
    for vote in lineage.votes:
        votes[vote.candidate_id].append(vote)
        store.add_vote(vote)
    verdicts = sum(
        store.add_verdict(verdict, _credited(verdict, candidates_by_id[verdict.candidate_id], network, votes))
        for verdict in lineage.verdicts
    )
    return ImportReport(len(lineage.heads) - len(held), len(held), candidates, verdicts)


def _credited(verdict: Verdict, candidate: Candidate, network: NetworkManifest, votes: dict[str, list[Verdict]]) -> int:
    """The examples an imported verdict credits: what it vouches for, at most the candidate's declared
    count, when a quorum of the network's validators signed its decision (itself and the archive's
    votes on its candidate: ``protocol.credit.same_decision``); none otherwise."""
    signed = same_decision(verdict, votes[verdict.candidate_id], network.validator_key_set)
    return credited_examples(verdict, candidate, candidate.examples) if signed >= network.quorum else 0
