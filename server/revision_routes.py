"""Network revisions over HTTP (``protocol.network_revisions``): the terms of the network this edge
serves change only as a quorum of its validators signs.

    POST /v1/network/revisions   a ``SignedNetworkRevision`` (JSON, at most ``MAX_REVISION_BYTES``)
    GET  /v1/network/revisions   every revision applied, in order, each with when this edge took it

Anyone may submit one (the signatures are the credential). The edge checks it against the terms it
serves and applies it, in one store transaction with its number (edges sharing a store take each once)
and its handover check (no head or order certified by the validators before it is taken in between:
``EdgeStore.add_network_revision``), then serves the revised manifest, publishes it on the ``network`` topic and tells the other edges of
its deployment (``Hub.deliver``), which read it from the store. Refusals, each with its reason: 400 a
malformed revision or one that does not fit its terms (an experiment already listed, a model that does
not fit its dataset), 401 fewer than the quorum of the validators before it, or another network's, 409
a revision this edge holds already or one after a gap, a validator change whose handover heads this
edge lacks or has moved past, or past whose orders it applied others (``handover_refusal``), an experiment on a dataset this edge does not
serve, 413 a body over the limit.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from protocol.errors import InvalidMessage, SignatureError, TooLarge
from protocol.ids import ExperimentKey
from protocol.messages import HeadDescriptor
from protocol.network_pins import fingerprint
from protocol.network_revisions import SignedNetworkRevision, handover_refusal

from .deps import State, body_doc, client_address, read_json
from .errors import Conflict, NotFound, documented
from .hub import NETWORK_SCOPE
from .responses import JSON
from .state import EdgeState, load_datasets

__all__ = ["MAX_REVISION_BYTES", "accept_revision", "applied_revision", "router"]

router = APIRouter(prefix="/v1/network", tags=["network"])

MAX_REVISION_BYTES = 1 << 20  # a revision carries whole experiment specs (a model's layers) and 64 signatures


@router.post(
    "/revisions",
    status_code=201,
    responses=documented(InvalidMessage, SignatureError, Conflict, TooLarge),
    openapi_extra=body_doc("application/json", "a SignedNetworkRevision: the revision and its validators' signatures"),
)
async def submit_revision(state: State, request: Request) -> JSON:
    """Apply a revision of the network's terms signed by a quorum of its validators (``accept_revision``);
    answers the revision as applied and publishes the revised network on the ``network`` topic."""
    state.address_limits.check(client_address(request))  # before signatures are checked
    signed = SignedNetworkRevision.from_wire(await read_json(request, MAX_REVISION_BYTES))
    return JSON(await accept_revision(state, signed), status_code=201)


@router.get("/revisions")
async def network_revisions(state: State) -> JSON:
    """Every revision applied to the network's first terms, in order (``applied_revision``): what a peer
    that trusts those terms, or an earlier revision, checks the manifest it is served against."""
    return JSON([applied_revision(state, signed, at) for signed, at in state.store.network_revisions()])


async def accept_revision(state: EdgeState, signed: SignedNetworkRevision) -> dict[str, Any]:
    """Apply ``signed`` to the network this edge serves (submitted, or mirrored from the edge this one
    follows) and publish it; returns the published event (``applied_revision``). Refusals as the module
    docstring lists them."""
    network, revision = state.network, signed.revision
    if revision.number <= network.revision:
        raise Conflict(f"this edge holds network revision {revision.number} already (it serves {network.revision})")
    if revision.number > network.revision + 1:
        raise Conflict(f"network revision {revision.number} does not follow revision {network.revision}, served here")
    revised = signed.apply(network)  # SignatureError: under quorum; InvalidMessage: not these terms
    for spec in revision.experiments:
        if spec.dataset_id not in state.datasets:  # prepared since the edge started?
            state.datasets = await state.offload(load_datasets, state.settings.datasets_dir)
        try:
            spec.check_dataset(state.dataset(spec.dataset_id))
        except NotFound:
            raise Conflict(
                f"experiment {spec.key} trains on dataset {spec.dataset_id}, which this edge does not serve; "
                "prepare it in the edge's datasets folder first"
            ) from None

    def refusal(lineages: dict[ExperimentKey, list[HeadDescriptor]], sequences: dict[ExperimentKey, int]) -> str | None:
        return handover_refusal(network, revision, lineages, sequences)

    now_ms = state.clock.now_ms()
    # checked in the transaction that keeps it: no head or order is taken in between
    check = refusal if revision.changes_validators(network) else None
    await state.offload(state.store.add_network_revision, signed, now_ms, check)
    state.revised(revised)
    event = applied_revision(state, signed, now_ms)
    state.hub.publish(NETWORK_SCOPE, "network", event)
    return event


def applied_revision(state: EdgeState, signed: SignedNetworkRevision, applied_at_ms: int) -> dict[str, Any]:
    """A revision as the edge shows it: the revision and its signatures, when this edge's store took it,
    and the fingerprints of the signers that count (validators of the terms it revised)."""
    before = state.revision_base(signed.revision.number)
    signers = sorted(fingerprint(key) for key in signed.signers(before))
    return {**signed.to_wire(), "applied_at_ms": applied_at_ms, "signers": signers}
