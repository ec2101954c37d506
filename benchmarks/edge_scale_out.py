"""Scale-out benchmark: lease requests per second across two edges that share a PostgreSQL store
and Redis, against one edge on SQLite (the embedded default) and one edge on PostgreSQL, same run;
then relay fan-out latency (p50/p90) with ``--peers`` WebSocket subscribers on one edge vs spread
over two edges that share Redis.

Every edge is a real ``python -m server`` process; PostgreSQL and redis-server are private
instances on loopback (``deploy.services``). Each round makes a fresh window (a new validator-signed
head) and sends ``--requests`` lease requests from as many distinct peers, ``--concurrency`` at a
time, alternating between the edges of the setup. A window's shards (the MNIST train split's) go in
leases of 2: the first requests get a lease, the others the documented 409, and each is one write
transaction of the store either way. Reported: the median over the rounds of requests answered per
second, and the ratio to one edge on SQLite. The load generator (httpx, one process) shares the
machine with the edges and the databases.

    python -m benchmarks.edge_scale_out [--rounds 3] [--requests 1000] [--concurrency 16] [--peers 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from deploy.services import PrivatePostgres, PrivateRedis
from lab.stack import Fleet, LocalNetwork, free_port, prepare_network
from native_peer.identity import NodeIdentity
from native_peer.models import builtin_model
from protocol.codec import encode_tensors
from protocol.envelope import pack_envelope
from protocol.hashing import content_id
from protocol.ids import HeadId
from protocol.messages import HeadDescriptor, PeerProof
from protocol.model import init_params
from protocol.signing import PureSigner

from . import BENCH_EXPERIMENT, bench_network
from .edge_throughput import NO_LOOPBACK_LIMITS, fan_out, fan_out_line

LEASES = f"/v1/experiments/{BENCH_EXPERIMENT}/leases"
HEADS = f"/v1/experiments/{BENCH_EXPERIMENT}/heads"


def _head(validator: NodeIdentity, parent: HeadId | None, window: int) -> bytes:
    artifact = encode_tensors(init_params(builtin_model("mnist-mlp"), window))
    head = HeadDescriptor(
        experiment=BENCH_EXPERIMENT,
        head_id=HeadId(content_id(artifact)),
        parent=parent,
        window=window,
        global_step=0,
        merged=(),
        validator_key=validator.public_key,
        created_at_ms=int(time.time() * 1000),
    ).signed(validator)
    return pack_envelope(head.to_wire(), artifact)


async def _round(urls: list[str], requests: int, concurrency: int, offset: int) -> tuple[float, int]:
    """Requests answered per second, and how many got a lease."""
    now_ms = int(time.time() * 1000)
    proofs = []
    for i in range(requests):
        signer = PureSigner((offset + i).to_bytes(32, "big"))
        proofs.append(PeerProof("lease", signer.public_key, "native", "-", now_ms).signed(signer).to_wire())
    limits = httpx.Limits(max_connections=max(1, concurrency // len(urls)))
    clients = [httpx.AsyncClient(base_url=url, timeout=60, limits=limits) for url in urls]
    try:
        started = time.perf_counter()
        responses = await asyncio.gather(
            *(clients[i % len(clients)].post(LEASES, json=body) for i, body in enumerate(proofs))
        )
        elapsed = time.perf_counter() - started
    finally:
        for client in clients:
            await client.aclose()
    statuses = {response.status_code for response in responses}
    if not statuses <= {200, 409}:
        raise RuntimeError(
            f"unexpected answers {statuses}: {[r.text for r in responses if r.status_code not in (200, 409)][:3]}"
        )
    return requests / elapsed, sum(response.status_code == 200 for response in responses)


def _measure(
    name: str, local: LocalNetwork, root: Path, shared: list[str], edges: int, args: argparse.Namespace
) -> float:
    validator = NodeIdentity.load_or_create(local.validator_storage.identity_path)
    rates = []
    with Fleet(root / name) as fleet:
        urls = []
        for index in range(edges):
            port = free_port()
            argv = local.edge_argv(port, "--no-access-log", *NO_LOOPBACK_LIMITS, *shared)
            argv[argv.index("--data-dir") + 1] = str(root / name / f"edge-{index}")
            fleet.start(f"edge-{index}", argv)
            urls.append(f"http://127.0.0.1:{port}")
            fleet.wait_ready(f"{urls[-1]}/livez")
        parent: HeadId | None = None
        for window in range(args.rounds):
            body = _head(validator, parent, window)
            answer = httpx.post(f"{urls[0]}{HEADS}", content=body, timeout=30)
            answer.raise_for_status()
            parent = HeadId(answer.json()["head_id"])
            rate, granted = asyncio.run(_round(urls, args.requests, args.concurrency, 10_000 * (window + 1)))
            rates.append(rate)
            print(f"  {name}, window {window}: {rate:.0f} lease requests/s ({granted} granted)", flush=True)
    return statistics.median(rates)


def _fan_out_latency(
    name: str, local: LocalNetwork, root: Path, shared: list[str], edges: int, args: argparse.Namespace
) -> list[float]:
    """Relay fan-out latencies with ``args.peers`` subscribers spread over ``edges`` edges, the
    publisher on the first: across edges every message goes through Redis pub/sub."""
    with Fleet(root / name) as fleet:
        urls = []
        for index in range(edges):
            port = free_port()
            limits = ("--max-connections", str(args.peers + 100))
            argv = local.edge_argv(port, "--no-access-log", *NO_LOOPBACK_LIMITS, *limits, *shared)
            argv[argv.index("--data-dir") + 1] = str(root / name / f"edge-{index}")
            fleet.start(f"edge-{index}", argv)
            urls.append(f"http://127.0.0.1:{port}")
            fleet.wait_ready(f"{urls[-1]}/livez")
        return asyncio.run(fan_out(urls, args.peers, args.messages))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="windows per setup")
    parser.add_argument("--requests", type=int, default=1000, help="lease requests per window")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--peers", type=int, default=5000, help="relay subscribers for the fan-out latency")
    parser.add_argument("--messages", type=int, default=10, help="relay messages published")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dtn-bench-scale-"))
    local = prepare_network(root, network=lambda key: bench_network(key, 2))
    with PrivatePostgres() as postgres, PrivateRedis() as redis:
        setups = {
            "one edge, SQLite": ([], 1),
            "one edge, PostgreSQL": (["--store-url", postgres.create_database("one")], 1),
            "two edges, PostgreSQL + Redis": (
                ["--store-url", postgres.create_database("two"), "--redis-url", redis.url,
                 "--blobs-dir", str(root / "shared-blobs")],
                2,
            ),
        }  # fmt: skip
        medians = {name: _measure(name, local, root, shared, edges, args) for name, (shared, edges) in setups.items()}
        relay = {
            "one edge": _fan_out_latency("relay-one", local, root, [], 1, args),
            "two edges on Redis": _fan_out_latency("relay-two", local, root, ["--redis-url", redis.url], 2, args),
        }
    baseline = medians["one edge, SQLite"]
    for name, rate in medians.items():
        print(
            f"lease requests per second, {name}: {rate:.0f} (median of {args.rounds}; {rate / baseline:.2f} x one edge on SQLite)"
        )
    for name, latencies in relay.items():
        print(fan_out_line(f"{args.peers} peers, {name}", latencies))
    shutil.rmtree(root)  # kept, with the edges' logs, only when something failed


if __name__ == "__main__":
    main()
