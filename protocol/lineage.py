"""A lineage archive: one experiment's canonical heads with their certificates, the artifacts and
outer optimizer states they name, the trainers' candidates and the validators' verdicts, as one
content-addressed file any party can carry and anyone can check from the validator keys alone.

The archive is a plain (uncompressed) tar of ``index.json`` and ``blobs/<hex>`` files, each blob named
by the sha256 of its bytes::

    index.json   {"format": "dtn-lineage/1", "network_id", "experiment",
                  "heads": [HeadDescriptor with "certificate", genesis first],
                  "candidates": [Candidate], "verdicts": [Verdict], "votes": [Verdict]}
    blobs/<hex>  every head's artifact and every outer state a head names

Nothing in it is executed or unpickled: the index is JSON read by the strict ``from_wire`` readers,
blobs are bytes checked against their names. ``read_archive`` bounds what it reads (members, sizes,
names) before reading it; ``verify_lineage`` checks, before anything may be served:

- the parent chain: genesis first (no parent, window 0), then each head's parent is the head before
  it, one window later;
- every head: its proposer's signature and a quorum of listed validators vouching for it (the same
  rule as ``HeadDescriptor.verify_trusted``), the validators of its era where revisions of the network
  changed them (``protocol.network_revisions.head_network``);
- every blob a head names is in the archive and hashes to its name;
- every candidate: its trainer's signature, a base head in the lineage;
- every verdict: a listed validator's signature, on a candidate of the archive (same base, same
  peer), borne out by the lineage (``verdict_contradiction``, the rule edges apply to verdicts);
- every vote likewise: ``votes`` are the validators' verdicts that made one of ``verdicts`` count on a
  network whose quorum is above one (each verdict's own certificate: what an importer credits it
  from), on the candidate of a verdict of the archive. An archive without them (older ones) reads as
  none.

Any failure is a ``ProtocolError`` whose message is one line naming what is wrong and where.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .credit import Settled, settle
from .errors import InvalidMessage, SignatureError, TooLarge
from .fields import read_list, read_object, read_str
from .hashing import content_id, verify_content
from .ids import ContentId, ExperimentKey, HeadId
from .manifests import NetworkManifest
from .messages import Candidate, HeadDescriptor, Verdict
from .network_revisions import head_network

__all__ = [
    "FORMAT",
    "Lineage",
    "archive_id",
    "read_archive",
    "verdict_contradiction",
    "verify_lineage",
    "write_archive",
]

FORMAT = "dtn-lineage/1"
INDEX = "index.json"
MAX_INDEX_BYTES = 256 * 1024 * 1024
MAX_HEADS = 1 << 20
MAX_RECORDS = 1 << 24  # candidates, and verdicts
_BLOB = re.compile(r"blobs/([0-9a-f]{64})")


@dataclass(frozen=True)
class Lineage:
    """One experiment's lineage as an archive holds it: heads oldest first, with certificates;
    ``blobs`` by content id."""

    network_id: str
    experiment: ExperimentKey
    heads: tuple[HeadDescriptor, ...]
    candidates: tuple[Candidate, ...] = ()
    verdicts: tuple[Verdict, ...] = ()
    blobs: Mapping[ContentId, bytes] = field(default_factory=dict)
    votes: tuple[Verdict, ...] = ()

    def index(self) -> dict[str, object]:
        return {
            "format": FORMAT,
            "network_id": self.network_id,
            "experiment": self.experiment,
            "heads": [head.to_wire() for head in self.heads],
            "candidates": [candidate.to_wire() for candidate in self.candidates],
            "verdicts": [verdict.to_wire() for verdict in self.verdicts],
            "votes": [vote.to_wire() for vote in self.votes],
        }


def write_archive(lineage: Lineage) -> bytes:
    """The archive of ``lineage`` (deterministic: the same lineage gives the same bytes, so the
    archive's own sha256 names it)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        members = [(INDEX, json.dumps(lineage.index(), sort_keys=True).encode())]
        members += [(f"blobs/{cid.removeprefix('sha256:')}", data) for cid, data in sorted(lineage.blobs.items())]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def read_archive(data: bytes, *, max_blob_bytes: int) -> Lineage:
    """The lineage in archive ``data``, its shape checked (not its signatures: ``verify_lineage``).
    Refuses anything but regular files named ``index.json`` or ``blobs/<sha256 hex>``, a name twice,
    a blob over ``max_blob_bytes`` or not hashing to its name."""
    index: bytes | None = None
    blobs: dict[ContentId, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                name, body = member.name, _member_bytes(tar, member, max_blob_bytes)
                if name != INDEX:
                    cid = ContentId("sha256:" + name.removeprefix("blobs/"))
                    if cid in blobs:
                        raise InvalidMessage(f"archive holds blob {cid} twice")
                    verify_content(body, cid)
                    blobs[cid] = body
                elif index is None:
                    index = body
                else:
                    raise InvalidMessage(f"archive holds {INDEX} twice")
    except tarfile.TarError as exc:
        raise InvalidMessage(f"not a lineage archive (a plain tar): {exc}") from None
    if index is None:
        raise InvalidMessage(f"archive holds no {INDEX}")
    try:
        wire = read_object(json.loads(index), INDEX)
    except ValueError as exc:
        raise InvalidMessage(f"{INDEX} is not JSON: {exc}") from None
    if wire.get("format") != FORMAT:
        raise InvalidMessage(f"{INDEX} is not of format {FORMAT}")
    return Lineage(
        network_id=read_str(wire, "network_id", max_len=64),
        experiment=ExperimentKey.parse(wire.get("experiment")),
        heads=tuple(read_list(wire, "heads", HeadDescriptor.from_wire, max_len=MAX_HEADS)),
        candidates=tuple(read_list(wire, "candidates", Candidate.from_wire, max_len=MAX_RECORDS)),
        verdicts=tuple(read_list(wire, "verdicts", Verdict.from_wire, max_len=MAX_RECORDS)),
        blobs=blobs,
        votes=tuple(read_list(wire, "votes", Verdict.from_wire, max_len=MAX_RECORDS)) if "votes" in wire else (),
    )


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo, max_blob_bytes: int) -> bytes:
    """The bytes of ``member``, once its kind, name and size are checked."""
    if not member.isfile():
        raise InvalidMessage(f"archive member {member.name!r} is not a regular file")
    if member.name != INDEX and _BLOB.fullmatch(member.name) is None:
        raise InvalidMessage(f"archive member {member.name!r} is neither {INDEX} nor blobs/<sha256 hex>")
    limit = MAX_INDEX_BYTES if member.name == INDEX else max_blob_bytes
    if member.size > limit:
        raise TooLarge(f"archive member {member.name!r} has {member.size} bytes; at most {limit}")
    handle = tar.extractfile(member)
    assert handle is not None  # a regular file
    return handle.read()


def verdict_contradiction(verdict: Verdict, candidate: Candidate, deciding: Sequence[HeadDescriptor]) -> str | None:
    """Why ``verdict`` on ``candidate`` cannot stand in a lineage whose canonical heads that can have
    merged it are ``deciding`` (the one after its base, and the one after that), or ``None``: the rule
    edges apply to verdicts (``protocol.credit.settle``), and a lineage's verdicts are decided ones."""
    outcome, why = settle(verdict, candidate, deciding)
    if outcome is Settled.CONTRADICTS:
        return f"the verdict on {verdict.candidate_id} contradicts the canonical lineage: {why}"
    if outcome is Settled.PENDING:
        return f"candidate {verdict.candidate_id} is not decided by a canonical head yet"
    return None


def verify_lineage(lineage: Lineage, history: NetworkManifest | Sequence[NetworkManifest], *, held: int = 0) -> None:
    """Raise a ``ProtocolError`` (one line: what and where) unless ``lineage`` is a canonical lineage of
    the network ``history`` names (the checks listed above): the network, or the network at each of its
    revisions in order, when revisions changed its validators (each head is checked against the
    validators of its era, ``protocol.network_revisions.head_network``, and so is each verdict, by its
    candidate's base head). ``held``: its first heads are the checker's own, verified when it took them
    (a store's lineage that the rest continues): they are part of the parent chain, their signatures and
    blobs are not checked again, and the lineage need not carry those blobs."""
    if not lineage.heads:
        raise InvalidMessage("the lineage holds no head")
    networks = [history] if isinstance(history, NetworkManifest) else list(history)
    keys_of: dict[HeadId, frozenset[bytes]] = {}  # each head's era's validators: who may judge candidates on it
    by_id: dict[HeadId, HeadDescriptor] = {}
    previous: HeadDescriptor | None = None
    for at, head in enumerate(lineage.heads):
        where = f"head {head.head_id} (window {head.window})"
        if head.experiment != lineage.experiment:
            raise InvalidMessage(f"{where} is of experiment {head.experiment}, not {lineage.experiment}")
        expected = (None, 0) if previous is None else (previous.head_id, previous.window + 1)
        if (head.parent, head.window) != expected:
            raise InvalidMessage(
                f"{where} breaks the parent chain: its parent is {head.parent} at window {head.window}, "
                f"expected {expected[0]} at window {expected[1]}"
            )
        by_id[head.head_id] = previous = head
        network = head_network(networks, lineage.experiment, head.window)
        keys_of[head.head_id] = network.validator_key_set
        if at < held:
            continue
        try:
            head.verify_trusted(network.validator_key_set, network.quorum)
        except SignatureError as exc:
            raise SignatureError(f"{where}: {exc}") from None
        for cid in (head.head_id, head.outer_state):
            if cid is not None and cid not in lineage.blobs:
                raise InvalidMessage(f"{where} names {cid}, which the archive does not hold")
            if cid is not None:
                verify_content(lineage.blobs[cid], cid)
    candidates = {}
    for candidate in lineage.candidates:
        if candidate.experiment != lineage.experiment or candidate.base_head not in by_id:
            raise InvalidMessage(f"candidate {candidate.candidate_id} is not on a head of this lineage")
        try:
            candidate.verify_own()
        except SignatureError as exc:
            raise SignatureError(f"candidate {candidate.candidate_id}: {exc}") from None
        candidates[candidate.candidate_id] = candidate
    by_window = {head.window: head for head in lineage.heads}
    for verdict in lineage.verdicts:
        _check_verdict(verdict, lineage, candidates, by_id, by_window, keys_of)
    decided = {verdict.candidate_id for verdict in lineage.verdicts}
    for vote in lineage.votes:
        if vote.candidate_id not in decided:
            raise InvalidMessage(f"a vote on {vote.candidate_id}, which no verdict of the archive decides")
        _check_verdict(vote, lineage, candidates, by_id, by_window, keys_of)


def _check_verdict(
    verdict: Verdict,
    lineage: Lineage,
    candidates: Mapping[ContentId, Candidate],
    by_id: Mapping[HeadId, HeadDescriptor],
    by_window: Mapping[int, HeadDescriptor],
    keys_of: Mapping[HeadId, frozenset[bytes]],
) -> None:
    where = f"verdict on {verdict.candidate_id}"
    candidate = candidates.get(verdict.candidate_id)
    if verdict.experiment != lineage.experiment or candidate is None:
        raise InvalidMessage(f"{where}: no such candidate in the archive")
    if (candidate.base_head, candidate.peer_id) != (verdict.base_head, verdict.peer_id):
        raise InvalidMessage(f"{where} names another base head or peer than its candidate")
    if verdict.validator_key not in keys_of[candidate.base_head]:
        raise SignatureError(f"{where} is not signed by a validator of this network")
    try:
        verdict.verify(verdict.validator_key)
    except SignatureError as exc:
        raise SignatureError(f"{where}: {exc}") from None
    window = by_id[candidate.base_head].window
    deciding = [by_window[w] for w in (window + 1, window + 2) if w in by_window]
    if (contradiction := verdict_contradiction(verdict, candidate, deciding)) is not None:
        raise InvalidMessage(contradiction)


def archive_id(data: bytes) -> ContentId:
    """The archive's own content id (what an operator compares before importing a carried copy)."""
    return content_id(data)
