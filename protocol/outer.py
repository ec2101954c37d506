"""The outer optimizer: how a window's merged update moves the head. Pure NumPy, deterministic.

Each accepted candidate carries what its trainer learned from the window's base head; the
aggregator (``protocol.aggregation``) turns them into one update Δ. The outer optimizer then takes
the step from the base (an experiment setting, ``ExperimentSpec.outer``):

    fedavg     θ' = base + Δ                                           (no state)
    nesterov   DiLoCo (Douillard et al. 2023): pseudo-gradient g = −Δ (base − local, averaged),
               m' = μ m + g,  θ' = base − η (g + μ m')                  (state: the momentum m)

The momentum is outer-optimizer state of the lineage, not of a validator: it is stored as a
float32 tensor artifact (``encode_state``) whose content id the head names (``HeadDescriptor.
outer_state``), so a restarted or new validator reads it from the edge and computes the same next
head. The step is float64 elementwise arithmetic on float32 inputs, so every validator of a quorum
gets the same bytes. A window that merges nothing keeps the state; a merge the promotion rule
blocks restarts the momentum at zero, so an overshoot cannot block the experiment twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .aggregation import Vector, flatten, unflatten
from .codec import decode_tensors, encode_tensors
from .errors import InvalidMessage
from .model import Model
from .updates import check_layout

__all__ = ["OUTER_OPTIMIZERS", "OuterOptimizer", "decode_state", "encode_state"]

OUTER_OPTIMIZERS = ("fedavg", "nesterov")


@dataclass(frozen=True)
class OuterOptimizer:
    """``kind`` (``OUTER_OPTIMIZERS``), outer learning rate η and momentum μ (DiLoCo's defaults)."""

    kind: str = "fedavg"
    learning_rate: float = 0.7
    momentum: float = 0.9

    def __post_init__(self) -> None:
        if self.kind not in OUTER_OPTIMIZERS:
            raise InvalidMessage(f"unknown outer optimizer {self.kind!r}; outer optimizers: {OUTER_OPTIMIZERS}")
        if not 0.0 < self.learning_rate <= 10.0 or not 0.0 <= self.momentum < 1.0:
            raise InvalidMessage("outer learning rate must be in (0, 10] and momentum in [0, 1)")

    @property
    def stateful(self) -> bool:
        return self.kind == "nesterov"

    def step(self, base: Vector, update: Vector, momentum: Vector | None) -> tuple[Vector, Vector | None]:
        """The next parameters from ``base`` and the window's merged ``update`` Δ, and the next
        momentum (``None`` for stateless FedAvg; a missing ``momentum`` is zero)."""
        if not self.stateful:
            return base + update, None
        gradient = -update
        m = gradient if momentum is None else self.momentum * momentum + gradient
        # float32 state, as stored: the next window starts from exactly the bytes others read back
        m = m.astype(np.float32).astype(np.float64)
        return base - self.learning_rate * (gradient + self.momentum * m), m


def encode_state(spec: Model, momentum: Vector) -> bytes:
    """The momentum as a float32 tensor artifact, one tensor per parameter (the model's names)."""
    return encode_tensors(unflatten(spec, momentum), {"model": spec.name, "kind": "outer-momentum"})


def decode_state(spec: Model, data: bytes) -> Vector:
    """The momentum vector of an artifact written by ``encode_state``; ``InvalidMessage`` when its
    layout is not exactly the model's float32 parameters."""
    tensors, _ = decode_tensors(data)
    check_layout(spec, tensors, "fp32")
    return flatten(spec, tensors)
