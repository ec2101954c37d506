"""What the edge takes in: candidates, heads and verdicts, by HTTP or WebSocket alike.

Each upload is checked in the same order everywhere: size, envelope, descriptor shape, signature,
(candidates) the sender's rate limit and that it holds the lease it names for this window
(``protocol.window.lease_covers``, the rule validators apply too), artifact hash, artifact
decodes as tensors, artifact stored (fsynced); then the record is committed and only then
acknowledged and announced. Whether a candidate is any good is the validators' call, not the edge's.
"""

from __future__ import annotations

import anyio

from protocol.codec import decode_tensors
from protocol.envelope import MAX_DESCRIPTOR_BYTES, unpack_envelope
from protocol.errors import InvalidMessage, SignatureError, TooLarge
from protocol.hashing import verify_content
from protocol.ids import ContentId, ExperimentKey
from protocol.messages import Candidate, HeadDescriptor, Verdict
from protocol.window import lease_covers

from .errors import Forbidden
from .state import EdgeState

__all__ = ["accept_candidate", "accept_head", "accept_verdict"]


async def _store_artifact(state: EdgeState, artifact: bytes, cid: ContentId) -> None:
    def work() -> None:
        verify_content(artifact, cid)
        decode_tensors(artifact)
        state.blobs.put(artifact, cid)

    await anyio.to_thread.run_sync(work)


def _open(state: EdgeState, body: bytes) -> tuple[object, bytes]:
    if len(body) > state.settings.max_artifact_bytes + MAX_DESCRIPTOR_BYTES:
        raise TooLarge(f"upload of {len(body)} bytes exceeds {state.settings.max_artifact_bytes}")
    return unpack_envelope(body)


def _same_experiment(claimed: ExperimentKey, route: ExperimentKey | None) -> None:
    if route is not None and claimed != route:
        raise InvalidMessage(f"descriptor is for {claimed}, not {route}")


async def accept_candidate(
    state: EdgeState, body: bytes, *, via: str, route: ExperimentKey | None = None
) -> tuple[Candidate, bool]:
    """Store a trainer's signed candidate; returns it and whether it was new."""
    try:
        descriptor, artifact = _open(state, body)
        candidate = Candidate.from_wire(descriptor)
        _same_experiment(candidate.experiment, route)
        state.experiment(candidate.experiment)
        candidate.verify_own()
        state.peer_limits.check(candidate.peer_id)
        if not lease_covers(state.store.lease(candidate.lease_id), candidate):
            raise Forbidden("a candidate must name a lease its trainer holds for this experiment")
        await _store_artifact(state, artifact, candidate.candidate_id)
    except Exception as exc:
        state.metrics.rejected_uploads.labels(type(exc).__name__).inc()
        raise
    created = state.store.add_candidate(candidate, state.clock.now_ms())
    if created:
        state.metrics.candidates.labels(via).inc()
        state.store.saw_peer(candidate.peer_id, candidate.peer_kind, state.clock.now_ms())
        state.hub.publish(candidate.experiment, "candidates", candidate.to_wire())
    return candidate, created


async def accept_head(state: EdgeState, body: bytes, *, route: ExperimentKey | None = None) -> HeadDescriptor:
    """Promote a validator-signed head whose parent is the current head."""
    try:
        descriptor, artifact = _open(state, body)
        head = HeadDescriptor.from_wire(descriptor)
        _same_experiment(head.experiment, route)
        state.experiment(head.experiment)
        head.verify_trusted(state.network.validator_key_set)
        await _store_artifact(state, artifact, head.head_id)
    except Exception as exc:
        state.metrics.rejected_uploads.labels(type(exc).__name__).inc()
        raise
    if state.store.promote_head(head, state.clock.now_ms()):
        state.metrics.heads.inc()
        state.hub.publish(head.experiment, "heads", head.to_wire())
        state.hub.head_changed(head.experiment)
    return head


def accept_verdict(state: EdgeState, descriptor: object, *, route: ExperimentKey | None = None) -> Verdict:
    verdict = Verdict.from_wire(descriptor)
    _same_experiment(verdict.experiment, route)
    if verdict.validator_key not in state.network.validator_key_set:
        raise SignatureError("verdict is not signed by a validator of this network")
    verdict.verify(verdict.validator_key)
    if state.store.add_verdict(verdict):
        state.hub.publish(verdict.experiment, "verdicts", verdict.to_wire())
    return verdict
