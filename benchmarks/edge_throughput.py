"""Edge benchmark: shard serving vs. a plain static file server, and relay fan-out latency.

Shard serving: 8 client threads fetch every shard of MNIST (lease-scoped on the edge) for several
rounds, from the edge and from ``python -m http.server`` over the same files, each server in its
own process; prints MB/s of each and the ratio. Fan-out: N peers join the relay and subscribe; a
publisher sends timestamped messages; the latency from send to receipt at every subscriber gives
p50/p90 at N = 100 and 1000.

    python -m benchmarks.edge_throughput [--rounds 5] [--peers 100 1000] [--messages 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from websockets.asyncio.client import ClientConnection, connect

from datasets.layout import read_train_manifest
from lab.stack import Fleet, free_port, prepare_network
from protocol.messages import LEASE_SECRET_HEADER, LeaseGrant, PeerProof
from protocol.signing import PureSigner

from . import BENCH_EXPERIMENT, bench_network

# every benchmark client comes from 127.0.0.1: per-connection and per-address limits stay out of the way
NO_LOOPBACK_LIMITS = (
    "--messages-per-s", "100000", "--max-connections-per-address", "100000", "--address-checks-per-min", "1e9",
)  # fmt: skip


def _fetch_all(
    urls: list[str], rounds: int, threads: int = 8, headers: dict[str, str] | None = None
) -> tuple[float, int]:
    local = threading.local()

    def get(url: str) -> int:
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=30, headers=headers)
        response = local.client.get(url)
        response.raise_for_status()
        return len(response.content)

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(get, urls * rounds))
    return time.perf_counter() - started, total


def _lease(url: str, signer: PureSigner) -> LeaseGrant:
    proof = PeerProof("lease", signer.public_key, "native", "-", int(time.time() * 1000)).signed(signer)
    response = httpx.post(f"{url}/v1/experiments/{BENCH_EXPERIMENT}/leases", json=proof.to_wire())
    response.raise_for_status()
    return LeaseGrant.from_wire(response.json())


async def _fan_out(url: str, peers: int, messages: int) -> list[float]:
    ws_url = url.replace("http", "ws") + "/v1/relay"

    async def join(index: int) -> ClientConnection:
        signer = PureSigner(index.to_bytes(4, "big") * 8)
        ws = await connect(ws_url, max_size=None, open_timeout=60)
        challenge = json.loads(await ws.recv())
        proof = PeerProof("join", signer.public_key, "viewer", challenge["nonce"], int(time.time() * 1000))
        await ws.send(json.dumps({"type": "join", "proof": proof.signed(signer).to_wire()}))
        await ws.recv()
        await ws.send(json.dumps({"type": "subscribe", "experiment": BENCH_EXPERIMENT, "topics": ["metrics"]}))
        await ws.recv()
        return ws

    subscribers: list[ClientConnection] = []
    for start in range(0, peers, 50):
        subscribers += await asyncio.gather(*(join(i) for i in range(start, min(start + 50, peers))))
    publisher = await join(10**6)
    latencies: list[float] = []

    async def receive(ws: ClientConnection) -> None:
        for _ in range(messages):
            message = json.loads(await ws.recv())
            latencies.append(time.perf_counter() - message["data"]["sent"])

    receivers = [asyncio.ensure_future(receive(ws)) for ws in subscribers]
    for _ in range(messages):
        await publisher.send(
            json.dumps({"type": "metrics", "experiment": BENCH_EXPERIMENT, "data": {"sent": time.perf_counter()}})
        )
        await asyncio.sleep(0.05)
    await asyncio.wait_for(asyncio.gather(*receivers), 120)
    for ws in [*subscribers, publisher]:
        await ws.close()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--peers", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--messages", type=int, default=20)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dtn-bench-"))
    local = prepare_network(root, network=lambda key: bench_network(key, 50))
    manifest = read_train_manifest(local.datasets / "mnist")
    static_dir = local.datasets / "mnist" / "train"
    edge_port, static_port = free_port(), free_port()
    edge_url, static_url = f"http://127.0.0.1:{edge_port}", f"http://127.0.0.1:{static_port}"
    static_argv = [
        sys.executable,
        "-m",
        "http.server",
        str(static_port),
        "--bind",
        "127.0.0.1",
        "--directory",
        str(static_dir),
    ]
    with Fleet(root) as fleet:
        fleet.start("edge", local.edge_argv(edge_port, *NO_LOOPBACK_LIMITS))
        fleet.start("static", static_argv)
        fleet.wait_ready(f"{edge_url}/healthz")
        fleet.wait_ready(f"{static_url}/fetch-manifest.json")
        validator = local.validator(edge_url)
        validator.ensure_genesis(local.network.experiment(BENCH_EXPERIMENT))
        validator.close()
        grant = _lease(edge_url, PureSigner(b"\x02" * 32))
        lease, secret = grant.lease, {LEASE_SECRET_HEADER: grant.secret}
        edge_urls = [f"{edge_url}/v1/datasets/mnist/shards/{s}?lease={lease.lease_id}" for s in lease.shard_ids]
        static_urls = [f"{static_url}/{entry.locator}" for entry in manifest.shards]
        _fetch_all(edge_urls[:4], 1, headers=secret)  # warm up both
        _fetch_all(static_urls[:4], 1)
        edge_s, edge_bytes = _fetch_all(edge_urls, args.rounds, headers=secret)
        static_s, static_bytes = _fetch_all(static_urls, args.rounds)
        edge_mbps, static_mbps = edge_bytes / edge_s / 1e6, static_bytes / static_s / 1e6
        print(f"shard serving, {args.rounds} rounds x {len(edge_urls)} shards, 8 client threads:")
        print(f"  edge (lease-checked, ETag, Range-capable): {edge_mbps:8.1f} MB/s")
        print(f"  python -m http.server (same files):       {static_mbps:8.1f} MB/s")
        print(f"  ratio edge / static: {edge_mbps / static_mbps:.2f}")
        for peers in args.peers:
            latencies = asyncio.run(_fan_out(edge_url, peers, args.messages))
            quantiles = statistics.quantiles(latencies, n=10)
            print(
                f"relay fan-out to {peers} peers ({len(latencies)} deliveries): "
                f"p50 {statistics.median(latencies) * 1e3:.1f} ms, p90 {quantiles[8] * 1e3:.1f} ms"
            )


if __name__ == "__main__":
    main()
