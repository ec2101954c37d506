"""Simulated trainers: many real signing identities in one process, speaking the real HTTP protocol to a
real edge, their updates drawn from updates real trainers published. What scale benchmarks run.

    bank = record_bank(local, fleet, url, key)       # real native trainers (processes) publish, read back
    peers = SimulatedFleet(url, local.network, key, bank, peers=1000)
    head, seen_at = peers.head()                     # the current head, verified as a trainer verifies it
    sent = peers.deliver(head)                       # every peer leases, then every peer uploads a candidate
    following, seen_at = peers.head(after=head)      # the head the validator promotes from them

Real: each peer's Ed25519 identity, its signed lease request and the edge's lease (``check_lease``), the
candidate in the experiment's codec, packaged and signed by ``protocol.window.package_candidate`` and
uploaded by ``EdgeClient.publish_candidate``. Simulated: training. A candidate is the head plus an update
drawn from the bank (``UpdateBank.draw``), so the validator's update screens, holdout checks and merge
take it as honest work; it claims the examples and steps one window of its lease takes. Its lease
evidence (``protocol.evidence``, measured as for any candidate) shows no work on its own lease: it earns
no credit, and once the head's holdout loss is below half of chance it is refused (``no_lease_evidence``). Left out: the peers'
shard downloads and head downloads (the fleet reads the head once a window).

Peers are spread over ``addresses`` loopback source addresses (127.0.0.2, 127.0.0.3, ...), one
connection each, as trainers behind that many NATs: the edge's per-address limits
(``address_checks_per_min``, ``max_connections_per_address``) apply to each as to any client, at their
defaults. Each address's peers take their turns on its connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import httpx
import numpy as np

from native_peer.edge_client import EdgeClient, EdgeRequestError
from native_peer.identity import NodeIdentity
from protocol.codec import decode_tensors, encode_tensors
from protocol.ids import ExperimentKey
from protocol.manifests import NetworkManifest
from protocol.messages import HeadDescriptor, LeaseGrant
from protocol.updates import decode_update, encode_update
from protocol.window import check_lease, head_to_train, package_candidate

from .stack import Fleet, LocalNetwork

__all__ = ["Delivery", "SimulatedFleet", "UpdateBank", "record_bank"]

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger(__name__)
Tensors = dict[str, np.ndarray]


DRAW_NOISE = 0.5  # each drawn tensor's noise, relative to its norm (``UpdateBank.draw``)


@dataclass(frozen=True)
class UpdateBank:
    """Updates (θ − base, float32, one dict per candidate) that real trainers published."""

    deltas: tuple[Tensors, ...]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode_tensors({f"{i:04d}/{k}": v for i, d in enumerate(self.deltas) for k, v in d.items()}))

    @classmethod
    def load(cls, path: Path) -> UpdateBank:
        tensors, _ = decode_tensors(path.read_bytes())
        deltas: dict[str, Tensors] = {}
        for name, value in tensors.items():
            index, _, tensor = name.partition("/")
            deltas.setdefault(index, {})[tensor] = value
        return cls(tuple(deltas[i] for i in sorted(deltas)))

    def draw(self, rng: np.random.Generator) -> Tensors:
        """Two recorded updates mixed at a uniform random weight, each tensor moved by Gaussian noise of
        ``DRAW_NOISE`` × its norm, rescaled to the norm of the first times U(0.9, 1.1): as long as a real
        update, in the direction real trainers went, and no copy of another draw (two draws of one
        mix are at cosine ≈ 1 / (1 + ``DRAW_NOISE``²), below ``protocol.near_duplicates``' bound)."""
        first, second = rng.choice(len(self.deltas), 2, replace=len(self.deltas) < 2)
        a, b, u = self.deltas[first], self.deltas[second], float(rng.uniform())
        mix = {k: u * a[k] + (1.0 - u) * b[k] for k in a}
        mix = {
            k: v + DRAW_NOISE * float(np.linalg.norm(v)) / np.sqrt(v.size) * rng.standard_normal(v.shape)
            for k, v in mix.items()
        }
        scale = _norm(a) * float(rng.uniform(0.9, 1.1)) / max(_norm(mix), 1e-12)
        return {k: (v * scale).astype(np.float32) for k, v in mix.items()}


def _norm(tensors: Tensors) -> float:
    return float(np.sqrt(sum(float(np.square(v, dtype=np.float64).sum()) for v in tensors.values())))


def record_bank(
    local: LocalNetwork,
    fleet: Fleet,
    url: str,
    key: ExperimentKey,
    *,
    trainers: int = 2,
    windows: int = 2,
    timeout_s: float = 300.0,
) -> UpdateBank:
    """Run ``trainers`` real native trainers (``python -m native_peer train``, processes in ``fleet``,
    each waiting for its window to be judged) for ``windows`` windows each on the stack at ``url``, then
    read back every candidate of ``key``: its update against its base head. The edge must keep the
    candidates' artifacts that long (``candidate_retention_windows`` 0, or more than ``windows``)."""
    names = [f"recorder-{i}" for i in range(trainers)]
    for name in names:
        argv = local.trainer_argv(url, local.root / name)
        fleet.start(name, [*argv, "--experiment", str(key), "--windows", str(windows), "--idle-between-windows"])
    deadline = time.monotonic() + timeout_s
    for name in names:
        code = fleet.processes[name].wait(max(1.0, deadline - time.monotonic()))
        fleet.stop(name)
        if code != 0:
            raise RuntimeError(f"{name} exited with {code}; see {fleet.log_path(name)}")
    spec = local.network.experiment(key)
    model = spec.model
    reader = NodeIdentity.load_or_create(local.validator_storage.identity_path)
    edge = EdgeClient(url, reader=reader)
    cache = local.root / "recorded"
    try:
        deltas = []
        for candidate in edge.candidates(key):
            base, _ = decode_tensors(edge.artifact(candidate.base_head, cache / f"{candidate.base_head[7:]}.head"))
            encoded, _ = decode_tensors(edge.artifact(candidate.candidate_id, cache / candidate.candidate_id[7:]))
            trained = decode_update(model, base, encoded, spec.codec)
            deltas.append({k: (trained[k] - np.asarray(base[k], np.float32)).astype(np.float32) for k in base})
    finally:
        edge.close()
    if not deltas:
        raise RuntimeError("the recording trainers published no candidate")
    return UpdateBank(tuple(deltas))


@dataclass(frozen=True)
class Delivery:
    """One window of the fleet: leases granted (``refused``: peers the edge gave none, or whose upload
    it refused), candidates uploaded, seconds per phase, and ``delivered_at`` (``time.monotonic``) when
    the last upload was answered."""

    window: int
    leased: int
    uploaded: int
    refused: int
    lease_s: float
    build_s: float
    upload_s: float
    delivered_at: float


class SimulatedFleet:
    """``peers`` simulated trainers of experiment ``key`` against the edge at ``url`` (see the module)."""

    def __init__(
        self,
        url: str,
        network: NetworkManifest,
        key: ExperimentKey,
        bank: UpdateBank,
        peers: int,
        *,
        addresses: int = 16,
        seed: int = 0,
        workdir: Path,
    ) -> None:
        if not 1 <= addresses <= 250:
            raise ValueError("addresses must be within 1..250 (127.0.0.2 upwards)")
        rng = np.random.default_rng(seed)
        self.key, self.bank, self.seed, self.workdir = key, bank, seed, workdir
        self.spec = network.experiment(key)
        self.identities = [NodeIdentity(rng.bytes(32)) for _ in range(peers)]
        self.clients = [
            EdgeClient(url, transport=httpx.HTTPTransport(local_address=f"127.0.0.{2 + i}"))
            for i in range(min(addresses, peers))
        ]
        self.network = replace(network, edge_key=network.edge_key or self.clients[0].network().edge_key)
        self.manifest = self.clients[0].fetch_manifest(self.spec.dataset_id)
        self._pool = ThreadPoolExecutor(len(self.clients), thread_name_prefix="simulated")

    def close(self) -> None:
        self._pool.shutdown()
        for client in self.clients:
            client.close()

    def head(self, after: HeadDescriptor | None = None, timeout_s: float = 600.0) -> tuple[HeadDescriptor, float]:
        """The current head, or the first after ``after`` (long-polled, ``timeout_s`` at most), checked
        as a trainer checks it (``head_to_train``: the network's validators vouch for it), and the
        ``time.monotonic`` at which it was seen."""
        deadline = time.monotonic() + timeout_s
        while True:
            wait_s = max(0.0, min(30.0, deadline - time.monotonic()))
            found = self.clients[0].current_head(
                self.key, after=None if after is None else after.head_id, wait_s=wait_s
            )
            seen_at = time.monotonic()
            if found is not None and (after is None or found.head_id != after.head_id):
                last = None if after is None else after.head_id
                return head_to_train(found, self.network, last), seen_at
            if seen_at >= deadline:
                raise TimeoutError(f"no head after {after.head_id if after else 'genesis'} within {timeout_s:.0f} s")
            if after is None:
                time.sleep(0.1)

    def deliver(self, head: HeadDescriptor) -> Delivery:
        """The window on ``head``: every peer leases (all leases are granted before any candidate goes
        up, so the window closes on the last candidate, not on the first), builds its candidate, then
        uploads it."""
        chosen = self.identities
        path = self.workdir / f"{head.head_id[7:]}.head"
        base, _ = decode_tensors(self.clients[0].artifact(head.head_id, path))
        started = time.monotonic()
        grants = self._each(chosen, lambda client, me: self._lease(client, me, head))
        leased = time.monotonic()
        owned = [(i, me, grant) for i, (me, grant) in enumerate(zip(chosen, grants, strict=True)) if grant is not None]
        envelopes = self._each(owned, lambda _, item: self._build(*item, head, base))
        built = time.monotonic()
        sent = self._each(envelopes, self._upload)
        done = time.monotonic()
        return Delivery(
            window=head.window,
            leased=len(owned),
            uploaded=sum(sent),
            refused=len(chosen) - sum(sent),
            lease_s=leased - started,
            build_s=built - leased,
            upload_s=done - built,
            delivered_at=done,
        )

    def _each(self, items: Sequence[T], work: Callable[[EdgeClient, T], R]) -> list[R]:
        """``work(client, item)`` for every item, the items dealt round-robin to the source addresses,
        each address's in turn on its own connection; results in the items' order."""
        width = len(self.clients)

        def share(k: int) -> list[R]:
            return [work(self.clients[k], item) for item in items[k::width]]

        shares = list(self._pool.map(share, range(width)))
        return [shares[i % width][i // width] for i in range(len(items))]

    def _lease(self, client: EdgeClient, me: NodeIdentity, head: HeadDescriptor) -> LeaseGrant | None:
        try:
            grant = client.request_lease(self.key, me, "native")
        except EdgeRequestError as exc:
            if exc.status == 409:  # no shard left in this window
                return None
            raise
        check_lease(grant.lease, head, peer_id=me.peer_id, edge_key=self.network.edge_key)
        return grant

    def _build(self, index: int, me: NodeIdentity, grant: LeaseGrant, head: HeadDescriptor, base: Tensors) -> bytes:
        """The signed candidate envelope of peer ``index`` (``me``) for its lease: ``base`` plus a drawn
        update, claiming what one window of the lease takes (its examples, every epoch, in whole batches;
        a lease short of one batch, the dataset's last shard, claims one step of what it holds)."""
        lease, spec = grant.lease, self.spec
        rng = np.random.default_rng([self.seed, head.window, index])
        delta = self.bank.draw(rng)
        trained = {k: (base[k] + delta[k]).astype(np.float32) for k in base}
        tensors, _ = encode_update(spec.model, base, trained, spec.codec)
        leased = spec.local_epochs * sum(self.manifest.shard(s).examples for s in lease.shard_ids)
        steps = max(1, leased // spec.batch_size)  # a lease short of one batch (the last shard) claims one
        _, envelope = package_candidate(
            lease, head, tensors, me, peer_kind="native", model=spec.model.name, codec=spec.codec,
            examples=min(leased, steps * spec.batch_size), steps=steps, created_at_ms=int(time.time() * 1000), metrics={},
        )  # fmt: skip
        return envelope

    def _upload(self, client: EdgeClient, envelope: bytes) -> bool:
        try:
            client.publish_candidate(self.key, envelope)
        except EdgeRequestError as exc:
            log.warning("a simulated candidate was refused: %s", exc)
            return False
        return True
