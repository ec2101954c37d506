"""Issuing leases: which shards a peer trains on in the current window of an experiment.

A window is identified by its base head. A peer asking twice in one window gets the same lease
back; otherwise it gets its rendezvous-ranked shards among those no live lease of the window
holds (``protocol.leases.assign_shards``), those of its home first: its share of the dataset among
the peers that lease in this window or leased in the one before (``protocol.leases.Homes``, kept per
experiment until that set of peers changes), so that it trains on the shards it already holds, unless
it declared a shard cache that holds the whole split (``protocol.leases.keeps_home``). It
gets ``shards_per_lease`` of them, or as many as it asks for up to the experiment's
``max_shards_per_lease`` and what the peers expected in the window leave (``protocol.lease_size``); a
peer without accepted work (``server.credit.CreditBook``) gets none of the least kept for expected
peers with some. A lease that lapses undelivered costs priority for ``ARREARS_WINDOWS`` windows after
its own (``Arrears``): its peer and its admission principal are served as a peer without a record is
(and keep no least as expected peers), and a peer without a record asking from the address group it
was leased from (``server.budget.address_group``) takes none of the least kept for any expected
peer. Peers with a record of their own behind that address keep their place: honest peers share
addresses (NAT) with whoever squats. A trainer that just
published may ask for the next window's lease (``after`` the current head) before the next head
exists, so it never waits for one; such a lease is granted on the current head for the next window number and belongs to that window
once its head is promoted (``protocol.window.lease_window``). A window's shards are exclusive among
its leases, whichever head they were granted on. When every shard is held there is no lease: 409
with ``Retry-After`` the seconds until the first live lease lapses (or ask again at the next head,
which comes at the window's deadline at the latest: ``protocol.deadline``). An experiment a
run-control order paused or stopped (``protocol.run_control``) leases nothing: 409 ``Halted`` with its
reason and ``Retry-After: HALTED_RETRY_S``, the answer trainers already wait on; they ask again then,
on the same head (browser peers by the error's name). A lease lives as long
as its window may (the experiment's ``window_timeout_s``, at most the edge's ``lease_ttl_s``).
Leases are signed by the edge and stored durably. The choice is made inside the store's write
transaction (``EdgeStore.grant_lease``), so edges sharing one PostgreSQL store never lease one shard
twice in a window.

An experiment with ``lease_work_bits`` asks for a proof of work with each lease request
(``protocol.lease_work``: bound to the peer and to the current head, or its parent for a request that
crossed a new head), checked before the rate limit and the store's write: 403 without it, 409 for work
on an older head (ask again on the current one).

A peer that leased over the relay and leaves it (its last connection closed, not joined again within
the edge's ``lease_release_grace_s``) gives back the leases it took over it and did not deliver
(``LeaseIssuer.holder_left``): each stored again, signed, lapsed now (``EdgeStore.release_leases``), and
published on the ``leases`` topic, so that its shards go to the window's next asker and validators
stop waiting for it at once instead of at the window's deadline; a candidate on it is refused (409).
A page that closes or loses its connection abandons the window it was training (a new session starts
a new one), so its lease holds nothing anyone will deliver. Such a lease lapsed undelivered as any
other does (``Arrears``).

Only the holder learns a lease's secret (``LeaseGrant``): an HMAC of the lease id under a key derived
from the edge's own seed, so asking again in the same window, or after an edge restart, gives the
same secret back, and nothing secret is stored. Shards are served only against it (``check_secret``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import secrets
from collections import defaultdict

from protocol.ids import ExperimentKey, HeadId, LeaseId, PeerId, ShardId
from protocol.lease_size import granted_shards
from protocol.lease_work import lease_work_done, work_challenge
from protocol.leases import ARREARS_WINDOWS, Homes, assign_shards, home_seed, keeps_home
from protocol.messages import TRAINER_KINDS, HeadDescriptor, Lease, LeaseGrant

from .budget import address_group
from .errors import Conflict, Forbidden, Halted, NotFound
from .hub import Connection
from .intake import check_peer_rate
from .state import EdgeState

__all__ = ["HALTED_RETRY_S", "Arrears", "LeaseIssuer"]

log = logging.getLogger(__name__)

HALTED_RETRY_S = 2  # how soon a trainer refused for a paused experiment asks again: it resumes within a window


class Arrears:
    """The holders of an experiment's leases that lapsed undelivered in the windows ``LeaseIssuer``
    reads them for (``EdgeStore.lapsed_holders``): peers, principals and address groups."""

    def __init__(self, holders: list[tuple[str, str | None, str]]) -> None:
        self.peers = {peer for peer, _, _ in holders}
        self.principals = {principal for _, principal, _ in holders if principal is not None}
        self.addresses = {address for _, _, address in holders}

    def owe(self, peer: str, principal: str | None = None) -> bool:
        return peer in self.peers or principal in self.principals


class LeaseIssuer:
    def __init__(self, state: EdgeState) -> None:
        self.state = state
        self._secret_key = hashlib.sha256(b"dtn/lease-secret/v1\n" + state.store.edge_seed()).digest()
        self._homes: dict[ExperimentKey, Homes] = {}  # the latest homes per experiment
        self._arrears_on: dict[ExperimentKey, tuple[HeadId, Arrears]] = {}  # read once per head
        self._leaving: set[asyncio.Task[None]] = set()  # holders' graces and releases (``holder_left``)
        self._waiting: set[asyncio.Task[None]] = set()  # those still in their grace
        self._closing = False

    def holder_left(self, connection: Connection) -> None:
        """``connection`` closed: after the edge's ``lease_release_grace_s``, unless its peer joined
        again (here or on another edge of the deployment), give back what it leased over it
        (``release``)."""
        if connection.leases and not self._closing:
            task = asyncio.create_task(self._release_after_grace(connection))
            self._leaving.add(task)
            task.add_done_callback(self._leaving.discard)

    async def _release_after_grace(self, connection: Connection) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._waiting.add(task)
        try:
            await asyncio.sleep(self.state.settings.lease_release_grace_s)
        finally:
            self._waiting.discard(task)
        if self._closing or await self.state.hub.present(connection.peer_id):
            return  # a new session holds them: it may deliver, or ask for them again
        by_experiment: dict[str, list[LeaseId]] = defaultdict(list)
        for experiment, lease_id in connection.leases:
            by_experiment[experiment].append(LeaseId(lease_id))
        for experiment, lease_ids in by_experiment.items():
            try:
                await self.release(ExperimentKey.parse(experiment), lease_ids)
            except Exception:  # the store is away: the leases lapse at their expiry, as before
                log.exception("could not give back %d lease(s) of %s", len(lease_ids), connection.peer_id)

    async def release(self, experiment: ExperimentKey, lease_ids: list[LeaseId]) -> list[Lease]:
        """Give back those of ``lease_ids`` that are live and undelivered (``EdgeStore.release_leases``)
        and tell the ``leases`` topic (validators wake on it); returns them."""
        now_ms, signer = self.state.clock.now_ms(), self.state.signer
        released = await self.state.offload(
            self.state.store.release_leases, lease_ids, now_ms, lambda lease: lease.signed(signer)
        )
        for lease in released:
            self.state.metrics.leases_released.inc()
            self.state.hub.publish(experiment, "leases", {**lease.to_wire(), "released": True})
        return released

    async def close(self) -> None:
        """The edge is shutting down: end the graces still waiting (those leases lapse at their expiry)
        and let the releases already writing finish, before the caller closes the store they write to
        (a store write runs in a worker thread, which cancelling its task would not stop)."""
        self._closing = True
        for task in list(self._waiting):
            task.cancel()
        await asyncio.gather(*self._leaving, return_exceptions=True)

    def secret(self, lease_id: LeaseId) -> str:
        return hmac.new(self._secret_key, lease_id.encode(), hashlib.sha256).hexdigest()

    def check_secret(self, lease_id: LeaseId, presented: str | None) -> Lease:
        """The lease ``lease_id`` if ``presented`` is its secret; ``Forbidden`` otherwise (an unknown
        lease and a wrong secret answer alike, so lease ids cannot be probed)."""
        lease = self.state.store.lease(lease_id)
        if lease is None or presented is None or not hmac.compare_digest(self.secret(lease_id), presented):
            raise Forbidden("unknown lease or wrong lease secret")
        return lease

    def _homes_among(
        self, experiment: ExperimentKey, dataset_id: str, peers: set[PeerId], shard_ids: tuple[ShardId, ...]
    ) -> Homes:
        """The homes of ``experiment``'s shards among ``peers``: those kept for it when they are of the
        same peers and shards (as long as the peers training stay the same), else drawn anew."""
        homes = self._homes.get(experiment)
        if homes is None or homes.peers != tuple(sorted(peers)) or homes.shard_ids != shard_ids:
            homes = self._homes[experiment] = Homes.among(home_seed(experiment, dataset_id), peers, shard_ids)
        return homes

    def _arrears(self, experiment: ExperimentKey) -> Arrears:
        """Who owes for a lease that lapsed undelivered in the ``ARREARS_WINDOWS`` windows before the
        last one closed (a lease of the window closed last may still deliver, one window late: record
        0011)."""
        head = self.state.store.current_head(experiment)
        if head is None or head.window < 2:
            return Arrears([])
        cached = self._arrears_on.get(experiment)
        if cached is not None and cached[0] == head.head_id:  # those windows are closed: read once a head
            return cached[1]
        last = head.window - 2
        arrears = Arrears(self.state.store.lapsed_holders(experiment, max(0, last - ARREARS_WINDOWS + 1), last))
        self._arrears_on[experiment] = (head.head_id, arrears)
        return arrears

    async def grant(
        self,
        experiment: ExperimentKey,
        peer_id: PeerId,
        peer_kind: str,
        principal: str | None = None,
        *,
        address: str = "",
        after: HeadId | None = None,
        shards: int | None = None,
        cache_bytes: int | None = None,
        work: int | None = None,
    ) -> LeaseGrant:
        """The one door to a lease, for HTTP and the relay alike, once the caller has authenticated
        ``peer_id`` (its proof or its join), asking from ``address`` (its client address): a trainer
        kind, a known experiment open to that kind (``ExperimentSpec.refusal``: browser peers get no
        lease for a native-only one), its proof of work when the experiment asks for one (``work``,
        ``check_work``), the peer's rate limit (``server.intake.check_peer_rate``), then ``issue``."""
        if peer_kind not in TRAINER_KINDS:
            raise Forbidden(f"only trainers ({', '.join(TRAINER_KINDS)}) lease shards, not {peer_kind}")
        # before the rate limit: a made-up experiment, or one not for this kind, gets no budget of its own
        refusal = self.state.experiment(experiment).refusal(peer_kind)
        if refusal is not None:
            raise Forbidden(refusal)
        await self.check_work(experiment, peer_id, work)
        halted = (await self.state.offload(self.state.store.run_state, experiment)).halted
        if halted is not None:
            raise Halted(
                f"experiment {experiment} is {halted}; ask again in {HALTED_RETRY_S} s",
                headers={"Retry-After": str(HALTED_RETRY_S)},
            )
        check_peer_rate(self.state, peer_id, experiment)
        return await self.issue(
            experiment,
            peer_id,
            principal,
            peer_kind=peer_kind,
            address=address,
            after=after,
            shards=shards,
            cache_bytes=cache_bytes,
        )

    async def check_work(self, experiment: ExperimentKey, peer_id: PeerId, work: int | None) -> None:
        """Refuse a lease request of ``experiment`` without the proof of work it asks for
        (``ExperimentSpec.lease_work_bits``, ``protocol.lease_work``): ``Forbidden`` without work,
        ``Conflict`` for work that does not check on the current head or its parent (done on an older
        head, or not done): the peer does it again on the current head."""
        bits = self.state.experiment(experiment).lease_work_bits
        if bits == 0:
            return
        head = await self.state.offload(self.state.store.current_head, experiment)
        if head is None:
            return  # no lease without a head either (``issue``)
        if work is None:
            raise Forbidden(
                f"experiment {experiment} asks a proof of work of {bits} bits with each lease "
                f"(protocol.lease_work, on head {head.head_id})"
            )
        if any(
            lease_work_done(work_challenge(experiment, peer_id, on), work, bits)
            for on in (head.head_id, head.parent)
            if on is not None
        ):
            return
        raise Conflict(
            f"the proof of work is not {bits} bits on the current head {head.head_id} or its parent: "
            "do it again on the current head"
        )

    async def issue(
        self,
        experiment: ExperimentKey,
        peer_id: PeerId,
        principal: str | None = None,
        *,
        peer_kind: str | None = None,
        address: str = "",
        after: HeadId | None = None,
        shards: int | None = None,
        cache_bytes: int | None = None,
    ) -> LeaseGrant:
        """The peer's lease in the current window, or with ``after`` the current head's id, in the
        window after it, before its head exists (a lease granted ahead: ``protocol.window.lease_window``);
        ``after`` an older head asks for the current window. ``shards``: how many shards the peer asks
        for (``ExperimentSpec.lease_shards`` bounds it; fewer when fewer are free); a peer asking again
        in the same window gets its lease as granted. ``cache_bytes``: the bytes of shards the peer
        says it keeps (its home is ignored when they hold the whole split). ``peer_kind``: remember the peer as seen,
        in the same write. ``address``: the client address it asked from (its group is what a lapsed
        lease costs). The store's write runs in a worker thread: on a shared store it may wait for
        other edges' writes, and the event loop must not wait with it."""
        spec = self.state.experiment(experiment)
        manifest = self.state.dataset(spec.dataset_id)
        now_ms = self.state.clock.now_ms()
        # caught up off the event loop (it reads the store); then only looked up in the store's thread below
        standings = await self.state.offload(self.state.credit.standings, experiment)
        arrears = await self.state.offload(self._arrears, experiment)
        group = address_group(address)

        def has_record(peer: PeerId) -> bool:
            standing = standings.get(peer)
            return standing is not None and standing.recorded and not arrears.owe(peer)

        asker_first = has_record(peer_id) and not arrears.owe(peer_id, principal)
        asker_last = not asker_first and group in arrears.addresses  # after every expected peer

        def choose(head: HeadDescriptor | None, granted: list[Lease]) -> Lease:
            if head is None:
                raise NotFound(f"experiment {experiment} has no head yet (waiting for the validator's genesis)")
            ahead = after == head.head_id
            window = head.window + ahead
            live = [lease for lease in granted if lease.window == window]
            for lease in live:
                if lease.peer_id == peer_id:
                    return lease
            taken = {shard for lease in live for shard in lease.shard_ids}
            seed = f"{head.head_id}/ahead" if ahead else head.head_id  # not the shards it drew on this head
            last = {lease.peer_id for lease in granted if lease.window == window - 1}  # who trained last window
            expected = last - {lease.peer_id for lease in live} - {peer_id}
            count = granted_shards(
                spec.lease_shards(shards),
                len(manifest.shard_ids) - len(taken),
                least=spec.shards_per_lease,
                expected_peers=len(expected),
                served_first=0 if asker_first else len(expected) if asker_last else sum(map(has_record, expected)),
            )
            home: frozenset[ShardId] = frozenset()
            if keeps_home(cache_bytes, manifest.size_bytes):
                peers = last | {lease.peer_id for lease in live}
                home = self._homes_among(experiment, spec.dataset_id, peers, manifest.shard_ids).of(peer_id)
            chosen = assign_shards(seed, peer_id, manifest.shard_ids, taken, count, home)
            if not chosen:
                lapse_s = max(1, math.ceil((min(lease.expires_at_ms for lease in live) - now_ms) / 1000))
                raise Conflict(
                    f"every shard of window {window} is leased; ask again at the next head or in {lapse_s} s",
                    headers={"Retry-After": str(lapse_s)},
                )
            return Lease(
                lease_id=LeaseId(f"lease-{secrets.token_hex(16)}"),
                experiment=experiment,
                peer_id=peer_id,
                base_head=head.head_id,
                window=window,
                dataset_id=spec.dataset_id,
                shard_ids=chosen,
                issued_at_ms=now_ms,
                expires_at_ms=now_ms + int(min(self.state.settings.lease_ttl_s, spec.window_timeout_s) * 1000),
                principal=principal,
            ).signed(self.state.signer)

        seen = None if peer_kind is None else (peer_id, peer_kind)
        lease, created = await self.state.offload(self.state.store.grant_lease, experiment, now_ms, choose, seen, group)
        if created:
            self.state.metrics.leases.inc()
            self.state.hub.publish(experiment, "leases", lease.to_wire())
        return LeaseGrant(lease, self.secret(lease.lease_id))
