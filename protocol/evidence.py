"""Evidence that a candidate trained on its own lease: credit for work, not for claims. Pure NumPy.

Training fits the examples trained on more than others. ``lease_evidence_z`` compares each example's
loss gain (the base head's loss − the candidate's) on up to ``EVIDENCE_EXAMPLES`` of the lease's
examples with the gains on as many *control* examples: training examples of shards outside the lease.
An update that did not see the lease's examples (noise, the lineage's last step again, another peer's
update copied) gains on them what it gains on any training examples, z ≈ N(0, 1); an honest update
fits its lease (the idea of the gauntlet Templar's validators run: assigned against random data).

The control is training data, not the validator's holdout: a lineage that trains on the pool keeps
fitting the pool more than unseen data, so against the holdout the lineage's last step repeated looks
trained (decision 0020). A window's control is drawn from
``CONTROL_SHARDS`` shards (many shards: one shard's examples share a training history, and a control
of few shards moved free riders' z); each candidate is compared with the control rows outside its
own lease. What is drawn follows the closed window's salt and the lease id (``EvidenceDraw``): the
same at every validator, unknown to a trainer while it trains, so neither training a subset of its
lease nor worsening a known control set is rewarded.

A lease that holds more than half of the training pool (``MAX_LEASE_SHARE``, ``lease_measurable``) is
not measured: leases are drawn from the same pool every window, so most of the control left outside
it is data the same peer trained on in the windows before, and its gains cannot be told from the
lease's (a lone trainer's candidates near convergence drew z of 0.3–1.9 there). Its candidate is
judged on the other screens and earns no credit (decision 0038).

It is measured in stages (``EVIDENCE_STAGES``): on the first ``n`` rows of the lease's draw and as
many control rows, where each stage's rows include the stage's before it; a stage whose z reaches
``DECISIVE_Z`` decides (``evidence_decided``), else the next stage reads more, up to the whole draw.
An honest update's z grows with √n and clears ``DECISIVE_Z`` at the first stage almost always (its z
over the whole draw is then about twice that: well above every bound), so a validator pays a quarter
of the forward passes for it; an update near or below the bounds is measured on the whole draw, as
before. Every validator stops at the same stage: the rows are drawn alike.

Work a continuous peer trains ahead (its next lease, from its own last candidate, moved onto the head
once it arrives) shows less of its lease window after window along an unbroken chain of it (a median z
near 10 where a chain starts from the head, 1 by its ninth window). ``restarts_from_head``: after
``AHEAD_CHAIN`` such windows in a row, where the lease is measured, a peer trains its next lease from
its head (decision 0041); native and browser peers follow the same rule.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "AHEAD_CHAIN",
    "CONTROL_SHARDS",
    "DECISIVE_Z",
    "EVIDENCE_EXAMPLES",
    "EVIDENCE_STAGES",
    "EvidenceDraw",
    "evidence_decided",
    "lease_evidence_z",
    "lease_measurable",
    "restarts_from_head",
]

EVIDENCE_EXAMPLES = 16_000  # the most lease examples compared, and as many control examples (decision 0029)
EVIDENCE_STAGES = (4_000, EVIDENCE_EXAMPLES)  # the rows read by each stage of the measurement
DECISIVE_Z = 4.0  # a stage's z at or above this decides: twice the refusal bound, above the credit bound
CONTROL_SHARDS = 16  # the shards a window's control examples come from
MAX_LEASE_SHARE = 0.5  # a lease holding more of the training pool than this is not measured (decision 0038)
AHEAD_CHAIN = 4  # windows in a row a peer trains ahead from its own last candidate before one from its head


def _rng(*parts: bytes) -> np.random.Generator:
    return np.random.default_rng(int.from_bytes(hashlib.sha256(b"\n".join(parts)).digest()[:8], "big"))


@dataclass(frozen=True)
class EvidenceDraw:
    """What the lease evidence of a window is measured on, drawn from its tie-break ``salt``: the
    ``control`` shards (``CONTROL_SHARDS`` of the training split's ``shard_ids``, in drawn order),
    and for each lease the rows of its examples and of the control it is compared with."""

    salt: bytes
    control: tuple[str, ...]

    @classmethod
    def of(cls, salt: bytes, shard_ids: Sequence[str]) -> EvidenceDraw:
        """``ValueError`` without shards."""
        if not shard_ids:
            raise ValueError("no training shards to draw a control from")
        order = sorted(shard_ids, key=lambda s: hashlib.sha256(b"dtn-evidence-control\n" + salt + s.encode()).digest())
        return cls(salt, tuple(order[:CONTROL_SHARDS]))

    def lease_rows(self, lease_id: str, examples: int, limit: int = EVIDENCE_EXAMPLES) -> npt.NDArray[np.int64]:
        """Sorted indices of up to ``limit`` (at most ``EVIDENCE_EXAMPLES``) of a lease's ``examples``
        (its shards' examples concatenated in lease order); a smaller ``limit``'s rows are among a
        larger one's."""
        rng = _rng(b"dtn-evidence-lease", self.salt, lease_id.encode())
        return np.sort(rng.permutation(examples)[: min(limit, EVIDENCE_EXAMPLES)]).astype(np.int64)

    def control_rows(
        self, lease_id: str, lease_shards: Sequence[str], sizes: Sequence[int], count: int
    ) -> npt.NDArray[np.int64]:
        """Sorted indices of up to ``count`` rows of the control (the ``control`` shards' examples
        concatenated in that order, ``sizes`` each) outside the shards of lease ``lease_id``; a smaller
        ``count``'s rows are among a larger one's."""
        leased = set(lease_shards)
        outside = np.flatnonzero(np.repeat([s not in leased for s in self.control], sizes))
        rng = _rng(b"dtn-evidence-control-rows", self.salt, lease_id.encode())
        return np.sort(outside[rng.permutation(len(outside))[:count]]).astype(np.int64)


def lease_measurable(lease_examples: int, pool_examples: int) -> bool:
    """Whether the evidence of a lease of ``lease_examples`` of a training pool of ``pool_examples`` is
    measured: the lease holds at most ``MAX_LEASE_SHARE`` of the pool."""
    return lease_examples <= MAX_LEASE_SHARE * pool_examples


def restarts_from_head(chain: int, asks_lease_evidence: bool, lease_examples: int, pool_examples: int) -> bool:
    """Whether a peer that trained its last ``chain`` windows in a row ahead (from its own last
    candidate) trains its next lease, of ``lease_examples``, from its head instead: after
    ``AHEAD_CHAIN`` of them, where validators measure that lease's evidence (its experiment's preset
    ``asks_lease_evidence`` and ``lease_measurable`` in a pool of ``pool_examples``)."""
    return chain >= AHEAD_CHAIN and asks_lease_evidence and lease_measurable(lease_examples, pool_examples)


def evidence_decided(z: float, rows: int, available: int) -> bool:
    """Whether a stage that compared ``rows`` of a lease's ``available`` drawable rows (``min(lease
    examples, EVIDENCE_EXAMPLES)``) decides with evidence ``z``: it reached ``DECISIVE_Z``, or it read
    every row there is to read."""
    return z >= DECISIVE_Z or rows >= available


def lease_evidence_z(
    lease_gains: Sequence[float] | npt.NDArray[np.floating], control_gains: Sequence[float] | npt.NDArray[np.floating]
) -> float:
    """The evidence that a candidate trained on its own lease, in standard errors: per-example loss
    gains (the base head's loss − the candidate's) on examples of its lease and on control examples,
    z = (mean lease gain − mean control gain) / √(var_lease / n_lease + var_control / n_control).
    0 when both sides' gains are constant and equal, ±inf when constant and different; ``ValueError``
    with fewer than 2 examples on a side or a non-finite gain."""
    lease, control = np.asarray(lease_gains, np.float64), np.asarray(control_gains, np.float64)
    if lease.size < 2 or control.size < 2:
        raise ValueError("lease evidence needs at least 2 examples on each side")
    if not (np.isfinite(lease).all() and np.isfinite(control).all()):
        raise ValueError("lease evidence needs finite loss gains")
    difference = float(lease.mean() - control.mean())
    se = float(np.sqrt(lease.var(ddof=1) / lease.size + control.var(ddof=1) / control.size))
    if se == 0.0:
        return 0.0 if difference == 0.0 else float(np.copysign(np.inf, difference))
    return difference / se
