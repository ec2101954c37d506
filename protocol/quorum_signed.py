"""Something a quorum of a network's validators signs: a body, its domain, the signatures gathered.

Run-control orders (``protocol.run_control``) and network revisions (``protocol.network_revisions``)
are both statements that take effect only once ``quorum`` distinct validators of a network signed
them. ``QuorumSigned`` holds what they share: each validator signs ``DOMAIN || canonical_json(body)``
offline, copies signed by different validators are merged (``gathered``), and ``effective_signers``
says whether the signatures reach the quorum of the network they name. An edge, whose key is not a
validator's, can relay such a statement but never originate one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, ClassVar, Protocol, Self

from .errors import InvalidMessage, SignatureError
from .fields import read_list, read_object
from .manifests import MAX_VALIDATORS, NetworkManifest
from .signing import Signer, ValidatorSignature, canonical_json, verify_signature

__all__ = ["MAX_SIGNATURES", "QuorumSigned", "Statement"]

MAX_SIGNATURES = MAX_VALIDATORS  # at most one per validator


class Statement(Protocol):
    """The body a quorum signs: which network it is for, and its canonical wire form."""

    @property
    def network_id(self) -> str: ...

    def body(self) -> dict[str, Any]: ...


class QuorumSigned:
    """A statement with the validators' ``signatures`` over it. Subclasses are frozen dataclasses of two
    fields, the statement (named ``FIELD``, of type ``STATEMENT``, read by its ``from_wire``) then the
    signatures, and name their ``DOMAIN`` and ``WHAT``; the wire form is ``{FIELD: body, "signatures":
    [...]}``."""

    DOMAIN: ClassVar[bytes]
    WHAT: ClassVar[str]
    FIELD: ClassVar[str]
    STATEMENT: ClassVar[Any]
    signatures: tuple[ValidatorSignature, ...]

    @property
    def statement(self) -> Statement:
        statement: Statement = getattr(self, self.FIELD)
        return statement

    @classmethod
    def of(cls, statement: Statement, signers: Iterable[Signer]) -> Self:
        """``statement`` signed by each of ``signers``."""
        unsigned = cls(statement, ())  # type: ignore[call-arg]
        return cls(statement, tuple(unsigned.signature_of(s) for s in signers))  # type: ignore[call-arg]

    def to_wire(self) -> dict[str, Any]:
        return {self.FIELD: self.statement.body(), "signatures": [s.to_wire() for s in self.signatures]}

    @classmethod
    def from_wire(cls, value: object) -> Self:
        d = read_object(value, f"signed {cls.WHAT}")
        signatures = read_list(d, "signatures", ValidatorSignature.from_wire, max_len=MAX_SIGNATURES)
        return cls(cls.STATEMENT.from_wire(d.get(cls.FIELD)), tuple(signatures))  # type: ignore[call-arg]

    @property
    def title(self) -> str:
        """What the statement is, as refusals name it."""
        return self.WHAT

    def signature_of(self, signer: Signer) -> ValidatorSignature:
        """``signer``'s signature over the statement."""
        return ValidatorSignature(signer.public_key, signer.sign(self.DOMAIN + canonical_json(self.statement.body())))

    def signed_by(self, signer: Signer) -> Self:
        """This statement with ``signer``'s signature added (replacing one its key made before)."""
        others = tuple(s for s in self.signatures if s.validator_key != signer.public_key)
        return replace(self, signatures=(*others, self.signature_of(signer)))  # type: ignore[type-var]

    def signers(self, network: NetworkManifest) -> frozenset[bytes]:
        """The validators of ``network`` whose valid signature over the statement is here."""
        listed, body = network.validator_key_set, self.statement.body()
        return frozenset(
            s.validator_key
            for s in self.signatures
            if s.validator_key in listed and verify_signature(s.validator_key, self.DOMAIN, body, s.signature)
        )

    def effective_signers(self, network: NetworkManifest) -> frozenset[bytes]:
        """``signers`` when they reach ``network``'s quorum and the statement is for ``network``;
        otherwise ``SignatureError`` (an edge-made, forged, under-quorum or other network's statement)."""
        if self.statement.network_id != network.network_id:
            raise SignatureError(
                f"{self.title} is for network {self.statement.network_id!r}, not {network.network_id!r}"
            )
        signers = self.signers(network)
        if len(signers) < network.quorum:
            raise SignatureError(
                f"{self.title} is signed by {len(signers)} validator(s) of this network; it needs {network.quorum}"
            )
        return signers

    @classmethod
    def gathered(cls, copies: Iterable[Self]) -> Self:
        """One statement with every signature ``copies`` of it carry, one per validator key (validators
        that each signed a copy of the same file); ``InvalidMessage`` when the copies are not all of one
        statement."""
        copies = list(copies)
        if not copies:
            raise InvalidMessage(f"no {cls.WHAT} to gather signatures for")
        first = copies[0].statement
        if any(copy.statement != first for copy in copies):
            raise InvalidMessage(f"these files hold different {cls.WHAT}s; gather the signatures of one")
        by_key = {s.validator_key: s for copy in copies for s in copy.signatures}
        return replace(copies[0], signatures=tuple(by_key.values()))  # type: ignore[type-var]
