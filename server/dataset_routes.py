"""The HTTP dataset origin: fetch-manifest and lease-scoped shard bytes.

Shards are served only to holders of a live lease that lists them: ``?lease=<lease id>`` plus the
lease's secret, which only its holder got (``LEASE_SECRET_HEADER``): 401 without them, 403 for a
wrong secret, a shard outside the lease or an expired lease. With admission on, reading the
fetch-manifest and shards also needs a token whose role may read training data. Only the train split
is served; validation and test data never leave the validators.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response

from protocol.errors import InvalidMessage
from protocol.hashing import content_id
from protocol.ids import LeaseId, ShardId
from protocol.messages import LEASE_SECRET_HEADER
from protocol.signing import canonical_json

from .deps import Issuer, State
from .errors import Forbidden, NotFound, Unauthorized, documented
from .responses import conditional_get, immutable_file

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


@router.get("/{dataset_id}/fetch-manifest.json", responses=documented(NotFound, Unauthorized, Forbidden))
@router.head("/{dataset_id}/fetch-manifest.json")
async def fetch_manifest(dataset_id: str, state: State, request: Request) -> Response:
    state.admission.check_header(request.headers.get("authorization"), "read_data")
    body = canonical_json(state.dataset(dataset_id).to_wire())
    cache = f"{'private' if state.admission.required else 'public'}, max-age=60"
    return conditional_get(request, body, content_id(body), cache_control=cache, media_type="application/json")


@router.get("/{dataset_id}/shards/{shard_id}", responses=documented(InvalidMessage, NotFound, Unauthorized, Forbidden))
@router.head("/{dataset_id}/shards/{shard_id}")
async def shard(
    dataset_id: str,
    shard_id: str,
    state: State,
    request: Request,
    issuer: Issuer,
    lease: Annotated[str | None, Query(max_length=80)] = None,
    lease_secret: Annotated[str | None, Header(alias=LEASE_SECRET_HEADER, max_length=128)] = None,
) -> Response:
    state.admission.check_header(request.headers.get("authorization"), "read_data")
    manifest = state.dataset(dataset_id)
    try:
        entry = manifest.shard(ShardId(shard_id))
    except KeyError:
        raise NotFound(f"no shard {shard_id} in {dataset_id}") from None
    if lease is None or lease_secret is None:
        raise Unauthorized(
            f"shards are served to lease holders only: add ?lease=<lease id> and the {LEASE_SECRET_HEADER} header"
        )
    held = issuer.check_secret(LeaseId(lease), lease_secret)
    if held.expires_at_ms <= state.clock.now_ms():
        raise Forbidden("lease expired")
    if held.dataset_id != manifest.dataset_id or entry.shard_id not in held.shard_ids:
        raise Forbidden(f"shard {shard_id} is not in lease {lease}")
    if request.method == "GET" and "range" not in request.headers:
        state.metrics.shard_bytes.inc(entry.size_bytes)
    return immutable_file(request, state.shard_path(manifest, entry.locator), f"sha256:{entry.sha256}", private=True)
