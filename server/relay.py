"""The WebSocket relay and signaling endpoint, ``/v1/relay``, and the viewers' event stream, ``/v1/events``.

Both take handshakes from native clients (no ``Origin`` header), from the edge's own page (an
``Origin`` whose host[:port] is the request's ``Host``) and from origins listed in the edge setting
``allowed_origins`` (``*``: any). Any other browser origin is refused on the handshake, before a
WebSocket exists: HTTP 403 with a JSON body ``{"error": "Forbidden", "detail"}`` saying why.

A connection is accepted, challenged (the edge sends a nonce), then joined once the peer's signed
proof of that nonce verifies: only then is it registered in the hub (``ConnectionState.JOINED``),
until it is closed (``ConnectionState.CLOSED``).

    edge → {"type": "challenge", "nonce", "protocol_version"}
    peer → {"type": "join", "proof": PeerProof(purpose="join", nonce=<nonce>), "token"?: <admission token>}
    edge → {"type": "welcome", "peer_id", "network", "network_signatures", "max_frame_bytes", "mirrors", "ice"}
           ("mirrors": the other edges of this network, the ``mirrors`` setting, for a page to move to;
           "ice": the ICE servers for its WebRTC connections, ``protocol.ice.IceConfig``, with a TURN
           credential of this connection's own, ``server.ice``)
    peer → {"type": "subscribe", "experiment", "topics": [...]}         → {"type": "subscribed"}
    peer → {"type": "lease.request", "experiment", "request_id",        → {"type": "lease", "request_id", "lease", "secret"}
            "after"?: <current head id: the next window's lease>,
            "shards"?: <how many shards, within the experiment's bounds>,
            "cache_bytes"?: <bytes of shards the peer keeps: no home when they hold the split>,
            "work"?: <the lease's proof of work where the experiment asks one: protocol.lease_work>}
    peer → {"type": "signal", "to": <peer id>, "data": {...}}           → relayed as {"type": "signal", "from", "data"}
                                                                          (to nobody here: an error with "to")
    peer → {"type": "have", "experiment", "head_id"}                    no answer (``holders``: current heads only;
                                                                          holders with a record first)
    peer → {"type": "holders", "experiment", "head_id"}                 → {"type": "holders", ..., "peers", "fetching"}
    peer → {"type": "metrics", "experiment", "data": {...}}             → fanned out on topic "metrics"
    peer → {"type": "ice"}                                              → {"type": "ice", **IceConfig}: a new credential
    peer → {"type": "ping"}                                             → {"type": "pong"}
    peer → binary DTN1 envelope of a Candidate                          → {"type": "candidate.ack", "candidate_id"}
           (without artifact bytes: one staged on this edge, ``protocol.uploads``; browser peers
           publish those over HTTP instead, where a balancer finds the stage's edge)
    edge → {"type": "event", "topic", "experiment", "data"}             for subscribed topics

``/v1/events`` needs no join: it streams every public event (the ``event`` messages above) to
read-only viewers, accepts only ``ping``, and closes slow or silent viewers like peers. With admission
on, viewers, and peers whose token may not read leases, get the events as ``hub.public_event`` makes
them: no lease ids, shard ids or principals.

The relay stamps what it forwards with the sender it authenticated (``peer_id`` and ``kind`` of the
join): a ``metrics`` payload cannot speak for another peer. Only trainer kinds may lease; with
admission on, the kind a peer may claim at join comes from its token's role.

A peer that leaves keeps its leases for the edge's ``lease_release_grace_s``; then those it took
over this relay and did not deliver are given back (``leasing``), unless it joined again meanwhile.

Requests the edge refuses (no head yet, a bad candidate) are answered ``{"type": "error", ...}``
and the connection stays. Protocol violations close it with the code from ``errors``; so do a
missed join (4408), silence past the idle timeout (4408), a full send queue (4413), a message rate
over the limit (4429), frames over the size limit (1009, from the WebSocket layer) and, with admission
on, a join token that was revoked or expired (4410, ``errors.CLOSE_REVOKED``): at the connection's
next message, or within ``admission.REVOCATION_CHECK_S`` by ``close_revoked``, whichever comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any
from urllib.parse import urlsplit

import orjson
from fastapi import APIRouter, WebSocket
from starlette.datastructures import Headers
from starlette.websockets import WebSocketDisconnect, WebSocketState

from protocol.envelope import MAX_DESCRIPTOR_BYTES
from protocol.errors import InvalidMessage, ProtocolError
from protocol.fields import opt, read_int, read_list, read_object, read_str
from protocol.ids import ExperimentKey, HeadId, PeerId
from protocol.lease_work import MAX_NONCE
from protocol.leases import MAX_CACHE_BYTES
from protocol.manifests import PROTOCOL_VERSION
from protocol.messages import PeerProof

from .admission import REVOCATION_CHECK_S
from .deps import client_address
from .errors import (
    CLOSE_HEARTBEAT_TIMEOUT,
    CLOSE_REVOKED,
    CLOSE_SLOW_CONSUMER,
    EdgeError,
    Forbidden,
    RateLimited,
    close_code_for,
    status_for,
)
from .holders import Holders
from .hub import NETWORK_SCOPE, TOPICS, Connection, ConnectionState
from .intake import accept_candidate
from .leasing import LeaseIssuer
from .ratelimit import TokenBucket
from .responses import JSON
from .state import EdgeState

router = APIRouter()
log = logging.getLogger(__name__)

MAX_TEXT_BYTES = 64 * 1024
CLOSE_REPLACED = 4000
CLOSE_TIMEOUT_S = 30.0  # a close frame queues behind what the peer has not read yet


class _Close(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


@router.websocket("/v1/relay")
async def relay(websocket: WebSocket) -> None:
    state: EdgeState = websocket.app.state.edge
    issuer: LeaseIssuer = websocket.app.state.issuer
    await _session(
        websocket,
        state,
        lambda: _join(websocket, state),
        lambda peer: _peer_handler(state, issuer, peer, client_address(websocket)),
        issuer.holder_left,
    )


@router.websocket("/v1/events")
async def events(websocket: WebSocket) -> None:
    """Read-only live events for viewers: every public topic of every experiment, no identity needed
    (heads, verdicts, candidates, leases, metrics and peers are public over HTTP anyway; with admission
    on, without what only validators may read: ``hub.public_event``)."""
    state: EdgeState = websocket.app.state.edge

    async def viewer() -> Connection:
        return state.hub.add_viewer(redacted=state.admission.required)

    await _session(websocket, state, viewer, _viewer_handler)


async def _session(
    websocket: WebSocket,
    state: EdgeState,
    open_connection: Callable[[], Awaitable[Connection]],
    handler_for: Callable[[Connection], Handler],
    left: Callable[[Connection], None] = lambda _: None,
) -> None:
    """One WebSocket from accept to close: register, send and receive, close with the right code,
    then tell ``left``. A handshake from a browser origin the edge does not allow is refused before it
    is accepted."""
    if not _origin_allowed(websocket.headers, state.settings.allowed_origins):
        origin = websocket.headers["origin"]
        refusal = Forbidden(f"origin {origin} may not open this WebSocket (see the edge setting allowed_origins)")
        log.info("refusing a WebSocket handshake to %s: %s", websocket.url.path, refusal)
        body = {"error": type(refusal).__name__, "detail": str(refusal)}
        await websocket.send_denial_response(JSON(body, status_code=status_for(refusal)))
        return
    await websocket.accept()
    connection: Connection | None = None
    sender: asyncio.Task[None] | None = None
    try:
        connection = await open_connection()
        sender = asyncio.create_task(_drain(websocket, connection))
        await _serve(websocket, state, connection, sender, handler_for(connection))
    except _Close as close:
        await _stop(sender)
        await _close(websocket, state, close.code, close.reason)
    except WebSocketDisconnect as gone:
        state.metrics.closes.labels(str(gone.code)).inc()
    finally:
        await _stop(sender)
        if connection is not None:
            state.hub.unregister(connection)
            left(connection)


def _origin_allowed(headers: Headers, allowed_origins: str) -> bool:
    """Whether a handshake with these headers may open a WebSocket: no ``Origin`` (a native client),
    the edge's own page (the origin's host[:port] is the ``Host`` header) or an origin listed in
    ``allowed_origins`` (comma-separated; ``*``: any)."""
    origin = headers.get("origin")
    if origin is None:
        return True
    listed = {entry.strip().rstrip("/").lower() for entry in allowed_origins.split(",") if entry.strip()}
    own = headers.get("host", "").lower()
    same_origin = own != "" and urlsplit(origin).netloc.lower() == own
    return same_origin or "*" in listed or origin.lower() in listed


async def _stop(sender: asyncio.Task[None] | None) -> None:
    """Stop the sending task and collect how it ended: a send that already failed (the peer left
    mid-frame) is an ordinary end of a connection, not an error left for the event loop to report."""
    if sender is not None:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sender


async def _close(websocket: WebSocket, state: EdgeState, code: int, reason: str) -> None:
    state.metrics.closes.labels(str(code)).inc()
    if websocket.client_state is WebSocketState.CONNECTED:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(websocket.close(code, reason[:120]), CLOSE_TIMEOUT_S)


async def _join(websocket: WebSocket, state: EdgeState) -> Connection:
    nonce = secrets.token_urlsafe(24)
    await websocket.send_text(
        orjson.dumps({"type": "challenge", "nonce": nonce, "protocol_version": PROTOCOL_VERSION}).decode()
    )
    try:
        message = await asyncio.wait_for(websocket.receive(), state.settings.join_timeout_s)
    except TimeoutError:
        raise _Close(CLOSE_HEARTBEAT_TIMEOUT, "join timeout") from None
    try:
        data = _decode(message)
        if data.get("type") != "join":
            raise InvalidMessage("expected a join message")
        proof = PeerProof.from_wire(data.get("proof"))
        if proof.purpose != "join" or proof.nonce != nonce:
            raise InvalidMessage("join proof must sign this connection's challenge nonce")
        state.address_limits.check(client_address(websocket))  # before the signature
        proof.verify_own()
        token = data.get("token")
        admitted = token if isinstance(token, str) else None
        state.admission.check(admitted, "join", kind=proof.peer_kind, peer_id=proof.peer_id)
    except (ProtocolError, EdgeError) as exc:
        raise _Close(close_code_for(exc), str(exc)) from None
    connection = state.hub.register(proof.peer_id, proof.peer_kind)
    connection.token = token if isinstance(token, str) else None
    connection.redacted = state.admission.required and not state.admission.allows(connection.token, "read_leases")
    state.store.saw_peer(proof.peer_id, proof.peer_kind, state.clock.now_ms())
    welcome = {
        "type": "welcome",
        "peer_id": proof.peer_id,
        "network": state.network.to_wire(),
        "network_signatures": [s.to_wire() for s in state.network_signatures()],  # what a page's pins check
        # the largest candidate frame it takes: a frame, and an envelope with its artifact inline
        "max_frame_bytes": min(state.settings.max_frame_bytes, state.settings.max_inline_bytes + MAX_DESCRIPTOR_BYTES),
        "mirrors": state.settings.mirror_urls,
        "ice": state.ice.issue(proof.peer_id, state.clock).to_wire(),
    }
    connection.offer(orjson.dumps(welcome).decode())
    state.hub.publish(NETWORK_SCOPE, "peers", {"peer_id": proof.peer_id, "kind": proof.peer_kind, "joined": True})
    return connection


def _decode(message: Any) -> dict[str, Any]:
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    text = message.get("text")
    if text is None:
        raise InvalidMessage("expected a text frame")
    if len(text) > MAX_TEXT_BYTES:
        raise InvalidMessage(f"text frames are limited to {MAX_TEXT_BYTES} bytes")
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise InvalidMessage("text frame is not JSON") from None
    return dict(read_object(data))


async def _drain(websocket: WebSocket, connection: Connection) -> None:
    while True:
        item = await connection.queue.get()
        if isinstance(item, bytes):
            await websocket.send_bytes(item)
        else:
            await websocket.send_text(item)


Handler = Callable[[dict[str, Any]], Awaitable[None]]


async def _serve(
    websocket: WebSocket, state: EdgeState, connection: Connection, sender: asyncio.Task[None], handle: Handler
) -> None:
    """Receive until the peer leaves or breaks a rule; ``handle`` gets each message within the rate."""
    bucket = TokenBucket(state.settings.messages_per_s, 4 * state.settings.messages_per_s)
    overflow = asyncio.create_task(connection.overflowed.wait())
    try:
        while True:
            receive = asyncio.create_task(websocket.receive())
            done, _ = await asyncio.wait(
                {receive, overflow, sender}, timeout=state.settings.idle_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if receive not in done:
                receive.cancel()
                if overflow in done:
                    raise _Close(*_overflow_close(connection))
                if sender in done:
                    raise WebSocketDisconnect(1006)
                raise _Close(CLOSE_HEARTBEAT_TIMEOUT, "idle timeout")
            message = receive.result()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            if not bucket.take():
                raise _Close(close_code_for(RateLimited()), "message rate limit exceeded")
            await handle(message)
    finally:
        overflow.cancel()


def _overflow_close(connection: Connection) -> tuple[int, str]:
    """Why a connection whose sending stopped is closed: revoked, replaced, or a slow consumer."""
    if connection.revoked:
        return CLOSE_REVOKED, "admission token revoked or expired"
    if connection.state is ConnectionState.CLOSED:
        return CLOSE_REPLACED, "replaced by a newer session"
    return CLOSE_SLOW_CONSUMER, "slow consumer"


async def close_revoked(state: EdgeState) -> None:
    """Forever, every ``REVOCATION_CHECK_S``: close this edge's relay connections whose admission token
    was revoked or has expired (each token looked up once per sweep, off the event loop)."""
    while True:
        await asyncio.sleep(REVOCATION_CHECK_S)
        tokens = {c.token for c in state.hub.connections.values() if c.token is not None}
        try:
            revoked = await state.offload(_revoked, state, tokens)
        except EdgeError as exc:  # the shared store is unreachable for now: the next sweep tries again
            log.warning("could not check the relay's admission tokens: %s", exc)
            continue
        for connection in list(state.hub.connections.values()):
            if connection.token in revoked:
                connection.revoke()


def _revoked(state: EdgeState, tokens: set[str]) -> set[str]:
    return {token for token in tokens if state.admission.revoked(token)}


def _peer_handler(state: EdgeState, issuer: LeaseIssuer, connection: Connection, address: str) -> Handler:
    async def handle(message: dict[str, Any]) -> None:
        if state.admission.revoked(connection.token):
            connection.revoke()
            raise _Close(*_overflow_close(connection))
        try:
            if message.get("bytes") is not None:
                state.admission.check(connection.token, "candidate")
                candidate, _ = await accept_candidate(
                    state, message["bytes"], via="ws", address=address, token=connection.token
                )
                connection.offer(
                    orjson.dumps({"type": "candidate.ack", "candidate_id": candidate.candidate_id}).decode()
                )
            else:
                await _dispatch(state, issuer, connection, address, _decode(message))
        except EdgeError as exc:
            connection.offer(_error(exc))
        except ProtocolError as exc:
            if message.get("bytes") is not None:
                connection.offer(_error(exc))
            else:
                raise _Close(close_code_for(exc), str(exc)) from None

    return handle


def _viewer_handler(connection: Connection) -> Handler:
    async def handle(message: dict[str, Any]) -> None:
        try:
            kind = _decode(message).get("type")
        except ProtocolError as exc:
            raise _Close(close_code_for(exc), str(exc)) from None
        if kind != "ping":
            raise _Close(4400, "the event stream is read-only: only pings are accepted")
        connection.offer('{"type":"pong"}')

    return handle


def _error(exc: Exception) -> str:
    return orjson.dumps(
        {"type": "error", "status": status_for(exc), "error": type(exc).__name__, "detail": str(exc)}
    ).decode()


async def _dispatch(
    state: EdgeState, issuer: LeaseIssuer, connection: Connection, address: str, data: dict[str, Any]
) -> None:
    kind = data.get("type")
    if kind == "ping":
        connection.offer('{"type":"pong"}')
    elif kind == "ice":
        connection.offer(
            orjson.dumps({"type": "ice", **state.ice.issue(connection.peer_id, state.clock).to_wire()}).decode()
        )
    elif kind == "subscribe":
        experiment = data.get("experiment")
        key = NETWORK_SCOPE if experiment == NETWORK_SCOPE else ExperimentKey.parse(experiment)
        topics = read_list(data, "topics", lambda t: t if t in TOPICS else _bad_topic(t), max_len=len(TOPICS))
        if key != NETWORK_SCOPE:
            state.experiment(key)
        state.hub.subscribe(connection, key, topics)  # type: ignore[arg-type]
        connection.offer(orjson.dumps({"type": "subscribed", "experiment": str(key), "topics": topics}).decode())
    elif kind == "lease.request":
        state.admission.check(connection.token, "lease")
        key = ExperimentKey.parse(data.get("experiment"))
        after = opt(data, "after", lambda m, k: HeadId(read_str(m, k, max_len=80)))
        shards = opt(data, "shards", lambda m, k: read_int(m, k, low=1, high=256))
        cache_bytes = opt(data, "cache_bytes", lambda m, k: read_int(m, k, low=0, high=MAX_CACHE_BYTES))
        work = opt(data, "work", lambda m, k: read_int(m, k, low=0, high=MAX_NONCE))
        grant = await issuer.grant(
            key,
            PeerId(connection.peer_id),
            connection.kind,
            state.admission.principal(connection.token),
            address=address,
            after=after,
            shards=shards,
            cache_bytes=cache_bytes,
            work=work,
        )
        connection.leased(str(key), grant.lease.lease_id)
        connection.offer(
            orjson.dumps({"type": "lease", "request_id": data.get("request_id"), **grant.to_wire()}).decode()
        )
    elif kind == "signal":
        target = PeerId(data.get("to"))
        payload = read_object(data.get("data"), "signal data")
        if not await state.hub.send_to(target, {"type": "signal", "from": connection.peer_id, "data": payload}):
            gone = {"type": "error", "status": 404, "detail": f"{target} not here", "to": target}
            connection.offer(orjson.dumps(gone).decode())
    elif kind in ("have", "holders"):
        key = ExperimentKey.parse(data.get("experiment"))
        state.experiment(key)
        head_id = HeadId(data.get("head_id"))
        current = state.store.current_head(key)
        is_current = current is not None and current.head_id == head_id  # any other head: ignored
        if kind == "have" and is_current:
            recorded = (
                state.admission.principal(connection.token) is not None
                or state.credit.standing(key, PeerId(connection.peer_id)).recorded
            )
            state.holders.announce(key, head_id, connection.peer_id, recorded=recorded)
        elif kind == "holders":
            joined = state.hub.connections.__contains__
            holders = state.holders.ask(key, head_id, connection.peer_id, joined) if is_current else Holders([])
            answer = {"type": "holders", "experiment": key, "head_id": head_id, **asdict(holders)}
            connection.offer(orjson.dumps(answer).decode())
    elif kind == "metrics":
        key = ExperimentKey.parse(data.get("experiment"))
        payload = read_object(data.get("data"), "metrics data")
        # the relay names the sender it authenticated; a payload cannot claim another peer or kind
        state.hub.publish(key, "metrics", {**payload, "peer_id": connection.peer_id, "kind": connection.kind})
    else:
        raise InvalidMessage(f"unknown message type {read_str(data, 'type', max_len=32)!r}")


def _bad_topic(topic: object) -> str:
    raise InvalidMessage(f"unknown topic {topic!r}; topics: {sorted(TOPICS)}")
