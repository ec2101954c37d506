"""``BrowserPeer``: a training peer built for a browser tab, pure Python + NumPy over a ``Bridge``.

A session: open the relay WebSocket, sign the edge's challenge with the tab's key, subscribe to
the experiment's heads and verdicts. A window follows ``protocol.window``, the routine native
trainers run too: read the current head over HTTP (``head_to_train``: signed by a validator, not
trained on yet), ask for a lease over the WebSocket (``check_lease``: edge-signed, for this head,
this peer and experiment), download the head artifact and the leased shards it does not hold (each
verified against its content id / the fetch-manifest's sha256; shards are kept by content across
windows and page loads, ``shard_store``; a head whose parent it holds comes as a delta from it,
``protocol.head_delta``), train one window with Adam in NumPy in
``epoch_seed`` order (optimizer state stays in the tab), sign the candidate and send it as a binary
frame (``package_candidate``), then lease the next window ahead and train it from where this one stopped
while this one is judged (``_train_ahead``; moved onto the head when it arrives). After
``protocol.evidence.AHEAD_CHAIN`` windows in a row trained ahead, where validators measure its lease
evidence, the next lease is held and trained from its head instead (``restarts_from_head``, as native
trainers do). A candidate larger than the relay's
frame limit is staged over HTTP in chunks first and published over HTTP too, by its envelope without
the artifact: the edge that took the chunks (the one a balancer sends the stage's requests to) need
not be the relay's. A head larger than ``PeerConfig.piece_bytes`` is downloaded piece by piece with
``Range``, so that a broken transfer costs one piece, asked again. HTTP goes through
``session.EdgeSession``, which drives the plans of ``protocol.transfers`` for both (the native
client's too). If the socket drops (edge restart), reconnect with ``protocol.backoff`` and carry on.
Timestamps come from an injectable ``protocol.clock.Clock``. Progress goes to the page through
``bridge.post_status``, with what contributing costs (``costs.Costs``).

Heads from peers, where the host reaches them (``bridge.shares_heads``: a page with WebRTC): the peer
asks the edge which peers announced the head (``holders``), takes it from one of them through the
bridge, checks it against the head's content id like any download, and on a mismatch drops that
peer for good and downloads the head from the edge. A head it holds, it announces (``have``) and
the page serves it. Signaling for those connections goes through this peer's relay WebSocket, and so
do the ICE servers the edge names (``protocol.ice``: the welcome's, checked, renewed at half the TURN
credential's life), which the page's connections use.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from protocol.backoff import Backoff
from protocol.clock import SYSTEM_CLOCK, Clock
from protocol.codec import decode_tensors
from protocol.edge_urls import edge_urls
from protocol.envelope import unpack_envelope
from protocol.errors import IntegrityError, ProtocolError
from protocol.evidence import restarts_from_head
from protocol.hashing import verify_content
from protocol.head_delta import apply_delta
from protocol.ice import NO_ICE, IceConfig
from protocol.ids import ExperimentKey, HeadId, ShardId
from protocol.lease_size import next_lease_shards
from protocol.lease_work import lease_work
from protocol.manifests import MAX_VALIDATORS, ExperimentSpec, FetchManifest, NetworkManifest
from protocol.messages import LEASE_SECRET_HEADER, HeadDescriptor, LeaseGrant, PeerProof
from protocol.model import ModelSpec, Params
from protocol.network_pins import NetworkSignature, fingerprint, pin_problem, signed_by
from protocol.screening import PRESETS
from protocol.shards import decode_shard_stored, feature_scale, verify_shard
from protocol.signing import PureSigner, peer_id_from_public_key
from protocol.updates import encode_update
from protocol.uploads import UPLOAD_CHUNK_BYTES
from protocol.window import (
    NoWindow,
    carried_onto,
    check_lease,
    epoch_seed,
    head_to_train,
    lease_window,
    package_candidate,
)

from .bridge import Bridge, PeerBytes, Socket, SocketClosed
from .costs import Costs
from .guest import Guest
from .numpy_trainer import Adam, Backend, fastest_backend
from .parts import PartPace, PartResult, PartTask, average, merged_optimizer, split, train
from .progress import Progress, storage_key
from .session import EdgeSession, HttpError
from .shard_store import ShardStore

__all__ = ["BrowserPeer", "PeerConfig"]

STATUS_EVERY_S = 0.25  # training progress to the page at most this often (each post is a copy and a repaint)
HEARTBEAT_S = 30.0  # well inside the edge's idle timeout (90 s by default)
HOLDER_ASKS, HOLDER_WAIT_S = 5, 0.5  # waiting for a peer that fetches the head from the edge: 2 s at most
SHARD_CACHE_BYTES = 128 << 20  # all 37 of MNIST's training shards (28 MiB) fit, several times over


class Halted(NoWindow):
    """The experiment is paused or stopped by run control: no lease now; asked again on the same head."""


@dataclass(frozen=True)
class _Trained:
    """A lease trained from ``origin`` to ``params`` (``steps`` optimizer steps in ``seconds``)."""

    grant: LeaseGrant
    origin: dict[str, np.ndarray]
    params: dict[str, np.ndarray]
    steps: int
    loss: float
    seconds: float
    workers: int


@dataclass(frozen=True)
class PeerConfig:
    edge_url: str
    experiment: str
    seed: bytes
    max_windows: int | None = None
    reconnect_max_s: float = 15.0
    token: str | None = None  # admission token, for networks that require one
    piece_bytes: int = UPLOAD_CHUNK_BYTES  # heads larger than this come in Range pieces of this size
    train_ahead: bool = True  # lease and train the next window while the last is judged (``_train_ahead``)
    shard_cache_bytes: int = SHARD_CACHE_BYTES  # shards kept for later leases and page loads (``shard_store``)
    head_deltas: bool = True  # a head whose parent the peer holds comes as a delta (``_from_delta``)
    pins: tuple[str, ...] = ()  # validators (keys or fingerprints) the page was told to trust (``#validators=``)


class BrowserPeer:
    peer_kind = "browser"

    def __init__(
        self, bridge: Bridge, config: PeerConfig, *, clock: Clock = SYSTEM_CLOCK, backend: Backend | None = None
    ) -> None:
        self.bridge = bridge
        self.config = config
        self.clock = clock
        self.key = ExperimentKey.parse(config.experiment)
        self.signer = PureSigner(config.seed)
        self.peer_id = peer_id_from_public_key(self.signer.public_key)
        self.running = True
        self.status: dict[str, Any] = {
            "peer_id": self.peer_id,
            "experiment": self.key,
            "phase": "starting",
            "windows_done": 0,
            "samples_per_s": 0.0,
            "accepted": 0,
            "rejected": 0,
            "last_verdict": None,
            "head_window": None,
            "connected": False,
            "paused": None,
            "cpu_share": 1.0,
            "downloaded_bytes": 0,  # heads, shards and manifests over HTTP, and heads from peers
            "sent_bytes": 0,  # signed candidates over the relay, or staged and published over HTTP
            "head_edge_bytes": 0,  # head artifacts from the edge (also in downloaded_bytes)
            "head_peer_bytes": 0,  # head artifacts from other peers, verified (also in downloaded_bytes)
            "peers_dropped": [],  # peers that sent a head's bytes wrong, never asked again
            "head_delta_bytes": 0,  # heads as deltas from the edge (also in downloaded_bytes)
            "shard_downloads": 0,  # leased shards downloaded
            "shard_cache_hits": 0,  # leased shards read back from the shard store, verified
        }
        self.costs = Costs(clock.monotonic_s())
        self.status.update(self.costs.status(clock.monotonic_s()))
        self.http = EdgeSession(
            bridge,
            config.edge_url,
            config.token,
            piece_bytes=config.piece_bytes,
            counted=self._count,
            retrying=lambda reason: self._report(phase=f"retrying after {reason}"),
        )
        self.guest = Guest()
        self.backend = backend or fastest_backend()
        self.status["compute"] = self.backend.name
        self._optimizer: Adam | None = None
        self._pace = PartPace()  # how to split a window over the page's workers
        self._residual: Params | None = None  # what the experiment's lossy codec dropped last window
        self._manifest: FetchManifest | None = None
        self._network: NetworkManifest | None = None
        self._max_frame_bytes = 0  # the relay's, from its welcome
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._head_changed = asyncio.Event()
        self._announced: HeadDescriptor | None = None  # the newest head the relay's heads events carried
        self._last_base: HeadId | None = None
        # the next window's lease, granted before its head existed: trained from this peer's last candidate,
        # or held to train from its head (``restarts_from_head``)
        self._ahead: _Trained | LeaseGrant | None = None
        self._chain = 0  # windows in a row trained ahead from this peer's own last candidate
        self._restored = False
        self._dropped: set[str] = set()
        self._shards = ShardStore(bridge, config.shard_cache_bytes)
        self._held: tuple[HeadId, bytes] | None = None  # the last head's artifact: the next one's delta base
        self._ice_renewal: float | None = None  # when to ask the edge for new TURN credentials (monotonic s)
        self._lease_shards: int | None = None  # what the next lease asks for (None: the experiment's default)
        self._calm = 0  # windows in a row sized without a wait (``next_lease_shards``)
        self._sized: tuple[float, float] | None = None  # training and waiting seconds (``Costs``) at the last sizing

    # -- status ----------------------------------------------------------------------------
    def _report(self, **changes: Any) -> None:
        self.status.update(changes)
        self.status.update(self.costs.status(self.clock.monotonic_s()))
        self.bridge.post_status(dict(self.status))

    def _count(self, received: int, sent: int) -> None:
        self.status["downloaded_bytes"] += received
        self.status["sent_bytes"] += sent

    def stop(self) -> None:
        self.running = False
        self._head_changed.set()
        self.guest.resume()
        self._report(phase="stopping")

    def pause(self, reason: str) -> None:
        """Stop training at the next batch (and lease nothing) until ``resume`` (``browser_peer.guest``)."""
        self.guest.pause(reason)
        self._report(phase=f"paused: {reason}", paused=reason)

    def resume(self) -> None:
        if self.guest.reason is not None:
            self.guest.resume()
            self._report(phase="resuming", paused=None)

    def set_share(self, share: float) -> None:
        self.guest.set_share(share)
        self._report(cpu_share=self.guest.share)

    # -- sessions --------------------------------------------------------------------------
    async def run(self) -> None:
        """Contribute until ``stop()`` (or ``max_windows``), reconnecting when the edge goes away; what
        else ends it is reported (the page shows it) and raised."""
        backoff = Backoff(initial_s=0.5, max_s=self.config.reconnect_max_s)
        while self.running:
            try:
                await self._session()
                backoff.reset()
            except (SocketClosed, HttpError, ProtocolError, OSError, ConnectionError) as exc:
                delay_s = backoff.next_delay_s()
                self._report(phase=f"reconnecting in {delay_s:.1f} s ({exc})", connected=False)
                await asyncio.sleep(delay_s)
            except Exception as exc:
                self.running = False
                self._report(phase=f"error: stopped by {type(exc).__name__}: {exc}", connected=False)
                raise
        self._report(phase="stopped", connected=False)

    async def _session(self) -> None:
        socket = await self.bridge.connect(self.config.edge_url.replace("http", "ws", 1) + "/v1/relay")
        reader: asyncio.Task[None] | None = None
        heartbeat: asyncio.Task[None] | None = None
        signals: asyncio.Task[None] | None = None
        try:
            challenge = json.loads(await socket.recv())
            proof = PeerProof("join", self.signer.public_key, self.peer_kind, challenge["nonce"], self.clock.now_ms())
            join = {"type": "join", "proof": proof.signed(self.signer).to_wire(), "token": self.config.token}
            await socket.send_text(json.dumps(join))
            welcome = json.loads(await socket.recv())
            if welcome.get("type") != "welcome":
                raise SocketClosed(4400, f"unexpected {welcome.get('type')}")
            self._network = NetworkManifest.from_wire(welcome["network"])
            if not self._trusts(self._network, welcome.get("network_signatures")):
                self.running = False
                return
            self._max_frame_bytes = int(welcome["max_frame_bytes"])
            self._report(mirrors=edge_urls(welcome.get("mirrors") or []))  # the other edges, for the page
            if self.bridge.shares_heads:
                self._use_ice(welcome.get("ice", NO_ICE.to_wire()))
            if self.key not in {s.key for s in self._network.experiments}:
                self.running = False
                self._report(phase=f"error: this network runs no experiment {self.key}")
                return
            spec = self._network.experiment(self.key)
            refusal = spec.refusal(self.peer_kind)
            if refusal is not None:  # a native-only experiment: the edge would refuse the lease too
                self.running = False
                self._report(phase=f"error: {refusal}")
                return
            await self._restore(spec)
            await socket.send_text(
                json.dumps({"type": "subscribe", "experiment": self.key, "topics": ["heads", "verdicts"]})
            )
            self._report(phase="joined", connected=True)
            self._inbox, self._announced = asyncio.Queue(), None  # no answer or head of an earlier session
            reader = asyncio.ensure_future(self._read(socket))
            heartbeat = asyncio.ensure_future(self._heartbeat(socket))
            if self.bridge.shares_heads:
                signals = asyncio.ensure_future(self._relay_signals(socket))
            while self.running and (
                self.config.max_windows is None or self.status["windows_done"] < self.config.max_windows
            ):
                try:
                    await self._window(socket, spec, reader)
                except NoWindow as reason:
                    self._report(phase=f"waiting: {reason}")
                    await self._wait_for_head(5.0, reader)
            if self.config.max_windows is not None and self.status["windows_done"] >= self.config.max_windows:
                self.running = False
        finally:
            for task in (reader, heartbeat, signals):
                if task is not None:
                    task.cancel()
            await socket.close()

    def _trusts(self, network: NetworkManifest, signatures: object) -> bool:
        """Whether this peer may train for ``network`` as the edge's welcome served it, with the
        validators' ``signatures`` of its terms (``protocol.network_pins``): reported with the
        validators' fingerprints, and which of them signed, for the page to show."""
        parsed = []
        for wire in signatures[:MAX_VALIDATORS] if isinstance(signatures, list) else []:
            try:
                parsed.append(NetworkSignature.from_wire(wire))
            except ProtocolError:  # a malformed one counts as none
                continue
        signed = signed_by(network, parsed)
        self._report(
            validators=[fingerprint(k) for k in network.validator_keys],
            signed=[fingerprint(k) for k in network.validator_keys if k in signed],
            quorum=network.quorum,
            pinned=list(self.config.pins),
        )
        problem = pin_problem(network, self.config.pins, signed)
        if problem is not None:
            self._report(phase=f"error: refusing this edge: it serves {problem}", connected=False)
        return problem is None

    async def _restore(self, spec: ExperimentSpec) -> None:
        """Once per page load: the optimizer, residual and progress a previous load saved (``progress``),
        and the shards it kept (``shard_store``)."""
        if self._restored:
            return
        self._restored = True
        await self._shards.open()
        saved = await self.bridge.load(storage_key(self.key))
        progress = None if saved is None else Progress.decode(saved, self.key, spec.model, spec.learning_rate)
        if progress is not None:
            self._optimizer, self._residual, self._last_base = progress.optimizer, progress.residual, progress.last_base
            self._report(windows_done=progress.windows_done, resumed_steps=progress.optimizer.count)

    async def _part(self, index: int, payload: bytes, model: ModelSpec, learning_rate: float) -> PartResult | None:
        """Part ``index`` of a window, trained by another worker; None (left out of the averages) if that
        worker fails."""
        try:
            return PartResult.decode(await self.bridge.train_part(index, payload), model, learning_rate)
        except Exception as exc:  # a crashed or stopped worker costs its part, not the window
            self._report(phase=f"worker {index} failed ({exc}); its part is left out")
            return None

    async def _heartbeat(self, socket: Socket) -> None:
        """A ping every ``HEARTBEAT_S``; and a new ICE configuration asked for once half the lifetime
        of the TURN credential this page holds has passed."""
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            await socket.send_text('{"type":"ping"}')
            if self._ice_renewal is not None and self.clock.monotonic_s() >= self._ice_renewal:
                self._ice_renewal = None  # until the answer
                await socket.send_text('{"type":"ice"}')

    def _use_ice(self, wire: object) -> None:
        """The ICE servers the edge gave (welcome, or a renewal) to the page; none if they are malformed."""
        try:
            ice = IceConfig.from_wire(wire)
        except ProtocolError as exc:
            ice = NO_ICE
            self._report(phase=f"ignoring the edge's ICE servers: {exc}")
        self._ice_renewal = None if ice.valid_s is None else self.clock.monotonic_s() + ice.valid_s / 2
        self.bridge.use_ice(ice)
        self._report(ice_servers=ice.urls, ice_relay_only=ice.relay_only)

    async def _relay_signals(self, socket: Socket) -> None:
        """The page's signaling for its WebRTC connections, out through this session's socket."""
        while True:
            peer_id, data = await self.bridge.signal_out()
            try:
                await socket.send_text(json.dumps({"type": "signal", "to": peer_id, "data": data}))
            except SocketClosed:
                return  # the reader sees the socket close and ends the session

    async def _read(self, socket: Socket) -> None:
        while True:
            message = json.loads(await socket.recv())
            if message.get("type") == "signal":
                self.bridge.signal_in(message["from"], message["data"])
            elif message.get("type") == "error" and "to" in message:  # a signal the edge could not deliver
                self.bridge.signal_in(message["to"], {"kind": "unreachable"})
            elif message.get("type") == "ice" and self.bridge.shares_heads:
                self._use_ice(message)
            elif message.get("type") == "event" and message.get("topic") == "heads":
                self._announce(message["data"])
            elif message.get("type") == "event" and message.get("topic") == "verdicts":
                verdict = message["data"]
                if verdict["peer_id"] == self.peer_id:
                    field = "accepted" if verdict["accepted"] else "rejected"
                    self._report(
                        **{field: self.status[field] + 1},
                        last_verdict={"accepted": verdict["accepted"], "reason": verdict["reason"]},
                    )
            elif message.get("type") != "pong":
                await self._inbox.put(message)

    def _announce(self, wire: object) -> None:
        """A heads event: the head it carries is kept for the next window (checked there, as a head the
        edge serves is), the newest when several come."""
        try:
            head = HeadDescriptor.from_wire(wire)
        except ProtocolError:  # what the protocol's readers raise for any malformed head
            return  # the next window asks the edge for its head
        if self._announced is None or head.window > self._announced.window:
            self._announced = head
        self._head_changed.set()
        self._report(head_window=head.window)

    async def _reply(self, reader: asyncio.Task[None], *types: str) -> dict[str, Any]:
        getter = asyncio.ensure_future(self._inbox.get())
        done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
        if getter not in done:
            getter.cancel()
            reader.result()  # re-raises SocketClosed
            raise SocketClosed(1006, "reader stopped")
        message = getter.result()
        if message.get("type") == "error":
            if message.get("error") == "Halted":  # paused or stopped by run control (server.errors.Halted)
                raise Halted(message.get("detail", "halted"))
            if message.get("status") in (404, 409):  # no head yet; every shard of the window leased
                raise NoWindow(message.get("detail", "not found"))
            raise SocketClosed(4400, f"edge refused: {message.get('detail')}")
        if message.get("type") not in types:
            return await self._reply(reader, *types)
        return message

    async def _wait_for_head(self, timeout_s: float, reader: asyncio.Task[None]) -> None:
        self._head_changed.clear()
        waiter = asyncio.ensure_future(self._head_changed.wait())
        done, _ = await asyncio.wait({waiter, reader}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if reader in done:
            reader.result()

    # -- one window ------------------------------------------------------------------------
    async def _head_artifact(
        self, socket: Socket, reader: asyncio.Task[None], head: HeadDescriptor, max_bytes: int
    ) -> bytes:
        """The head's artifact, verified by content id: from a peer that announced it where the host
        reaches peers, else (none could, or one lied) from the edge: as a delta from the last head when
        that is its parent, else whole. A held head is announced."""
        artifact = None
        if self.bridge.shares_heads:
            holders = await self._holders(socket, reader, head.head_id)
            sent = await self.bridge.fetch_head(head.head_id, holders, max_bytes) if holders else None
            artifact = None if sent is None else self._checked(sent, head.head_id)
        if artifact is None:
            artifact = await self._from_delta(head, max_bytes)
        if artifact is None:
            artifact = await self.http.download(head.head_id, max_bytes)
            self._report(head_edge_bytes=self.status["head_edge_bytes"] + len(artifact))
        self._held = (head.head_id, artifact)
        if self.bridge.shares_heads:
            self.bridge.keep_head(head.head_id, artifact)
            await socket.send_text(json.dumps({"type": "have", "experiment": self.key, "head_id": head.head_id}))
        return artifact

    async def _from_delta(self, head: HeadDescriptor, max_bytes: int) -> bytes | None:
        """``head``'s artifact rebuilt from the last head's and the edge's delta, when the last head is its
        parent; None when it is not, the edge serves no delta, or the delta does not rebuild the head."""
        if not self.config.head_deltas or self._held is None or head.parent != self._held[0]:
            return None
        base_id, base = self._held
        delta = await self.http.head_delta(self.key, head.head_id, base_id, max_bytes)
        if delta is None:
            return None
        try:
            artifact = apply_delta(base, base_id, delta, head.head_id)
        except ProtocolError as exc:
            self._report(phase=f"head {head.window}: its delta is unusable ({exc}); downloading the head")
            return None
        self._report(head_delta_bytes=self.status["head_delta_bytes"] + len(delta))
        return artifact

    async def _holders(self, socket: Socket, reader: asyncio.Task[None], head_id: HeadId) -> list[str]:
        """Peers the edge says hold ``head_id`` (none dropped); while another peer is fetching it from
        the edge (``fetching``), wait for it to announce the head a few times before giving up."""
        for attempt in range(HOLDER_ASKS):
            await socket.send_text(json.dumps({"type": "holders", "experiment": self.key, "head_id": head_id}))
            answer = await self._reply(reader, "holders")
            holders = [p for p in answer["peers"] if p not in self._dropped]
            if holders or not answer.get("fetching") or attempt == HOLDER_ASKS - 1:
                return holders
            await asyncio.sleep(HOLDER_WAIT_S)
        return []

    def _checked(self, sent: PeerBytes, head_id: HeadId) -> bytes | None:
        """``sent.data`` if it is ``head_id``'s artifact; else drop the peer that sent it and say so."""
        try:
            verify_content(sent.data, head_id)
        except IntegrityError as exc:
            self._dropped.add(sent.peer_id)
            self.bridge.drop_peer(sent.peer_id, str(exc))
            self._report(peers_dropped=sorted(self._dropped), phase=f"dropped peer {sent.peer_id}: {exc}")
            return None
        self.status["downloaded_bytes"] += len(sent.data)
        self._report(head_peer_bytes=self.status["head_peer_bytes"] + len(sent.data))
        return sent.data

    async def _window(self, socket: Socket, spec: ExperimentSpec, reader: asyncio.Task[None]) -> None:
        assert self._network is not None
        if self.guest.reason is not None:  # a paused tab asks for no lease
            self._report(phase=f"paused: {self.guest.reason}")
            paused = self.clock.monotonic_s()
            await self.guest.admit()
            self.costs.paused(self.clock.monotonic_s() - paused)
        announced, self._announced = self._announced, None
        if announced is None or announced.parent != self._last_base:  # not the head after the last trained on
            announced = await self.http.current_head(self.key)
        head = head_to_train(announced, self._network, self._last_base)
        model = spec.model  # as the network's manifest declares it
        ahead, self._ahead = self._ahead, None
        held = ahead.grant if isinstance(ahead, _Trained) else ahead
        if held is not None and lease_window(held.lease, head):  # leased before this head existed
            grant = held
            self._report(phase=f"downloading head {head.window}", head_window=head.window)
            base = await self._base(socket, reader, head, model)
            if isinstance(ahead, _Trained) and self.status.get("last_candidate") in head.merged:
                done = replace(
                    ahead, params=carried_onto(head, base, ahead.params, ahead.origin, self.status["last_candidate"])
                )
                self._chain += 1
            else:  # held for its head, or trained on from a candidate the network turned down: from the head
                done = await self._train(spec, head.window, grant, base)
                self._chain = 0
        else:
            self._chain = 0
            self._report(phase=f"leasing shards for window {head.window}", head_window=head.window)
            try:
                grant = await self._lease(socket, reader, spec, head)
            except Halted:
                raise  # ask again on this head: resumed, the experiment goes on from it
            except NoWindow:
                self._last_base = head.head_id  # every shard of this window is leased: wait for the next head
                raise
            check_lease(grant.lease, head, peer_id=self.peer_id, edge_key=self._network.edge_key)
            self._report(phase=f"downloading head and {len(grant.lease.shard_ids)} leased shards")
            base = await self._base(socket, reader, head, model)
            done = await self._train(spec, head.window, grant, base)
        lease = grant.lease
        examples = done.steps * spec.batch_size
        rate = examples / max(done.seconds, 1e-9)
        tensors, self._residual = encode_update(model, base, done.params, spec.codec, self._residual)
        candidate, envelope = package_candidate(
            lease,
            head,
            tensors,
            self.signer,
            peer_kind=self.peer_kind,
            model=model.name,
            codec=spec.codec,
            examples=examples,
            steps=done.steps,
            created_at_ms=self.clock.now_ms(),
            metrics={"train_loss": done.loss, "samples_per_s": rate, "workers": float(done.workers)},
        )
        self._report(phase=f"publishing candidate for window {head.window}", samples_per_s=rate, workers=done.workers)
        last = self.config.max_windows is not None and self.status["windows_done"] + 1 >= self.config.max_windows
        ahead = self.config.train_ahead and not last
        if ahead:  # answered before the candidate's acknowledgement: the relay answers in order
            self._size_lease(spec, len(lease.shard_ids))
            self._report(phase=f"leasing window {head.window + 1} ahead")
            await self._ask_lease(socket, spec, head, ahead=True)
        staged = len(envelope) > self._max_frame_bytes
        if staged:  # too large for a frame: staged and published over HTTP
            acknowledged = await self.http.publish_staged(self.key, candidate, unpack_envelope(envelope)[1])
        else:  # sent in the background while the lease ahead is trained
            await socket.send_bytes(envelope)
            self.status["sent_bytes"] += len(envelope)
        if ahead:
            manifest = self._manifest
            assert manifest is not None  # fetched by ``_train``
            restarts = restarts_from_head(
                self._chain,
                PRESETS[spec.screening].asks_lease_evidence,
                sum(manifest.shard(shard_id).examples for shard_id in lease.shard_ids),
                sum(entry.examples for entry in manifest.shards),
            )
            self._ahead = await self._train_ahead(reader, spec, head, done.params, restarts=restarts)
        if not staged:
            acknowledged = (await self._reply(reader, "candidate.ack"))["candidate_id"]
        if acknowledged != candidate.candidate_id:
            raise ProtocolError("edge acknowledged another candidate")
        self._last_base = head.head_id
        self.costs.published(self.status["downloaded_bytes"], self.status["sent_bytes"])
        self._report(
            phase=f"window {head.window} published; waiting for the validator",
            windows_done=self.status["windows_done"] + 1,
            last_candidate=candidate.candidate_id,
        )
        assert self._optimizer is not None
        progress = Progress(self._optimizer, self._residual, self.status["windows_done"], self._last_base)
        await self.bridge.save(storage_key(self.key), progress.encode(self.key, model))
        if self._announced is None:  # the next head is announced on the relay: waited for, not asked for
            await self._wait_for_head(60.0, reader)

    async def _lease(
        self, socket: Socket, reader: asyncio.Task[None], spec: ExperimentSpec, head: HeadDescriptor
    ) -> LeaseGrant:
        """A lease over the relay for the window on ``head``."""
        await self._ask_lease(socket, spec, head, ahead=False)
        return LeaseGrant.from_wire(await self._reply(reader, "lease"))

    async def _ask_lease(self, socket: Socket, spec: ExperimentSpec, head: HeadDescriptor, *, ahead: bool) -> None:
        """Ask the relay for the lease of the window on ``head`` (``ahead``: the window after it, before
        the next head exists), with its proof of work where ``spec`` asks for one (``protocol.lease_work``);
        its answer is the next the relay sends this peer."""
        request: dict[str, object] = {
            "type": "lease.request",
            "experiment": self.key,
            "request_id": head.window + ahead,
            "cache_bytes": self._shards.index.capacity,  # no home when it holds the split
        }
        if ahead:
            request["after"] = head.head_id
        if self._lease_shards is not None:
            request["shards"] = self._lease_shards
        work = lease_work(spec.lease_work_bits, self.key, self.peer_id, head.head_id)
        if work is not None:
            request["work"] = work
        await socket.send_text(json.dumps(request))

    def _size_lease(self, spec: ExperimentSpec, shards: int) -> None:
        """Size the next lease by the rule native trainers size theirs by (``protocol.lease_size``), after
        a lease of ``shards`` shards, from the training and waiting seconds (``Costs``: paused time is
        neither) since the last sizing. A tab fetches its head, publishes and waits for leases and heads
        one after another, so all its waiting is time a larger lease would fill: behind a slow link it
        takes more shards a window and pays each window's round trips over more examples."""
        now = self.costs.status(self.clock.monotonic_s())
        trained_s, waiting_s = float(now["training_s"]), float(now["waiting_s"])
        if self._sized is not None:
            least, most = spec.lease_bounds
            self._lease_shards, self._calm = next_lease_shards(
                shards, trained_s - self._sized[0], waiting_s - self._sized[1], least=least, most=most, calm=self._calm
            )
        self._sized = (trained_s, waiting_s)

    async def _base(
        self, socket: Socket, reader: asyncio.Task[None], head: HeadDescriptor, model: ModelSpec
    ) -> dict[str, np.ndarray]:
        """``head``'s parameters, checked against the model (a copy: training may update in place)."""
        params, _ = decode_tensors(await self._head_artifact(socket, reader, head, model.max_artifact_bytes))
        model.check(params)
        return {name: array.copy() for name, array in params.items()}

    async def _train_ahead(
        self,
        reader: asyncio.Task[None],
        spec: ExperimentSpec,
        head: HeadDescriptor,
        published: dict[str, np.ndarray],
        *,
        restarts: bool,
    ) -> _Trained | LeaseGrant | None:
        """The next window's lease (asked ``after`` ``head`` by ``_ask_lease``, before its head exists),
        trained from where the window on ``head`` stopped (``published``), or held to train from its head
        (``restarts``); None when the next window is full."""
        assert self._network is not None
        try:
            grant = LeaseGrant.from_wire(await self._reply(reader, "lease"))
        except NoWindow:
            return None
        check_lease(grant.lease, head, peer_id=self.peer_id, edge_key=self._network.edge_key, ahead=True)
        if restarts:
            self._report(phase=f"leased window {head.window + 1} ahead; training it from its head")
            return grant
        return await self._train(spec, head.window + 1, grant, published)

    async def _shard(self, grant: LeaseGrant, shard_id: ShardId) -> bytes:
        """A leased shard's bytes, verified: from the shard store, else downloaded with the lease and kept."""
        assert self._manifest is not None
        entry = self._manifest.shard(shard_id)
        data = await self._shards.get(entry)
        if data is not None:
            self.status["shard_cache_hits"] += 1
            return data
        lease = grant.lease
        data = await self.http.fetch(
            f"/v1/datasets/{lease.dataset_id}/shards/{shard_id}?lease={lease.lease_id}",
            {LEASE_SECRET_HEADER: grant.secret},
        )
        verify_shard(entry, data)
        await self._shards.keep(entry, data)
        self.status["shard_downloads"] += 1
        return data

    async def _train(
        self, spec: ExperimentSpec, window: int, grant: LeaseGrant, params: dict[str, np.ndarray]
    ) -> _Trained:
        """``params`` (left as they are) trained on ``grant``'s shards for ``window``: the lease's epochs,
        in parts over the page's workers, the optimizer's moments merged back."""
        lease = grant.lease
        start = {name: array.copy() for name, array in params.items()}  # training updates in place
        model = spec.model
        if self._manifest is None:
            self._manifest = FetchManifest.from_wire(
                await self.http.fetch_json(f"/v1/datasets/{lease.dataset_id}/fetch-manifest.json")
            )
        features = self._manifest.features
        shards = [decode_shard_stored(await self._shard(grant, shard_id), features) for shard_id in lease.shard_ids]
        await self._shards.save()
        x_all = np.concatenate([x for x, _, _ in shards])  # stored (uint8): each batch is read as it is trained
        y_all = np.concatenate([y for _, y, _ in shards]).astype(np.int32)
        if self._optimizer is None:
            self._optimizer = Adam(spec.learning_rate)
        self._optimizer.learning_rate = spec.learning_rate_at(window)  # the experiment's schedule
        started = time.perf_counter()
        seeds = tuple(epoch_seed(lease, epoch) for epoch in range(spec.local_epochs))
        slices = split(x_all, y_all, self._pace.weights(1 + self.bridge.part_workers()), spec.batch_size)
        scale = feature_scale(features)
        tasks = [
            PartTask(
                spec.model, spec.batch_size, tuple(seed + part for seed in seeds), start, self._optimizer, x, y, scale
            )
            for part, (x, y) in enumerate(slices)
        ]
        payloads = [task.encode() for task in tasks[1:]]  # before this worker's part moves the moments

        reported = [-STATUS_EVERY_S]  # the first batch is reported at once

        def report(steps: int, total: int, elapsed_s: float) -> None:
            if elapsed_s - reported[0] >= STATUS_EVERY_S:  # this worker's part; the others run alongside
                reported[0] = elapsed_s
                self._report(phase=f"training window {window}: batch {steps}/{total}")

        finished: dict[int, float] = {}  # part -> seconds from the start to its result

        async def timed(part: int, result: Awaitable[PartResult | None]) -> PartResult | None:
            done = await result
            finished[part] = time.perf_counter() - started
            return done

        others = [
            asyncio.ensure_future(timed(i, self._part(i, payload, model, spec.learning_rate)))
            for i, payload in enumerate(payloads, 1)
        ]
        await asyncio.sleep(0)  # the other workers are sent their parts before this one's holds the loop
        results = await asyncio.gather(timed(0, train(tasks[0], self.backend, self.guest, report)), *others)
        self._pace.measured(
            [
                len(task.x) / max(finished[i], 1e-9) if result else None
                for i, (result, task) in enumerate(zip(results, tasks, strict=True))
            ]
        )
        trained = [(result, float(len(task.x))) for result, task in zip(results, tasks, strict=True) if result]
        self._optimizer = merged_optimizer([r for r, _ in trained], [n for _, n in trained])
        steps = sum(r.steps for r, _ in trained)
        seconds = time.perf_counter() - started
        self.costs.trained(seconds, steps * spec.batch_size)
        return _Trained(
            grant,
            origin=params,
            params=average([r.params for r, _ in trained], [n for _, n in trained]),
            steps=steps,
            loss=float(sum(r.loss_sum for r, _ in trained) / max(steps, 1)),
            seconds=seconds,
            workers=len(trained),
        )
