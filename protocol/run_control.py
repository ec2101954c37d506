"""Run control: pause, resume, stop, pardon and rollback orders that a quorum of validators signs.

A ``RunControl`` names the network, the experiment, the action (with its target: the peer to pardon,
the head to roll back to), a sequence number and when it was issued. Each validator signs its body
under the domain ``dtn/run-control/v1`` (``ControlSignature``); a ``SignedRunControl`` carries the order
and the signatures gathered for it. It takes effect when ``quorum`` distinct validators of the network
signed it (``effective_signers``): an edge, whose key is not a validator's, can relay an order but
never originate one, and fewer than ``quorum`` validators cannot either.

Orders of one experiment are applied in sequence (``RunState.refusal``/``RunState.after``): each must
carry a sequence number above the last applied one, so a replayed or reordered order is refused, and
``stop`` is final, and ``rollback`` applies only to a paused experiment (so that every validator
reads it on the same head). The network id in the body keeps an order signed for one network from acting on
another that shares validators.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from .errors import InvalidMessage, SignatureError
from .fields import read_int, read_list, read_object, read_str
from .ids import ExperimentKey, HeadId, PeerId
from .manifests import NetworkManifest
from .signing import Signer, ValidatorSignature, canonical_json, verify_signature

__all__ = [
    "ACTIONS",
    "CONTROL_DOMAIN",
    "MAX_ORDERS",
    "ControlSignature",
    "RunControl",
    "RunState",
    "SignedRunControl",
]

CONTROL_DOMAIN = b"dtn/run-control/v1\n"
ACTIONS = ("pause", "resume", "stop", "pardon", "rollback")
_TARGETED = {"pardon": PeerId, "rollback": HeadId}  # actions that name a target, and the target's type
MAX_SIGNATURES = 64  # at most one per validator; a network has at most 64 (NetworkManifest quorum bound)
MAX_ORDERS = 10_000  # the orders one experiment's history may hold as an edge serves them


@dataclass(frozen=True)
class RunControl:
    """One order for one experiment (the body validators sign)."""

    network_id: str
    experiment: ExperimentKey
    action: str
    sequence: int  # > the sequence of the last order applied to this experiment
    issued_at_ms: int
    target: str | None = None  # the PeerId to pardon, the HeadId to roll back to; None otherwise

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise InvalidMessage(f"run-control action must be one of {', '.join(ACTIONS)}, not {self.action!r}")
        kind = _TARGETED.get(self.action)
        if kind is None and self.target is not None:
            raise InvalidMessage(f"run-control {self.action!r} takes no target")
        if kind is not None:
            if self.target is None:
                raise InvalidMessage(f"run-control {self.action!r} needs a target ({kind.__name__})")
            kind(self.target)  # raises InvalidMessage on a malformed id
        if self.sequence < 1:
            raise InvalidMessage("run-control sequence starts at 1")

    def body(self) -> dict[str, Any]:
        return {
            "network_id": self.network_id,
            "experiment": str(self.experiment),
            "action": self.action,
            "target": self.target,
            "sequence": self.sequence,
            "issued_at_ms": self.issued_at_ms,
        }

    def sign(self, signer: Signer) -> ControlSignature:
        """``signer``'s signature over this order."""
        return ControlSignature(signer.public_key, signer.sign(CONTROL_DOMAIN + canonical_json(self.body())))

    @classmethod
    def from_wire(cls, value: object) -> RunControl:
        d = read_object(value, "run control")
        target = d.get("target")
        if target is not None and (not isinstance(target, str) or len(target) > 128):
            raise InvalidMessage("field 'target' must be null or an id string")
        return cls(
            network_id=read_str(d, "network_id", max_len=64),
            experiment=ExperimentKey.parse(d.get("experiment")),
            action=read_str(d, "action", max_len=16),
            sequence=read_int(d, "sequence", low=1),
            issued_at_ms=read_int(d, "issued_at_ms"),
            target=target,
        )


@dataclass(frozen=True)
class ControlSignature(ValidatorSignature):
    """One validator's signature over a ``RunControl`` body."""

    WHAT = "run-control signature"

    def verifies(self, order: RunControl) -> bool:
        return verify_signature(self.validator_key, CONTROL_DOMAIN, order.body(), self.signature)


@dataclass(frozen=True)
class SignedRunControl:
    """An order with the validator signatures gathered for it."""

    order: RunControl
    signatures: tuple[ControlSignature, ...]

    @classmethod
    def of(cls, order: RunControl, signers: Iterable[Signer]) -> SignedRunControl:
        return cls(order, tuple(order.sign(s) for s in signers))

    @classmethod
    def gathered(cls, copies: Iterable[SignedRunControl]) -> SignedRunControl:
        """One order with every signature ``copies`` of it carry, one per validator key (validators
        that each signed a copy of the same order file); ``InvalidMessage`` when the copies are not all
        of one order."""
        copies = list(copies)
        if not copies:
            raise InvalidMessage("no run-control order to gather signatures for")
        order = copies[0].order
        if any(copy.order != order for copy in copies):
            raise InvalidMessage("these files hold different run-control orders; gather signatures of one order")
        by_key = {s.validator_key: s for copy in copies for s in copy.signatures}
        return cls(order, tuple(by_key.values()))

    def signed_by(self, signer: Signer) -> SignedRunControl:
        """This order with ``signer``'s signature added (replacing one its key made before)."""
        others = tuple(s for s in self.signatures if s.validator_key != signer.public_key)
        return replace(self, signatures=(*others, self.order.sign(signer)))

    def signers(self, network: NetworkManifest) -> frozenset[bytes]:
        """The validators of ``network`` whose valid signature over the order is here."""
        listed = network.validator_key_set
        return frozenset(
            s.validator_key for s in self.signatures if s.validator_key in listed and s.verifies(self.order)
        )

    def effective_signers(self, network: NetworkManifest) -> frozenset[bytes]:
        """``signers`` when they reach ``network``'s quorum and the order is for ``network``; otherwise
        ``SignatureError`` (an edge-made, forged, under-quorum or other network's order)."""
        if self.order.network_id != network.network_id:
            raise SignatureError(f"run control is for network {self.order.network_id!r}, not {network.network_id!r}")
        signers = self.signers(network)
        if len(signers) < network.quorum:
            raise SignatureError(
                f"run control {self.order.action!r} is signed by {len(signers)} validator(s) of this "
                f"network; it needs {network.quorum}"
            )
        return signers

    def to_wire(self) -> dict[str, Any]:
        return {"order": self.order.body(), "signatures": [s.to_wire() for s in self.signatures]}

    @classmethod
    def from_wire(cls, value: object) -> SignedRunControl:
        d = read_object(value, "signed run control")
        signatures = read_list(d, "signatures", ControlSignature.from_wire, max_len=MAX_SIGNATURES)
        return cls(RunControl.from_wire(d.get("order")), tuple(signatures))


@dataclass(frozen=True)
class RunState:
    """What the orders applied so far to one experiment leave: whether it is paused or stopped, and
    the last applied sequence number."""

    sequence: int = 0
    paused: bool = False
    stopped: bool = False

    @classmethod
    def of(cls, orders: Iterable[SignedRunControl], network: NetworkManifest, experiment: ExperimentKey) -> RunState:
        """The state ``orders`` leave ``experiment``, each applied in turn once checked, as a validator
        reads them from an edge it does not trust: ``SignatureError`` for an order without ``network``'s
        quorum, ``InvalidMessage`` for one of another experiment or out of sequence."""
        state = cls()
        for signed in orders:
            if signed.order.experiment != experiment:
                raise InvalidMessage(f"run control for {signed.order.experiment} among {experiment}'s orders")
            signed.effective_signers(network)
            state = state.after(signed.order)
        return state

    def refusal(self, order: RunControl) -> str | None:
        """Why ``order`` cannot be applied now (a replay, an order after ``stop``), or ``None``."""
        if self.stopped:
            return f"experiment {order.experiment} is stopped; a stopped experiment takes no more orders"
        if order.action == "rollback" and not self.paused:
            return (
                f"roll back a paused experiment: pause {order.experiment} first, then roll back, then resume "
                "(every validator then rolls back the same head)"
            )
        if order.sequence <= self.sequence:
            return (
                f"run control sequence {order.sequence} was already used for {order.experiment} "
                f"(the last applied is {self.sequence}); sign a new order with a higher sequence"
            )
        return None

    def after(self, order: RunControl) -> RunState:
        """The state once ``order`` is applied (``refusal`` must be ``None``)."""
        if (problem := self.refusal(order)) is not None:
            raise InvalidMessage(problem)
        paused = {"pause": True, "resume": False}.get(order.action, self.paused)
        return replace(self, sequence=order.sequence, paused=paused, stopped=order.action == "stop")

    @property
    def halted(self) -> str | None:
        """Why the experiment takes no work now (paused or stopped), or ``None`` while it runs."""
        if self.stopped:
            return "stopped by run control"
        return "paused by run control" if self.paused else None

    def to_wire(self) -> dict[str, Any]:
        return {"sequence": self.sequence, "paused": self.paused, "stopped": self.stopped}

    @classmethod
    def from_wire(cls, value: object) -> RunState:
        d = read_object(value, "run state")
        paused, stopped = d.get("paused"), d.get("stopped")
        if not isinstance(paused, bool) or not isinstance(stopped, bool):
            raise InvalidMessage("run state 'paused' and 'stopped' must be booleans")
        return cls(sequence=read_int(d, "sequence", low=0), paused=paused, stopped=stopped)
