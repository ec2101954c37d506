"""Signed messages that cross the wire: ``Lease``, ``Candidate``, ``HeadDescriptor``, ``Verdict``.

Each is a frozen dataclass with ``body()`` (the signed fields as JSON-ready data), ``to_wire()`` /
``from_wire()`` (strict: unknown shapes raise ``InvalidMessage``), ``signed(signer)`` and
``verify(public_key)``. A signature covers ``DOMAIN || canonical_json(body())``.

A ``LeaseGrant`` is the one unsigned exception: the lease plus the secret that unlocks its shards,
sent only to the lease's holder (``LEASE_SECRET_HEADER`` carries the secret on shard requests).

Who signs what: the edge signs leases, a trainer signs its candidates, a validator signs heads,
attestations of other validators' heads, and verdicts. Peer ids derive from public keys, so a
candidate names its trainer verifiably.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from .errors import InvalidMessage, SignatureError
from .fields import opt, read_bool, read_dict, read_int, read_list, read_object, read_str
from .hashing import content_id
from .ids import ContentId, DatasetId, ExperimentKey, HeadId, LeaseId, PeerId, ShardId
from .reasons import Reason
from .signing import Signer, b64decode, b64encode, canonical_json, peer_id_from_public_key, require_signature

__all__ = [
    "CANDIDATE_PAGE",
    "CURRENT_HEAD_HEADER",
    "EVALUATION_PAGE",
    "EVALUATION_SPLITS",
    "LEASE_SECRET_HEADER",
    "MAX_WINDOW_CANDIDATES",
    "NEXT_SINCE_HEADER",
    "PEER_KINDS",
    "READ_PROOF_HEADER",
    "TRAINER_KINDS",
    "VERDICT_BATCH",
    "Attestation",
    "Candidate",
    "Evaluation",
    "HeadDescriptor",
    "Lease",
    "LeaseGrant",
    "PeerProof",
    "Verdict",
    "evaluated_metrics",
    "merged_evaluations",
]

LEASE_SECRET_HEADER = "dtn-lease-secret"
READ_PROOF_HEADER = "dtn-read-proof"  # a PeerProof(purpose="read", nonce=<request path>#<fresh>), base64url JSON
READ_NONCE_MIN_CHARS = 16  # the fresh part of a read proof's nonce (PeerProof.for_read makes 16)
EVALUATION_PAGE = 1000  # evaluations one listing answers at most
EVALUATION_SPLITS = ("test",)  # what validators measure heads on apart from the heads themselves
NEXT_SINCE_HEADER = "dtn-next-since"  # the cursor to continue a ``since=`` listing from
CANDIDATE_PAGE = 1000  # candidates one listing answers at most (a shorter page: nothing more for now)
CURRENT_HEAD_HEADER = "dtn-current-head"  # a candidate listing's: the experiment's current head id as it was read
VERDICT_BATCH = 1024  # the most verdicts one request publishes
MAX_WINDOW_CANDIDATES = 4096  # the most candidates a head merges and an attestation lists as considered
PEER_KINDS = ("native", "browser", "validator", "viewer")
TRAINER_KINDS = ("native", "browser")  # the kinds that lease shards and upload candidates


class _Signed:
    DOMAIN: ClassVar[bytes]
    signature: bytes

    def body(self) -> dict[str, Any]:
        raise NotImplementedError

    def to_wire(self) -> dict[str, Any]:
        return {**self.body(), "signature": b64encode(self.signature)}

    def signed(self, signer: Signer) -> Self:
        return dataclasses.replace(self, signature=signer.sign(self.DOMAIN + canonical_json(self.body())))  # type: ignore[type-var]

    def verify(self, public_key: bytes) -> None:
        """Raise ``SignatureError`` unless this message is signed by ``public_key``."""
        require_signature(public_key, self.DOMAIN, self.body(), self.signature)


class _SelfSigned(_Signed):
    """A message signed by the key it carries: the sender's own identity."""

    public_key: bytes
    peer_kind: str

    @property
    def peer_id(self) -> PeerId:
        return peer_id_from_public_key(self.public_key)

    def verify_own(self) -> None:
        """Raise ``SignatureError`` unless the peer named in the message signed it."""
        self.verify(self.public_key)

    def _checked(self) -> Self:
        if self.peer_kind not in PEER_KINDS:
            raise InvalidMessage(f"unknown peer kind {self.peer_kind!r}")
        return self


def _signature(data: Mapping[str, object]) -> bytes:
    return b64decode(data.get("signature", ""), size=64)


def _key(data: Mapping[str, object], name: str) -> bytes:
    return b64decode(data.get(name), size=32)


def _metrics(data: Mapping[str, object]) -> dict[str, float]:
    return read_dict(data, "metrics") if "metrics" in data else {}


def _head_fields(data: Mapping[str, object]) -> dict[str, Any]:
    """What a head and an attestation of it both name: experiment, head id, parent, window, merge."""
    parent = data.get("parent")
    return {
        "experiment": ExperimentKey.parse(data.get("experiment")),
        "head_id": HeadId(data.get("head_id")),
        "parent": None if parent is None else HeadId(parent),
        "window": read_int(data, "window"),
        "merged": tuple(read_list(data, "merged", ContentId, max_len=MAX_WINDOW_CANDIDATES)),
        "outer_state": None if data.get("outer_state") is None else ContentId(data.get("outer_state")),
    }


def _reason(data: Mapping[str, object]) -> Reason:
    code = read_str(data, "reason", max_len=32)
    try:
        return Reason(code)
    except ValueError:
        raise InvalidMessage(f"unknown verdict reason {code!r}") from None


@dataclass(frozen=True)
class Lease(_Signed):
    """Which shards ``peer_id`` trains on, on top of ``base_head``, for one window. Signed by the edge.

    ``principal`` names who answers for the peer on an admission network (its token's id), so that
    validators can cap the merge weight of all keys under one token together."""

    DOMAIN: ClassVar[bytes] = b"dtn/lease/v1\n"

    lease_id: LeaseId
    experiment: ExperimentKey
    peer_id: PeerId
    base_head: HeadId
    window: int
    dataset_id: DatasetId
    shard_ids: tuple[ShardId, ...]
    issued_at_ms: int
    expires_at_ms: int
    principal: str | None = None  # the admission token (its id) the lease was granted under, if any
    signature: bytes = b""

    def body(self) -> dict[str, Any]:
        return {
            "principal": self.principal,
            "lease_id": self.lease_id,
            "experiment": self.experiment,
            "peer_id": self.peer_id,
            "base_head": self.base_head,
            "window": self.window,
            "dataset_id": self.dataset_id,
            "shard_ids": list(self.shard_ids),
            "issued_at_ms": self.issued_at_ms,
            "expires_at_ms": self.expires_at_ms,
        }

    @classmethod
    def from_wire(cls, value: object) -> Lease:
        d = read_object(value, "lease")
        return cls(
            lease_id=LeaseId(d.get("lease_id")),
            experiment=ExperimentKey.parse(d.get("experiment")),
            peer_id=PeerId(d.get("peer_id")),
            base_head=HeadId(d.get("base_head")),
            window=read_int(d, "window"),
            dataset_id=DatasetId(d.get("dataset_id")),
            shard_ids=tuple(read_list(d, "shard_ids", ShardId, max_len=256)),
            issued_at_ms=read_int(d, "issued_at_ms"),
            expires_at_ms=read_int(d, "expires_at_ms"),
            principal=opt(d, "principal", lambda m, k: read_str(m, k, max_len=64)),
            signature=_signature(d),
        )


@dataclass(frozen=True)
class LeaseGrant:
    """What the edge answers the holder of a lease: the signed ``lease`` and its ``secret``.

    The lease itself is public (viewers see it); the secret is not, and shard bytes are served only
    to a request that presents it, so knowing a lease id is not enough to read its training data.
    """

    lease: Lease
    secret: str

    def to_wire(self) -> dict[str, Any]:
        return {"lease": self.lease.to_wire(), "secret": self.secret}

    @classmethod
    def from_wire(cls, value: object) -> LeaseGrant:
        d = read_object(value, "lease grant")
        return cls(lease=Lease.from_wire(d.get("lease")), secret=read_str(d, "secret", max_len=128))


@dataclass(frozen=True)
class Candidate(_SelfSigned):
    """A trainer's proposed update: the artifact ``candidate_id`` trained from ``base_head``.

    ``examples`` is the sample weight used by the merge; ``metrics`` are the trainer's own numbers,
    shown to people but never used for acceptance (validators measure).
    """

    DOMAIN: ClassVar[bytes] = b"dtn/candidate/v1\n"

    experiment: ExperimentKey
    candidate_id: ContentId
    base_head: HeadId
    lease_id: LeaseId
    public_key: bytes
    peer_kind: str
    examples: int
    steps: int
    created_at_ms: int
    metrics: dict[str, float] = field(default_factory=dict)
    signature: bytes = b""

    def body(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "candidate_id": self.candidate_id,
            "base_head": self.base_head,
            "lease_id": self.lease_id,
            "peer_id": self.peer_id,
            "public_key": b64encode(self.public_key),
            "peer_kind": self.peer_kind,
            "examples": self.examples,
            "steps": self.steps,
            "created_at_ms": self.created_at_ms,
            "metrics": self.metrics,
        }

    @classmethod
    def for_lease(
        cls,
        lease: Lease,
        base_head: HeadId,
        artifact: bytes,
        signer: Signer,
        *,
        peer_kind: str,
        examples: int,
        steps: int,
        created_at_ms: int,
        metrics: dict[str, float] | None = None,
    ) -> Candidate:
        """The signed candidate for ``artifact``, an update of ``base_head`` trained on ``lease``'s shards."""
        return cls(
            experiment=lease.experiment,
            candidate_id=content_id(artifact),
            base_head=base_head,
            lease_id=lease.lease_id,
            public_key=signer.public_key,
            peer_kind=peer_kind,
            examples=examples,
            steps=steps,
            created_at_ms=created_at_ms,
            metrics=metrics or {},
        ).signed(signer)

    @classmethod
    def from_wire(cls, value: object) -> Candidate:
        d = read_object(value, "candidate")
        candidate = cls(
            experiment=ExperimentKey.parse(d.get("experiment")),
            candidate_id=ContentId(d.get("candidate_id")),
            base_head=HeadId(d.get("base_head")),
            lease_id=LeaseId(d.get("lease_id")),
            public_key=_key(d, "public_key"),
            peer_kind=read_str(d, "peer_kind", max_len=16),
            examples=read_int(d, "examples", low=1, high=10**9),
            steps=read_int(d, "steps", high=10**9),
            created_at_ms=read_int(d, "created_at_ms"),
            metrics=_metrics(d),
            signature=_signature(d),
        )._checked()
        if d.get("peer_id") != candidate.peer_id:
            raise InvalidMessage("peer_id does not match public_key")
        return candidate


@dataclass(frozen=True)
class HeadDescriptor(_Signed):
    """A head: the model artifact ``head_id`` a validator promoted at ``window`` of ``experiment``.

    ``metrics`` are measured by the validator on data trainers never see. ``merged`` lists the
    candidate ids folded into this head (empty for genesis). ``outer_state`` is the content id of the
    outer optimizer's state after this head (``protocol.outer``; ``None`` for FedAvg): what the next
    window's step needs besides the head, stored next to it on the edge.
    """

    DOMAIN: ClassVar[bytes] = b"dtn/head/v1\n"

    experiment: ExperimentKey
    head_id: HeadId
    parent: HeadId | None
    window: int
    global_step: int
    merged: tuple[ContentId, ...]
    validator_key: bytes
    created_at_ms: int
    metrics: dict[str, float] = field(default_factory=dict)
    outer_state: ContentId | None = None
    signature: bytes = b""
    certificate: tuple[Attestation, ...] = ()  # other validators' attestations; not signed by the proposer

    def to_wire(self) -> dict[str, Any]:
        wire = super().to_wire()
        if self.certificate:
            wire["certificate"] = [attestation.to_wire() for attestation in self.certificate]
        return wire

    def body(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "head_id": self.head_id,
            "parent": self.parent,
            "window": self.window,
            "global_step": self.global_step,
            "merged": list(self.merged),
            "outer_state": self.outer_state,
            "validator_key": b64encode(self.validator_key),
            "created_at_ms": self.created_at_ms,
            "metrics": self.metrics,
        }

    @classmethod
    def from_wire(cls, value: object) -> HeadDescriptor:
        d = read_object(value, "head")
        return cls(
            **_head_fields(d),
            global_step=read_int(d, "global_step"),
            validator_key=_key(d, "validator_key"),
            created_at_ms=read_int(d, "created_at_ms"),
            metrics=_metrics(d),
            signature=_signature(d),
            certificate=tuple(read_list(d, "certificate", Attestation.from_wire, max_len=64))
            if "certificate" in d
            else (),
        )

    def signers(self, validator_keys: frozenset[bytes]) -> frozenset[bytes]:
        """The distinct listed validators that vouch for this head: its proposer (whose signature is
        checked) and every attestation in ``certificate`` that attests exactly this head and verifies."""
        if self.validator_key not in validator_keys:
            raise SignatureError("head is not signed by a validator of this network")
        self.verify(self.validator_key)
        vouching = {self.validator_key}
        for attestation in self.certificate:
            if attestation.validator_key in validator_keys and attestation.attests(self):
                try:
                    attestation.verify(attestation.validator_key)
                except SignatureError:
                    continue
                vouching.add(attestation.validator_key)
        return frozenset(vouching)

    def verify_trusted(self, validator_keys: frozenset[bytes], quorum: int = 1) -> None:
        """Raise ``SignatureError`` unless at least ``quorum`` distinct listed validators vouch for this
        head (``signers``): its proposer's signature and the attestations of its certificate."""
        vouching = len(self.signers(validator_keys))
        if vouching < quorum:
            raise SignatureError(f"head is certified by {vouching} validator(s); this network needs {quorum}")


@dataclass(frozen=True)
class Attestation(_Signed):
    """A validator's statement that it judged the window on top of ``parent`` itself and computed
    exactly ``head_id``, merging ``merged``, from the candidates ``considered``.

    A head is canonical once ``NetworkManifest.quorum`` distinct validators vouch for it: the one that
    proposed (signed the ``HeadDescriptor``) and those whose attestations form its ``certificate``.
    Anyone can check a certificate from the head and the validator keys alone."""

    DOMAIN: ClassVar[bytes] = b"dtn/attestation/v1\n"

    experiment: ExperimentKey
    head_id: HeadId
    parent: HeadId | None
    window: int
    merged: tuple[ContentId, ...]
    outer_state: ContentId | None
    considered: tuple[ContentId, ...]
    validator_key: bytes
    created_at_ms: int
    signature: bytes = b""

    @classmethod
    def of(cls, head: HeadDescriptor, considered: Sequence[str], signer: Signer, created_at_ms: int) -> Attestation:
        """The signed attestation of ``head``, judged from the candidates ``considered``."""
        return cls(
            experiment=head.experiment,
            head_id=head.head_id,
            parent=head.parent,
            window=head.window,
            merged=head.merged,
            outer_state=head.outer_state,
            considered=tuple(sorted(ContentId(c) for c in considered)),
            validator_key=signer.public_key,
            created_at_ms=created_at_ms,
        ).signed(signer)

    def attests(self, head: HeadDescriptor) -> bool:
        """True when this attestation is about exactly ``head`` (same window, parent, merge, bytes and
        outer optimizer state)."""
        return (self.experiment, self.head_id, self.parent, self.window, self.merged, self.outer_state) == (
            head.experiment,
            head.head_id,
            head.parent,
            head.window,
            head.merged,
            head.outer_state,
        )

    def body(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "head_id": self.head_id,
            "parent": self.parent,
            "window": self.window,
            "merged": list(self.merged),
            "outer_state": self.outer_state,
            "considered": list(self.considered),
            "validator_key": b64encode(self.validator_key),
            "created_at_ms": self.created_at_ms,
        }

    @classmethod
    def from_wire(cls, value: object) -> Attestation:
        d = read_object(value, "attestation")
        return cls(
            **_head_fields(d),
            considered=tuple(read_list(d, "considered", ContentId, max_len=MAX_WINDOW_CANDIDATES)),
            validator_key=_key(d, "validator_key"),
            created_at_ms=read_int(d, "created_at_ms"),
            signature=_signature(d),
        )


@dataclass(frozen=True)
class Verdict(_Signed):
    """A validator's decision on one candidate: a typed ``reason`` (``accepted`` exactly when the reason
    is ``Reason.ACCEPTED``), a human-readable ``detail``, and what the validator measured."""

    DOMAIN: ClassVar[bytes] = b"dtn/verdict/v1\n"

    experiment: ExperimentKey
    candidate_id: ContentId
    base_head: HeadId
    peer_id: PeerId
    accepted: bool
    reason: Reason
    detail: str
    validator_key: bytes
    decided_at_ms: int
    head_id: HeadId | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    signature: bytes = b""

    def __post_init__(self) -> None:
        if self.accepted != self.reason.accepted:
            raise InvalidMessage(f"a verdict with reason {self.reason!s} cannot have accepted={self.accepted}")

    def body(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "candidate_id": self.candidate_id,
            "base_head": self.base_head,
            "peer_id": self.peer_id,
            "accepted": self.accepted,
            "reason": str(self.reason),
            "detail": self.detail,
            "validator_key": b64encode(self.validator_key),
            "decided_at_ms": self.decided_at_ms,
            "head_id": self.head_id,
            "metrics": self.metrics,
        }

    @classmethod
    def from_wire(cls, value: object) -> Verdict:
        d = read_object(value, "verdict")
        return cls(
            experiment=ExperimentKey.parse(d.get("experiment")),
            candidate_id=ContentId(d.get("candidate_id")),
            base_head=HeadId(d.get("base_head")),
            peer_id=PeerId(d.get("peer_id")),
            accepted=read_bool(d, "accepted"),
            reason=_reason(d),
            detail=read_str(d, "detail", max_len=200),
            validator_key=_key(d, "validator_key"),
            decided_at_ms=read_int(d, "decided_at_ms"),
            head_id=opt(d, "head_id", lambda m, k: HeadId(m[k])),
            metrics=_metrics(d),
            signature=_signature(d),
        )


@dataclass(frozen=True)
class Evaluation(_Signed):
    """A validator's measurement of a published head on one of its own splits (``"test"``): what the
    head scores on data that decides nothing, signed apart from the head so the head is published
    before it is measured there. Anyone can check it against the network's validator keys; readers
    take the first evaluation a listed validator signed for a head (``evaluated_metrics``)."""

    DOMAIN: ClassVar[bytes] = b"dtn/evaluation/v1\n"

    experiment: ExperimentKey
    head_id: HeadId
    window: int
    split: str
    metrics: dict[str, float]
    validator_key: bytes
    created_at_ms: int
    signature: bytes = b""

    def __post_init__(self) -> None:
        if self.split not in EVALUATION_SPLITS:
            raise InvalidMessage(f"an evaluation of split {self.split!r}; splits evaluated: {EVALUATION_SPLITS}")

    @classmethod
    def of(
        cls, head: HeadDescriptor, split: str, metrics: Mapping[str, float], signer: Signer, created_at_ms: int
    ) -> Evaluation:
        """The signed evaluation of ``head`` on ``split``, its metrics named ``<split>_<metric>``."""
        return cls(
            experiment=head.experiment,
            head_id=head.head_id,
            window=head.window,
            split=split,
            metrics={f"{split}_{name}": float(value) for name, value in metrics.items()},
            validator_key=signer.public_key,
            created_at_ms=created_at_ms,
        ).signed(signer)

    def body(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "head_id": self.head_id,
            "window": self.window,
            "split": self.split,
            "metrics": self.metrics,
            "validator_key": b64encode(self.validator_key),
            "created_at_ms": self.created_at_ms,
        }

    @classmethod
    def from_wire(cls, value: object) -> Evaluation:
        d = read_object(value, "evaluation")
        return cls(
            experiment=ExperimentKey.parse(d.get("experiment")),
            head_id=HeadId(d.get("head_id")),
            window=read_int(d, "window"),
            split=read_str(d, "split", max_len=16),
            metrics=_metrics(d),
            validator_key=_key(d, "validator_key"),
            created_at_ms=read_int(d, "created_at_ms"),
            signature=_signature(d),
        )


def merged_evaluations(evaluations: Iterable[Evaluation]) -> dict[HeadId, dict[str, float]]:
    """Each head's evaluated metrics from ``evaluations`` already checked (the edge checks each as it
    takes it): the first evaluation per head and split counts."""
    metrics: dict[HeadId, dict[str, float]] = {}
    seen: set[tuple[str, str]] = set()
    for evaluation in evaluations:
        if (evaluation.head_id, evaluation.split) not in seen:
            seen.add((evaluation.head_id, evaluation.split))
            metrics.setdefault(evaluation.head_id, {}).update(evaluation.metrics)
    return metrics


def evaluated_metrics(
    evaluations: Iterable[Evaluation], validator_keys: frozenset[bytes] | set[bytes]
) -> dict[HeadId, dict[str, float]]:
    """``merged_evaluations`` of those ``evaluations`` a validator in ``validator_keys`` signed: what a
    reader of an edge's evaluations keeps (one by anyone else, or whose signature fails, is left out)."""

    def signed(evaluation: Evaluation) -> bool:
        if evaluation.validator_key not in validator_keys:
            return False
        try:
            evaluation.verify(evaluation.validator_key)
        except SignatureError:
            return False
        return True

    return merged_evaluations(e for e in evaluations if signed(e))


@dataclass(frozen=True)
class PeerProof(_SelfSigned):
    """A peer proving it holds the key behind its id: to join the relay (``purpose="join"``, with
    the edge's challenge nonce), to ask for a lease over HTTP (``purpose="lease"``, with a fresh
    timestamp), or to read what only some peers may read (``purpose="read"``, sent in
    ``READ_PROOF_HEADER``: the nonce is the request path, ``#`` and a fresh random part, and the edge
    takes each proof once, so one seen on the way cannot be presented again by another client)."""

    DOMAIN: ClassVar[bytes] = b"dtn/peer-proof/v1\n"

    purpose: str
    public_key: bytes
    peer_kind: str
    nonce: str
    issued_at_ms: int
    signature: bytes = b""

    def body(self) -> dict[str, Any]:
        return {
            "purpose": self.purpose,
            "public_key": b64encode(self.public_key),
            "peer_kind": self.peer_kind,
            "nonce": self.nonce,
            "issued_at_ms": self.issued_at_ms,
        }

    @classmethod
    def for_read(cls, signer: Signer, peer_kind: str, path: str, now_ms: int) -> str:
        """A ``READ_PROOF_HEADER`` value: this peer's signed proof that it reads ``path`` now, once
        (a fresh nonce each call)."""
        nonce = f"{path}#{secrets.token_urlsafe(12)}"
        return b64encode(
            canonical_json(cls("read", signer.public_key, peer_kind, nonce, now_ms).signed(signer).to_wire())
        )

    def read_path(self) -> str:
        """The path a read proof is for (``InvalidMessage`` for a nonce without a fresh part)."""
        path, _, fresh = self.nonce.rpartition("#")
        if len(fresh) < READ_NONCE_MIN_CHARS:
            raise InvalidMessage("a read proof's nonce is the request path, '#' and a fresh random part")
        return path

    @classmethod
    def from_read_header(cls, value: str) -> PeerProof:
        """The proof in a ``READ_PROOF_HEADER`` value (``InvalidMessage`` if it is not one)."""
        try:
            return cls.from_wire(json.loads(b64decode(value)))
        except ValueError:
            raise InvalidMessage("read proof is not base64url JSON") from None

    @classmethod
    def from_wire(cls, value: object) -> PeerProof:
        d = read_object(value, "peer proof")
        return cls(
            purpose=read_str(d, "purpose", max_len=16),
            public_key=_key(d, "public_key"),
            peer_kind=read_str(d, "peer_kind", max_len=16),
            nonce=read_str(d, "nonce", max_len=320),
            issued_at_ms=read_int(d, "issued_at_ms"),
            signature=_signature(d),
        )._checked()
