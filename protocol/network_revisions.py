"""Network revisions: the terms of a running network change only as a quorum of its validators signs.

A network starts from the terms of its manifest file (revision 0). A ``NetworkRevision`` makes the
next revision of them: it names the network, its number (the previous revision's + 1), the digest of
the previous terms it revises (``terms_digest``), the validator keys and quorum from now on, the
experiments it adds, and, when it changes the validators or the quorum, the ``handover``: each
experiment's current head. A ``SignedNetworkRevision`` takes effect when a quorum of the *previous*
revision's validators signed it (``protocol.quorum_signed``, domain ``dtn/network-revision/v1``): an
edge cannot originate one, a replaced validator's key cannot sign the next, and a chain of revisions
from terms a peer trusts is checked by that peer alone (``follow``).

What a revision may change:

- **add experiments** (new keys; an experiment already listed is never changed or removed: stop it
  with run control, and add a new revision of it under a new key);
- **the validators and the quorum** (replace a key, add or remove validators). Heads are vouched for
  by validators, so the change hands over at a head: the revision names each experiment's current head,
  which the signers vouch for by signing it, and applies only where no head the old validators made
  follows it (``handover_refusal``, which the edge applies; pause the experiments before signing so
  that none moves). The revised manifest carries that ``handover`` (``NetworkManifest.verify_head`` trusts those
  heads) until the new validators certify the next heads; older heads are checked against the
  validators of their era (``head_network``), run-control orders likewise (``order_network``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from .errors import InvalidMessage, SignatureError
from .fields import read_int, read_list, read_object, read_sha256_hex, read_str
from .ids import ExperimentKey
from .manifests import MAX_VALIDATORS, ExperimentSpec, Handover, NetworkManifest, handover_wire, read_handover
from .messages import HeadDescriptor
from .network_pins import network_terms
from .quorum_signed import QuorumSigned
from .signing import ValidatorSignature, b64decode, b64encode, canonical_json

__all__ = [
    "MAX_REVISIONS",
    "REVISION_DOMAIN",
    "NetworkRevision",
    "SignedNetworkRevision",
    "follow",
    "handover_refusal",
    "head_network",
    "order_network",
    "revisions_after",
    "terms_digest",
]

REVISION_DOMAIN = b"dtn/network-revision/v1\n"
MAX_REVISIONS = 1000  # revisions one network's chain may hold as an edge serves it


def terms_digest(network: NetworkManifest) -> str:
    """The sha256 (hex) of ``network``'s terms in canonical JSON: what a revision names as the terms it
    revises, so a revision signed for other terms applies to no others."""
    return hashlib.sha256(canonical_json(network_terms(network))).hexdigest()


@dataclass(frozen=True)
class NetworkRevision:
    """The next revision of a network's terms (the body validators sign)."""

    network_id: str
    number: int  # the revision this makes: the previous one's + 1
    previous: str  # terms_digest of the terms it revises
    validator_keys: tuple[bytes, ...]
    quorum: int
    issued_at_ms: int
    experiments: tuple[ExperimentSpec, ...] = ()  # the experiments it adds
    handover: tuple[Handover, ...] = ()  # where each experiment stands, when the validators change

    @classmethod
    def of(
        cls,
        network: NetworkManifest,
        issued_at_ms: int,
        *,
        validator_keys: Sequence[bytes] | None = None,
        quorum: int | None = None,
        experiments: Sequence[ExperimentSpec] = (),
        heads: Mapping[ExperimentKey, HeadDescriptor] | None = None,
        orders: Mapping[ExperimentKey, int] | None = None,
    ) -> NetworkRevision:
        """The revision after ``network``'s: its validators and quorum unless given, ``experiments``
        added, and, when the validators or the quorum change, the handover at each experiment's current
        ``heads`` and last run-control order (``orders``: its sequence)."""
        keys = tuple(network.validator_keys if validator_keys is None else validator_keys)
        quorum = network.quorum if quorum is None else quorum
        changes = (frozenset(keys), quorum) != (network.validator_key_set, network.quorum)
        heads, orders = heads or {}, orders or {}
        handover = tuple(
            Handover(
                spec.key,
                None if spec.key not in heads else heads[spec.key].head_id,
                heads[spec.key].window if spec.key in heads else -1,
                orders.get(spec.key, 0),
            )
            for spec in sorted(network.experiments, key=lambda spec: spec.key)
            if changes and (spec.key in heads or orders.get(spec.key, 0))
        )
        return cls(
            network.network_id, network.revision + 1, terms_digest(network), keys, quorum, issued_at_ms,
            tuple(experiments), handover,
        )  # fmt: skip

    def changes_validators(self, network: NetworkManifest) -> bool:
        return (frozenset(self.validator_keys), self.quorum) != (network.validator_key_set, network.quorum)

    def apply(self, network: NetworkManifest) -> NetworkManifest:
        """``network`` revised (its edge key and admission kept); ``InvalidMessage`` naming why when this
        revision does not follow it: another network, out of sequence, other terms, an experiment it
        already has, a handover where the validators stay (or of an experiment it does not have), or
        nothing changed. Signatures are checked by ``SignedNetworkRevision.effective_signers``."""
        if self.network_id != network.network_id:
            raise InvalidMessage(
                f"revision {self.number} is of network {self.network_id!r}, not {network.network_id!r}"
            )
        if self.number != network.revision + 1:
            raise InvalidMessage(
                f"revision {self.number} does not follow revision {network.revision} of network {network.network_id!r}"
            )
        if self.previous != terms_digest(network):
            raise InvalidMessage(f"revision {self.number} revises other terms than revision {network.revision}'s")
        held = {spec.key for spec in network.experiments}
        for spec in self.experiments:
            if spec.key in held:
                raise InvalidMessage(
                    f"experiment {spec.key} is on the network already; an experiment is never changed: "
                    "add a new revision of it under another key"
                )
        changes = self.changes_validators(network)
        if not changes and not self.experiments:
            raise InvalidMessage(f"revision {self.number} changes nothing")
        if self.handover and not changes:
            raise InvalidMessage("a handover belongs to a revision that changes the validators or the quorum")
        if unknown := {h.experiment for h in self.handover} - held:
            raise InvalidMessage(f"the handover names experiments the network does not have: {sorted(unknown)}")
        return replace(
            network,
            validator_keys=self.validator_keys,
            quorum=self.quorum,
            experiments=network.experiments + self.experiments,
            revision=self.number,
            handover=self.handover if changes else network.handover,
        )

    def body(self) -> dict[str, Any]:
        return {
            "network_id": self.network_id,
            "number": self.number,
            "previous": self.previous,
            "validator_keys": [b64encode(k) for k in self.validator_keys],
            "quorum": self.quorum,
            "experiments": [spec.to_wire() for spec in self.experiments],
            "handover": handover_wire(self.handover),
            "issued_at_ms": self.issued_at_ms,
        }

    @classmethod
    def from_wire(cls, value: object) -> NetworkRevision:
        d = read_object(value, "network revision")
        previous = read_sha256_hex(d, "previous")
        return cls(
            network_id=read_str(d, "network_id", max_len=64),
            number=read_int(d, "number", low=1, high=10**9),
            previous=previous,
            validator_keys=tuple(
                read_list(d, "validator_keys", lambda k: b64decode(k, size=32), max_len=MAX_VALIDATORS)
            ),
            quorum=read_int(d, "quorum", low=1, high=MAX_VALIDATORS),
            issued_at_ms=read_int(d, "issued_at_ms"),
            experiments=tuple(read_list(d, "experiments", ExperimentSpec.from_wire, max_len=256)),
            handover=read_handover(d),
        )


@dataclass(frozen=True)
class SignedNetworkRevision(QuorumSigned):
    """A revision with the signatures of the previous revision's validators gathered for it."""

    DOMAIN: ClassVar[bytes] = REVISION_DOMAIN
    WHAT: ClassVar[str] = "network revision"
    FIELD: ClassVar[str] = "revision"
    STATEMENT: ClassVar[Any] = NetworkRevision

    revision: NetworkRevision
    signatures: tuple[ValidatorSignature, ...]

    @property
    def title(self) -> str:
        return f"network revision {self.revision.number}"

    def apply(self, network: NetworkManifest) -> NetworkManifest:
        """``network`` revised, once a quorum of ``network``'s validators signed this revision
        (``SignatureError`` otherwise) and it follows ``network`` (``NetworkRevision.apply``)."""
        self.effective_signers(network)
        return self.revision.apply(network)


def revisions_after(
    network: NetworkManifest, chain: Sequence[SignedNetworkRevision]
) -> list[tuple[SignedNetworkRevision, NetworkManifest]]:
    """Each revision of ``chain`` after ``network``'s own, in order, with the network it makes, each
    checked against the terms before it (``SignedNetworkRevision.apply``). Revisions ``network``
    already holds are passed over; a gap is ``InvalidMessage``, both naming the revision."""
    found = []
    for signed in sorted(chain, key=lambda s: s.revision.number):
        if signed.revision.number > network.revision:
            try:
                network = signed.apply(network)
            except (InvalidMessage, SignatureError) as exc:
                raise type(exc)(f"network revision {signed.revision.number}: {exc}") from None
            found.append((signed, network))
    return found


def follow(network: NetworkManifest, chain: Sequence[SignedNetworkRevision]) -> NetworkManifest:
    """``network`` revised by each revision of ``chain`` after its own (``revisions_after``): what a
    peer that trusts ``network`` may trust now."""
    revised = revisions_after(network, chain)
    return revised[-1][1] if revised else network


def handover_refusal(
    network: NetworkManifest,
    revision: NetworkRevision,
    lineages: Mapping[ExperimentKey, Sequence[HeadDescriptor]],
    sequences: Mapping[ExperimentKey, int],
) -> str | None:
    """Why an edge whose experiments' canonical heads are ``lineages`` (genesis first) and whose last
    run-control orders are ``sequences`` must not apply ``revision`` to ``network``, or ``None``. A
    revision that changes the validators applies only where each experiment's lineage holds the head it
    hands over at (an experiment without heads: none), every head after that one is certified by the new
    validators (the old ones vouched for the handover head; a head they made after it is not trusted once
    the new ones took over), and no order past the handover's was applied (one would be read as the new
    validators'). So on a live edge it applies at the current heads and orders (pause every experiment
    before signing one, so that none moves meanwhile), and an edge that follows or is restored takes it
    once its heads reach the handover. One that only adds experiments applies at any time."""
    if not revision.changes_validators(network):
        return None
    handover, keys = {h.experiment: h for h in revision.handover}, frozenset(revision.validator_keys)
    for spec in network.experiments:
        heads = list(lineages.get(spec.key, ()))
        entry = handover.get(spec.key, Handover(spec.key, None))
        ids = [head.head_id for head in heads]
        if sequences.get(spec.key, 0) > entry.orders:
            return (
                f"{spec.key} took run-control order {sequences[spec.key]} after the revision's handover "
                f"(order {entry.orders}); write it again from the edge"
            )
        if entry.head is None and heads:
            return f"the revision hands {spec.key} over at no head, and it has {len(heads)} here; write it again"
        if entry.head is not None and (entry.head not in ids or heads[ids.index(entry.head)].window != entry.window):
            return (
                f"{spec.key} has no head {entry.head} here (the revision's handover); pause and write it again "
                "from the edge"
            )
        for head in heads[ids.index(entry.head) + 1 :] if entry.head is not None else []:
            try:
                head.verify_trusted(keys, revision.quorum)
            except SignatureError:
                return (
                    f"{spec.key} moved past the revision's handover (window {head.window} is not certified by the "
                    "new validators); pause the experiments and write it again from the edge"
                )
    return None


def head_network(history: Sequence[NetworkManifest], experiment: ExperimentKey, window: int) -> NetworkManifest:
    """The network (of ``history``, the network at each revision in order) whose validators certify
    ``experiment``'s head of ``window``: the era whose handover window it is at or before (a head after
    the last change of validators: the last network's)."""
    for network, at in _eras(history, experiment):
        if at is None or (at.head is not None and window <= at.window):
            return network
    raise AssertionError("the last era takes every later head")


def order_network(history: Sequence[NetworkManifest], experiment: ExperimentKey, sequence: int) -> NetworkManifest:
    """The network (of ``history``) whose validators sign run-control order ``sequence`` of
    ``experiment``: the era that applied it (an order after the last change of validators: the last
    network's)."""
    for network, at in _eras(history, experiment):
        if at is None or sequence <= at.orders:
            return network
    raise AssertionError("the last era takes every later order")


def _eras(
    history: Sequence[NetworkManifest], experiment: ExperimentKey
) -> list[tuple[NetworkManifest, Handover | None]]:
    """The networks of ``history`` that changed the validators (the first one included), each with the
    handover to the next one for ``experiment`` (``None``: the last; an experiment the next one does not
    name had nothing yet, its empty handover)."""
    changes = [network for at, network in enumerate(history) if at == 0 or _changed(history[at - 1], network)]
    return [
        (network, None if at + 1 == len(changes) else _handover(changes[at + 1], experiment))
        for at, network in enumerate(changes)
    ]


def _handover(network: NetworkManifest, experiment: ExperimentKey) -> Handover:
    return next((h for h in network.handover if h.experiment == experiment), Handover(experiment, None))


def _changed(before: NetworkManifest, after: NetworkManifest) -> bool:
    return (before.validator_key_set, before.quorum) != (after.validator_key_set, after.quorum)
