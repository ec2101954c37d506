"""Directories and the viewer's snapshot: the network manifest, experiments, peers, health, metrics."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from protocol.errors import InvalidMessage
from protocol.messages import HeadDescriptor, merged_evaluations
from protocol.network_pins import NetworkSignature

from .control_routes import control_view
from .deps import State, client_address, read_json
from .errors import Conflict, documented
from .hub import public_event
from .responses import JSON
from .revision_routes import applied_revision

router = APIRouter(tags=["portal"])


@router.get("/healthz")
async def healthz(state: State) -> JSON:
    return JSON({"ok": True, "network_id": state.network.network_id, "peers": len(state.hub.connections)})


@router.get("/metrics")
async def metrics(state: State) -> Response:
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/v1/network")
async def network(state: State) -> JSON:
    """The network manifest: validator keys, the edge's key, experiments."""
    return JSON(state.network.to_wire())


@router.get("/v1/network/signatures")
async def network_signatures(state: State) -> JSON:
    """The validators' signatures over the network's terms (``protocol.network_pins``), each checked
    against the manifest this edge serves: what a joining peer compares with its pins."""
    return JSON([s.to_wire() for s in state.network_signatures()])


@router.post("/v1/network/signatures", responses=documented(InvalidMessage, Conflict))
async def sign_network(request: Request, state: State) -> JSON:
    """A validator's signature over the network's terms: kept when it is one of the manifest's
    validators' and verifies over the terms this edge serves (409 otherwise: the validator holds
    another manifest)."""
    state.address_limits.check(client_address(request))  # before the signature is checked
    signature = NetworkSignature.from_wire(await read_json(request, 1024))
    if not signature.verifies(state.network):
        raise Conflict(
            f"not a signature of a validator of network {state.network.network_id!r} over the terms this edge serves"
        )
    wire = signature.to_wire()
    state.store.keep_network_signature(wire["validator_key"], wire["signature"])
    return JSON(wire)


PEER_PAGE = 1000


@router.get("/v1/peers", responses=documented(InvalidMessage))
async def peers(
    state: State,
    cursor: Annotated[str, Query(max_length=80)] = "",
    limit: Annotated[int, Query(ge=1, le=PEER_PAGE)] = PEER_PAGE,
) -> JSON:
    """The peers joined to this edge now (``connected``: bounded by its connection cap), and one page of
    every peer it has seen (``known``, by peer id): at most ``limit`` (``PEER_PAGE`` at most) after
    ``cursor`` ("": from the first), and ``next``, the cursor of the next page (``null``: the last)."""
    connected = [
        {"peer_id": c.peer_id, "kind": c.kind, "joined_at_ms": c.joined_at_ms} for c in state.hub.connections.values()
    ]
    known = state.store.peers_page(cursor, limit + 1)
    more = len(known) > limit
    return JSON({"connected": connected, "known": known[:limit], "next": known[limit - 1]["peer_id"] if more else None})


@router.get("/v1/experiments")
async def experiments(state: State) -> JSON:
    """Each experiment's spec and current head."""
    result = []
    for spec in state.network.experiments:
        head = state.store.current_head(spec.key)
        result.append({"spec": spec.to_wire(), "head": None if head is None else head.to_wire()})
    return JSON(result)


RECENT_HEADS = 120  # the snapshot's lineage: the newest heads, each of them
EARLIER_POINTS = 120  # and at most this many of the heads before them, evenly spaced (a chart's points)
SNAPSHOT_PEERS = 50  # connected peers listed by the snapshot (``by_kind`` counts them all)


def chart_heads(lineage: list[HeadDescriptor]) -> list[HeadDescriptor]:
    """What the snapshot lists of ``lineage`` (oldest first): its first head, every one of its last
    ``RECENT_HEADS``, and at most ``EARLIER_POINTS`` evenly spaced between; so a snapshot stays the same
    size however long an experiment runs, and a page on a slow link refreshing it after each head does
    not spend the link on history it drew already."""
    earlier = lineage[:-RECENT_HEADS]
    if len(earlier) > EARLIER_POINTS:
        step = len(earlier) / EARLIER_POINTS
        earlier = [earlier[int(i * step)] for i in range(EARLIER_POINTS)]
    return earlier + lineage[-RECENT_HEADS:]


@router.get("/portal/snapshot")
async def snapshot(state: State) -> JSON:
    """Everything a viewer page needs in one request, bounded in size: each experiment's lineage as
    ``chart_heads`` (``lineage_length``: how many heads it has), and at most ``SNAPSHOT_PEERS``
    connected peers."""
    experiments = []
    for spec in state.network.experiments:
        lineage = state.store.heads(spec.key)
        tests = merged_evaluations(state.store.evaluations(spec.key))
        experiments.append(
            {
                "key": spec.key,
                "spec": spec.to_wire(),
                "head": lineage[-1].to_wire() if lineage else None,
                "lineage_length": len(lineage),
                "lineage": [
                    {
                        "head_id": h.head_id,
                        "parent": h.parent,
                        "window": h.window,
                        "merged": len(h.merged),
                        "metrics": h.metrics | tests.get(h.head_id, {}),  # with its test-split evaluation
                        "created_at_ms": h.created_at_ms,
                    }
                    for h in chart_heads(lineage)
                ],
                "verdicts": state.store.verdict_counts(spec.key),
                "recent_verdicts": [v.to_wire() for v in state.store.verdicts(spec.key, limit=20)],
                "leaderboard": [standing.to_wire() for standing in state.credit.leaderboard(spec.key, 10)],
                "control": control_view(state, spec.key),
            }
        )
    connected = [
        {"peer_id": c.peer_id, "kind": c.kind, "joined_at_ms": c.joined_at_ms} for c in state.hub.connections.values()
    ]
    return JSON(
        {
            "network_id": state.network.network_id,
            "now_ms": int(time.time() * 1000),
            "experiments": experiments,
            "revisions": [applied_revision(state, signed, at) for signed, at in state.store.network_revisions()],
            "peers": {
                "connected": connected[:SNAPSHOT_PEERS],
                "by_kind": state.hub.peers_by_kind(),
                "active_by_kind": _active_by_kind(state.store.peers()),
                "known": len(state.store.peers()),
            },
            "events": [public_event(e) if state.admission.required else e for e in list(state.hub.events)[-50:]],
        }
    )


ACTIVE_WITHIN_MS = 60_000


def _active_by_kind(peers: list[dict[str, object]]) -> dict[str, int]:
    """Peers seen (relay, lease or upload) within the last minute, by kind."""
    cutoff = time.time() * 1000 - ACTIVE_WITHIN_MS
    counts: dict[str, int] = {}
    for peer in peers:
        if int(peer["last_seen_ms"]) >= cutoff:  # type: ignore[call-overload]
            counts[str(peer["kind"])] = counts.get(str(peer["kind"]), 0) + 1
    return counts
