"""The HTTP dataset origin: fetch-manifest and lease-scoped shard bytes.

Shards are served only to holders of a live lease that lists them (``?lease=<lease id>``):
401 without a lease, 403 for a shard outside it or an expired lease. Only the train split is
served; validation and test data never leave the validators.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from protocol.hashing import content_id
from protocol.ids import LeaseId, ShardId
from protocol.signing import canonical_json

from .deps import State
from .errors import Forbidden, NotFound, Unauthorized
from .responses import immutable_file

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


@router.get("/{dataset_id}/fetch-manifest.json")
async def fetch_manifest(dataset_id: str, state: State, request: Request) -> Response:
    body = canonical_json(state.dataset(dataset_id).to_wire())
    etag = f'"{content_id(body)}"'
    headers = {"etag": etag, "cache-control": "public, max-age=60"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


@router.get("/{dataset_id}/shards/{shard_id}")
async def shard(
    dataset_id: str,
    shard_id: str,
    state: State,
    request: Request,
    lease: Annotated[str | None, Query(max_length=80)] = None,
) -> Response:
    manifest = state.dataset(dataset_id)
    try:
        entry = manifest.shard(ShardId(shard_id))
    except KeyError:
        raise NotFound(f"no shard {shard_id} in {dataset_id}") from None
    if lease is None:
        raise Unauthorized("shards are served to lease holders only: add ?lease=<lease id>")
    held = state.store.lease(LeaseId(lease))
    if held is None:
        raise Forbidden("unknown lease")
    if held.expires_at_ms <= time.time() * 1000:
        raise Forbidden("lease expired")
    if held.dataset_id != manifest.dataset_id or entry.shard_id not in held.shard_ids:
        raise Forbidden(f"shard {shard_id} is not in lease {lease}")
    if "range" not in request.headers:
        state.metrics.shard_bytes.inc(entry.size_bytes)
    return immutable_file(request, state.shard_path(manifest, entry.locator), f"sha256:{entry.sha256}", private=True)
