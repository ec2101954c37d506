"""The HTTP dataset origin: fetch-manifest and lease-scoped shard bytes.

Shards are served only to holders of a live lease that lists them: ``?lease=<lease id>`` plus the
lease's secret, which only its holder got (``LEASE_SECRET_HEADER``): 401 without them, 403 for a
wrong secret, a shard outside the lease or an expired lease. With admission on, reading the
fetch-manifest and shards also needs a token whose role may read training data. Only the train split
is served; validation and test data never leave the validators.

Behind a reverse proxy with the ``accel_prefix`` setting (``deploy/nginx``), the edge still makes every
check and answers a shard request with ``X-Accel-Redirect: <prefix><dataset>/<split>/<locator>``, its
ETag and cache-control, and no body: the proxy sends the file from an internal location (Range, HEAD
and ``If-Range`` dates against the file's Last-Modified are the proxy's). The edge answers by itself
what the proxy cannot judge: ``If-None-Match`` (304 on the content id) and an entity-tag ``If-Range``
(the proxy knows only its own tags), so conditional requests behave as without a proxy.
``AccelShards`` (installed by ``server.serve`` with ``accel_prefix``) answers the plain requests of
that path before FastAPI sees them, with the same checks (``authorize_shard``).
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated
from urllib.parse import parse_qsl, quote

from fastapi import APIRouter, FastAPI, Header, Query, Request, Response
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from protocol.errors import InvalidMessage, ProtocolError
from protocol.hashing import content_id
from protocol.ids import LeaseId, ShardId
from protocol.manifests import FetchManifest, ShardEntry
from protocol.messages import LEASE_SECRET_HEADER, Lease
from protocol.signing import canonical_json

from .deps import Issuer, State
from .errors import EdgeError, Forbidden, NotFound, Unauthorized, documented
from .leasing import LeaseIssuer
from .responses import conditional_get, immutable_file
from .state import EdgeState

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])
SHARD_CACHE = "private, max-age=31536000, immutable"  # what ``immutable_file(..., private=True)`` sends


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
    manifest, entry = authorize_shard(
        state, dataset_id, shard_id, lease, lease_secret, request.headers.get("authorization"), issuer.check_secret
    )
    etag_id = f"sha256:{entry.sha256}"
    accel = state.settings.accel_prefix
    if accel and not request.headers.get("if-range", "").rstrip().endswith('"'):
        answer = _accel_redirect(request, accel_path(accel, manifest, entry), etag_id)
    else:
        answer = immutable_file(request, state.shard_path(manifest, entry.locator), etag_id, private=True)
    if request.method == "GET" and "range" not in request.headers and answer.status_code != 304:
        state.metrics.shard_bytes.inc(entry.size_bytes)
    return answer


def authorize_shard(
    state: EdgeState,
    dataset_id: str,
    shard_id: str,
    lease: str | None,
    lease_secret: str | None,
    authorization: str | None,
    check_secret: Callable[[LeaseId, str | None], Lease],
) -> tuple[FetchManifest, ShardEntry]:
    """Every check a shard request must pass, in order (admission, dataset and shard, lease and its
    secret, expiry, shard in the lease): the shard's manifest and entry, or the refusal raised."""
    state.admission.check_header(authorization, "read_data")
    manifest = state.dataset(dataset_id)
    try:
        entry = manifest.shard(ShardId(shard_id))
    except KeyError:
        raise NotFound(f"no shard {shard_id} in {dataset_id}") from None
    if lease is None or lease_secret is None:
        raise Unauthorized(
            f"shards are served to lease holders only: add ?lease=<lease id> and the {LEASE_SECRET_HEADER} header"
        )
    held = check_secret(LeaseId(lease), lease_secret)
    if held.expires_at_ms <= state.clock.now_ms():
        raise Forbidden("lease expired")
    if held.dataset_id != manifest.dataset_id or entry.shard_id not in held.shard_ids:
        raise Forbidden(f"shard {shard_id} is not in lease {lease}")
    return manifest, entry


def accel_path(prefix: str, manifest: FetchManifest, entry: ShardEntry) -> str:
    """The proxy's internal path of a shard file: ``<prefix><dataset>/<split>/<locator>``, URL-quoted."""
    return quote(f"{prefix}{manifest.dataset_id}/{manifest.split}/{entry.locator}")


def _accel_redirect(request: Request, internal_path: str, etag_id: str) -> Response:
    """What the proxy turns into the file at ``internal_path``: 304 when ``If-None-Match`` names the
    content id (``conditional_get`` judges it, as for bytes the edge sends), else the headers of the
    file's answer and ``X-Accel-Redirect``, no body."""
    answer = conditional_get(request, b"", etag_id, cache_control=SHARD_CACHE)
    if answer.status_code == 304:
        return answer
    return Response(
        status_code=200,
        media_type="application/octet-stream",
        headers={"x-accel-redirect": internal_path, "etag": f'"{etag_id}"', "cache-control": SHARD_CACHE},
    )


class AccelShards:
    """The hot path of shard serving behind a proxy, in front of the whole app: a plain ``GET``/``HEAD``
    of a shard (no ``If-None-Match``, no ``If-Range``) that passes ``authorize_shard`` is answered
    with its ``X-Accel-Redirect`` at once, without FastAPI's routing, dependencies and middleware (a
    few times cheaper per request). Anything else, refusals included, goes to the app, whose
    ``shard`` route makes the same checks and answers as it always does.

    Leases are immutable once issued, so the ones it has seen are kept (up to ``max_leases``) and a
    repeated request costs an HMAC instead of a database read; expiry is checked every time."""

    def __init__(self, app: FastAPI, max_leases: int = 4096) -> None:
        self.app = app
        self.max_leases = max_leases
        self._leases: OrderedDict[str, Lease] = OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = self._answer(scope) if scope["type"] == "http" and scope["method"] in ("GET", "HEAD") else None
        if answer is None:
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": answer})
        await send({"type": "http.response.body", "body": b""})

    def _answer(self, scope: Scope) -> list[tuple[bytes, bytes]] | None:
        parts = scope["path"].split("/")
        if len(parts) != 6 or parts[1:3] != ["v1", "datasets"] or parts[4] != "shards":
            return None
        headers = Headers(scope=scope)
        if "if-none-match" in headers or "if-range" in headers:
            return None
        leases = [value for key, value in parse_qsl(scope["query_string"].decode("latin-1")) if key == "lease"]
        secret = headers.get(LEASE_SECRET_HEADER)
        if len(leases) != 1 or len(leases[0]) > 80 or secret is None or len(secret) > 128:
            return None
        state: EdgeState = self.app.state.edge
        try:
            manifest, entry = authorize_shard(
                state, parts[3], parts[5], leases[0], secret, headers.get("authorization"), self._check_secret
            )
        except (EdgeError, ProtocolError):
            return None
        if scope["method"] == "GET" and "range" not in headers:
            state.metrics.shard_bytes.inc(entry.size_bytes)
        return [
            (b"x-accel-redirect", accel_path(state.settings.accel_prefix, manifest, entry).encode()),
            (b"etag", f'"sha256:{entry.sha256}"'.encode()),
            (b"cache-control", SHARD_CACHE.encode()),
            (b"content-type", b"application/octet-stream"),
            (b"content-length", b"0"),
        ]

    def _check_secret(self, lease_id: LeaseId, presented: str | None) -> Lease:
        """``LeaseIssuer.check_secret`` with the leases seen before kept in memory."""
        issuer: LeaseIssuer = self.app.state.issuer
        lease = self._leases.get(lease_id)
        if lease is None:
            lease = issuer.check_secret(lease_id, presented)
            self._leases[lease_id] = lease
            if len(self._leases) > self.max_leases:
                self._leases.popitem(last=False)
        elif presented is None or not hmac.compare_digest(issuer.secret(lease_id), presented):
            raise Forbidden("unknown lease or wrong lease secret")
        return lease
