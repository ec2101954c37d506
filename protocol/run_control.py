"""Run control: pause, resume, stop, pardon and rollback orders that a quorum of validators signs.

A ``RunControl`` names the network, the experiment, the action (with its target: the peer to pardon,
the head to roll back to), a sequence number and when it was issued. Each validator signs its body
under the domain ``dtn/run-control/v1``; a ``SignedRunControl`` carries the order and the signatures
gathered for it. It takes effect when ``quorum`` distinct validators of the network signed it
(``protocol.quorum_signed``): an edge, whose key is not a validator's, can relay an order but never
originate one, and fewer than ``quorum`` validators cannot either.

Orders of one experiment are applied in sequence (``RunState.refusal``/``RunState.after``): each must
carry a sequence number above the last applied one, so a replayed or reordered order is refused, and
``stop`` is final, and ``rollback`` applies only to a paused experiment (so that every validator
reads it on the same head). The network id in the body keeps an order signed for one network from acting on
another that shares validators.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from .errors import InvalidMessage
from .fields import read_int, read_object, read_str
from .ids import ExperimentKey, HeadId, PeerId
from .manifests import NetworkManifest
from .network_revisions import order_network
from .quorum_signed import QuorumSigned
from .signing import ValidatorSignature

__all__ = [
    "ACTIONS",
    "CONTROL_DOMAIN",
    "MAX_ORDERS",
    "RunControl",
    "RunState",
    "SignedRunControl",
]

CONTROL_DOMAIN = b"dtn/run-control/v1\n"
ACTIONS = ("pause", "resume", "stop", "pardon", "rollback")
_TARGETED = {"pardon": PeerId, "rollback": HeadId}  # actions that name a target, and the target's type
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
class SignedRunControl(QuorumSigned):
    """An order with the validator signatures gathered for it (``QuorumSigned``)."""

    DOMAIN: ClassVar[bytes] = CONTROL_DOMAIN
    WHAT: ClassVar[str] = "run-control order"
    FIELD: ClassVar[str] = "order"
    STATEMENT: ClassVar[Any] = RunControl

    order: RunControl
    signatures: tuple[ValidatorSignature, ...]

    @property
    def title(self) -> str:
        return f"run control {self.order.action!r}"


@dataclass(frozen=True)
class RunState:
    """What the orders applied so far to one experiment leave: whether it is paused or stopped, and
    the last applied sequence number."""

    sequence: int = 0
    paused: bool = False
    stopped: bool = False

    @classmethod
    def of(
        cls,
        orders: Iterable[SignedRunControl],
        history: NetworkManifest | Sequence[NetworkManifest],
        experiment: ExperimentKey,
    ) -> RunState:
        """The state ``orders`` leave ``experiment``, each applied in turn once checked, as a validator
        reads them from an edge it does not trust: ``SignatureError`` for an order without the quorum of
        the network that applied it (``history``: the network, or the network at each of its revisions in
        order, ``protocol.network_revisions.order_network``), ``InvalidMessage`` for one of another
        experiment or out of sequence."""
        networks = [history] if isinstance(history, NetworkManifest) else list(history)
        state = cls()
        for signed in orders:
            if signed.order.experiment != experiment:
                raise InvalidMessage(f"run control for {signed.order.experiment} among {experiment}'s orders")
            signed.effective_signers(order_network(networks, experiment, signed.order.sequence))
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
