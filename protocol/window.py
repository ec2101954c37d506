"""One training window, pure: the checks a trainer makes around its own I/O, and what it publishes.

Native (JAX) and browser (NumPy) trainers run the same steps; only fetching and training differ:

    head = head_to_train(current_head, network, last_trained)           # certified, not trained on
    lease = ...                                                         # asked of the edge
    check_lease(lease, head, peer_id=me, edge_key=network.edge_key)     # this window, this peer
    # (or, leased right after publishing: check_lease(lease, head, ..., ahead=True), the next window)
    seed = epoch_seed(lease, epoch)                                     # the batch order per epoch
    tensors, residual = encode_update(model, base, params, codec, residual)  # protocol.updates
    candidate, body = package_candidate(lease, head, tensors, signer, ...)  # signed, in one envelope

Work a continuous trainer trained ahead, from its own last candidate, goes on from the next head where
``carried_onto`` says.

``lease_covers`` is the one lease-ownership rule: the edge's intake and the validators' precheck
both ask it whether a candidate names a lease its trainer holds for its window.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from .batches import window_seed
from .codec import encode_tensors
from .envelope import pack_envelope
from .errors import InvalidMessage
from .ids import ContentId, HeadId, PeerId
from .manifests import NetworkManifest
from .messages import Candidate, HeadDescriptor, Lease
from .signing import Signer

__all__ = [
    "NoWindow",
    "check_lease",
    "epoch_seed",
    "head_to_train",
    "lease_covers",
    "lease_window",
    "package_candidate",
]


class NoWindow(Exception):
    """No window to train right now: no head yet, the head was already trained on, or it moved on."""


def head_to_train(head: HeadDescriptor | None, network: NetworkManifest, last_trained: HeadId | None) -> HeadDescriptor:
    """``head`` when ``network`` trusts it (a quorum of its validators vouch for it, or its last change
    of validators handed over at it: ``NetworkManifest.verify_head``) and it is not the head last
    trained on.

    Raises ``NoWindow`` (no head, or already trained on it) or ``SignatureError`` (untrusted head)."""
    if head is None:
        raise NoWindow("no head yet")
    network.verify_head(head)
    if head.head_id == last_trained:
        raise NoWindow(f"already trained on window {head.window}; waiting for a newer head")
    return head


def lease_window(lease: Lease, head: HeadDescriptor) -> bool:
    """Whether ``lease`` is a lease of the window trained on ``head``: granted on ``head`` for its
    window, or granted ahead, on ``head``'s parent before ``head`` existed, for ``head``'s window
    number (a trainer that published its last window leases the next one at once)."""
    return lease.window == head.window and lease.base_head in (head.head_id, head.parent)


def check_lease(
    lease: Lease, head: HeadDescriptor, *, peer_id: PeerId, edge_key: bytes | None, ahead: bool = False
) -> None:
    """Raise unless ``lease`` lets ``peer_id`` train the window on ``head`` (``ahead``: the window after
    ``head``, whose head does not exist yet).

    ``SignatureError``: not signed by ``edge_key`` (checked when given); ``NoWindow``: the lease is
    for another window (the head moved on while leasing); ``InvalidMessage``: another peer's lease,
    or one for another experiment."""
    if edge_key is not None:
        lease.verify(edge_key)
    if lease.window != head.window + ahead or not (ahead or lease_window(lease, head)):
        raise NoWindow("the head moved on while leasing")
    if lease.peer_id != peer_id:
        raise InvalidMessage(f"lease {lease.lease_id} is for peer {lease.peer_id}, not {peer_id}")
    if lease.experiment != head.experiment:
        raise InvalidMessage(f"lease {lease.lease_id} is for {lease.experiment}, not {head.experiment}")


def lease_covers(lease: Lease | None, candidate: Candidate, base: HeadDescriptor | None) -> bool:
    """Whether ``candidate`` names a lease its trainer holds for the window it was trained in: same
    peer and experiment, a lease of the window on ``base`` (``lease_window``), ``base`` the head the
    candidate names. ``lease`` is the one the candidate names and ``base`` its base head's descriptor
    (``None`` when unknown)."""
    return (
        lease is not None
        and base is not None
        and base.head_id == candidate.base_head
        and lease.peer_id == candidate.peer_id
        and lease.experiment == candidate.experiment
        and lease_window(lease, base)
    )


def carried_onto(
    head: HeadDescriptor,
    base: Mapping[str, npt.ArrayLike],
    trained: Mapping[str, npt.ArrayLike],
    origin: Mapping[str, npt.ArrayLike],
    published: ContentId | None,
) -> dict[str, npt.NDArray[np.float32]]:
    """Where work trained ahead from ``origin`` to ``trained`` goes on once ``head`` (parameters
    ``base``) is out, ``origin`` being the trainer's candidate ``published`` (None: work that never
    reached the network, trained on from the head it was leased on). Decision 0045:

    - ``head`` merged that candidate alone: at ``trained`` itself. The window takes the share of a
      step the holdout prefers (decision 0028), near convergence about half of it, so the head sits
      part of a step behind ``origin``; the work trained from there mostly corrects the trainer's own
      last step, and moved onto the head it would correct twice. The trainer keeps its own point and
      the heads follow it, as Lookahead's slow weights follow its fast ones (Zhang et al. 2019),
      though here the fast weights are never reset to the slow.
    - else ``base + (trained − origin)``: the progress made, on the head with the others' work in it."""
    if published is not None and tuple(head.merged) == (published,):
        return {name: np.asarray(trained[name], np.float32) for name in base}
    return {
        name: (np.asarray(base[name]) + (np.asarray(trained[name]) - np.asarray(origin[name]))).astype(np.float32)
        for name in base
    }


def epoch_seed(lease: Lease, epoch: int) -> int:
    """The batch-shuffle seed for ``epoch`` of the window trained on ``lease``."""
    return window_seed(lease.lease_id, epoch)


def package_candidate(
    lease: Lease,
    head: HeadDescriptor,
    tensors: Mapping[str, npt.NDArray[np.generic]],
    signer: Signer,
    *,
    peer_kind: str,
    model: str,
    codec: str,
    examples: int,
    steps: int,
    created_at_ms: int,
    metrics: Mapping[str, float],
) -> tuple[Candidate, bytes]:
    """The signed candidate for ``tensors`` (an update of ``head``, encoded with ``codec``:
    ``protocol.updates``) trained on ``lease``, a lease of ``head``'s window, and the envelope to upload.

    The artifact records ``model``, ``codec`` and the base head in its metadata; the candidate id is
    its content id."""
    if not lease_window(lease, head):
        raise InvalidMessage(f"lease {lease.lease_id} is not for the window on {head.head_id}")
    artifact = encode_tensors(tensors, {"model": model, "codec": codec, "base_head": head.head_id})
    candidate = Candidate.for_lease(
        lease,
        head.head_id,
        artifact,
        signer,
        peer_kind=peer_kind,
        examples=examples,
        steps=steps,
        created_at_ms=created_at_ms,
        metrics=dict(metrics),
    )
    return candidate, pack_envelope(candidate.to_wire(), artifact)
