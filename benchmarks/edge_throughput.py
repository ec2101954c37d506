"""Edge benchmark: shard serving against plain nginx on the same files, and relay fan-out latency.

Shard serving, with wrk (a real load generator, from apt) against one 785 KB MNIST shard, every
round interleaved so that both sides of a ratio share whatever else the machine is doing:

* as deployed (``deploy/nginx/dtn.conf`` over TLS): the edge behind nginx, which checks the lease
  (``?lease=`` + ``dtn-lease-secret``) and hands the file to nginx (``X-Accel-Redirect``), against plain
  nginx serving the same file from a location with the same TLS settings;
* the same pair over plain HTTP (no TLS to share the cost), and the edge alone sending the bytes
  itself (no proxy), against the same plain nginx.

Each line gives the median req/s and MB/s over the rounds; ratios are of the medians. Fan-out: N
peers join the relay and subscribe; a publisher sends timestamped messages; the latency from send to
receipt at every subscriber gives p50/p90 at N = 100 and 1000.

    python -m benchmarks.edge_throughput [--rounds 5] [--seconds 3] [--connections 8] [--peers 100 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from websockets.asyncio.client import ClientConnection, connect

from deploy.host import derived_values, render_template, self_signed_certificate, standalone_nginx_conf
from lab.stack import Fleet, free_port, prepare_network
from protocol.messages import LEASE_SECRET_HEADER, LeaseGrant, PeerProof
from protocol.signing import PureSigner

from . import BENCH_EXPERIMENT, bench_network

# every benchmark client comes from 127.0.0.1: per-connection and per-address limits stay out of the way
NO_LOOPBACK_LIMITS = (
    "--messages-per-s", "100000", "--max-connections-per-address", "100000", "--address-checks-per-min", "1e9",
)  # fmt: skip
_WRK_RATE = re.compile(r"Requests/sec:\s+([0-9.]+)")
_WRK_ERRORS = re.compile(r"Non-2xx or 3xx responses: (\d+)|Socket errors: .*")


def _require(tool: str, package: str) -> str:
    path = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
    if path is None:
        raise SystemExit(f"{tool} is not installed: apt-get install {package} (make setup does)")
    return path


def _wrk(url: str, seconds: int, connections: int, headers: dict[str, str] | None = None) -> float:
    """Requests per second wrk measures on ``url`` (every answer must be 2xx)."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency"]
    for name, value in (headers or {}).items():
        argv += ["-H", f"{name}: {value}"]
    out = subprocess.run([*argv, url], capture_output=True, text=True, check=True, timeout=seconds + 30).stdout
    if _WRK_ERRORS.search(out):
        raise RuntimeError(f"wrk saw failed requests on {url}:\n{out}")
    match = _WRK_RATE.search(out)
    if match is None:
        raise RuntimeError(f"no rate in wrk's output:\n{out}")
    return float(match.group(1))


def _interleaved(
    sides: dict[str, tuple[str, dict[str, str]]], rounds: int, seconds: int, connections: int
) -> dict[str, float]:
    """Median req/s of each side, measured round after round in turn (one warm-up round first)."""
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(rounds + 1):
        for name, (url, headers) in sides.items():
            rate = _wrk(url, 1 if round_ == 0 else seconds, connections, headers)
            if round_:
                rates[name].append(rate)
    return {name: statistics.median(values) for name, values in rates.items()}


def _lease(url: str, signer: PureSigner) -> LeaseGrant:
    proof = PeerProof("lease", signer.public_key, "native", "-", int(time.time() * 1000)).signed(signer)
    response = httpx.post(f"{url}/v1/experiments/{BENCH_EXPERIMENT}/leases", json=proof.to_wire())
    response.raise_for_status()
    return LeaseGrant.from_wire(response.json())


def _nginx_sites(root: Path, datasets: Path, edge_socket: Path, ports: dict[str, int]) -> Path:
    """The deploy site (TLS), the same site over plain HTTP, and plain nginx on the same files (TLS and
    HTTP), in one nginx.conf under ``root``."""
    cert, key = root / "cert.pem", root / "key.pem"
    self_signed_certificate(cert, key)
    (root / "acme").mkdir()
    values = derived_values(
        {
            "DTN_PUBLIC_URL": f"https://127.0.0.1:{ports['deploy_tls']}",
            "DTN_HOST": "127.0.0.1",
            "DTN_PORT": str(ports["edge"]),
            "DTN_UNIX_SOCKET": str(edge_socket),
            "DTN_NGINX_LISTEN": f"127.0.0.1:{ports['deploy_tls']}",
            "DTN_NGINX_HTTP_LISTEN": f"127.0.0.1:{ports['redirect']}",
            "DTN_NGINX_CONNECTIONS_PER_ADDRESS": "1000",
            "DTN_TLS_CERT": str(cert),
            "DTN_TLS_KEY": str(key),
            "DTN_ACME_ROOT": str(root / "acme"),
            "DTN_ACCEL_PREFIX": "/_shards/",
            "DTN_DATASETS_DIR": str(datasets),
            "DTN_PYODIDE_DIR": str(root / "no-pyodide"),
        },
        root / "bench.env",
    )
    site = render_template(
        (Path(__file__).resolve().parent.parent / "deploy/nginx/dtn.conf").read_text(), values, "dtn.conf"
    )
    # the same site over plain HTTP: its TLS server block with the TLS lines taken out
    tls_block = next(block for block in site.split("\nserver {")[1:] if " ssl http2;" in block)
    plain_server = "\nserver {" + re.sub(r"\n\s*ssl_[^\n]*", "", tls_block).replace(
        f"listen {values['DTN_NGINX_LISTEN']} ssl http2;", f"listen 127.0.0.1:{ports['deploy_http']};"
    )
    plain_files = f"""
server {{
    listen 127.0.0.1:{ports["nginx_tls"]} ssl;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3;
    sendfile on;
    tcp_nopush on;
    location /files/ {{ alias {datasets}/mnist/train/; }}
}}
server {{
    listen 127.0.0.1:{ports["nginx_http"]};
    sendfile on;
    tcp_nopush on;
    location /files/ {{ alias {datasets}/mnist/train/; }}
}}
"""
    (root / "sites.conf").write_text(site + plain_server + plain_files)
    conf = root / "nginx.conf"
    conf.write_text(standalone_nginx_conf(root / "sites.conf", root, workers=2))
    return conf


def _shard_serving(root: Path, rounds: int, seconds: int, connections: int) -> None:
    _require("wrk", "wrk")
    nginx = _require("nginx", "nginx")
    local = prepare_network(root, network=lambda key: bench_network(key, 1))
    ports = {
        name: free_port()
        for name in ("edge", "edge_bytes", "deploy_tls", "deploy_http", "redirect", "nginx_tls", "nginx_http")
    }
    conf = _nginx_sites(root / "nginx", local.datasets, root / "edge.sock", ports)
    edge_url = f"http://127.0.0.1:{ports['edge']}"
    quiet = ("--lease-ttl-s", "3600", "--no-access-log", *NO_LOOPBACK_LIMITS)
    with Fleet(root) as fleet:
        deployed = ("--accel-prefix", "/_shards/", "--unix-socket", str(root / "edge.sock"))  # as dtn.env.example
        fleet.start("edge", local.edge_argv(ports["edge"], *deployed, *quiet))
        # the edge alone, sending the bytes itself: its own state, the same datasets
        alone = [*local.edge_argv(ports["edge_bytes"], *quiet)]
        alone[alone.index("--data-dir") + 1] = str(root / "edge-alone")
        fleet.start("edge-alone", alone)
        fleet.start("nginx", [nginx, "-c", str(conf), "-p", str(conf.parent)])
        for url in (
            f"{edge_url}/healthz",
            f"http://127.0.0.1:{ports['edge_bytes']}/healthz",
            f"http://127.0.0.1:{ports['nginx_http']}/files/",
        ):
            fleet.wait_ready(url)
        for url in (edge_url, f"http://127.0.0.1:{ports['edge_bytes']}"):
            validator = local.validator(url)
            validator.ensure_genesis(local.network.experiment(BENCH_EXPERIMENT))
            validator.close()
        grants = {
            name: _lease(f"http://127.0.0.1:{ports[name]}", PureSigner(b"\x02" * 32)) for name in ("edge", "edge_bytes")
        }
        shard_id = grants["edge"].lease.shard_ids[0]
        assert grants["edge_bytes"].lease.shard_ids[0] == shard_id  # one shard per lease, the same rendezvous pick
        shard_file = f"shards/{shard_id}.safetensors"
        size = (local.datasets / "mnist/train" / shard_file).stat().st_size
        path = f"/v1/datasets/mnist/shards/{shard_id}"
        secret = {name: {LEASE_SECRET_HEADER: grant.secret} for name, grant in grants.items()}
        tls = _interleaved(
            {
                "plain nginx": (f"https://127.0.0.1:{ports['nginx_tls']}/files/{shard_file}", {}),
                "edge behind nginx": (f"https://127.0.0.1:{ports['deploy_tls']}{path}?lease={grants['edge'].lease.lease_id}", secret["edge"]),
            },
            rounds, seconds, connections,
        )  # fmt: skip
        http = _interleaved(
            {
                "plain nginx": (f"http://127.0.0.1:{ports['nginx_http']}/files/{shard_file}", {}),
                "edge behind nginx": (f"http://127.0.0.1:{ports['deploy_http']}{path}?lease={grants['edge'].lease.lease_id}", secret["edge"]),
                "edge alone": (f"http://127.0.0.1:{ports['edge_bytes']}{path}?lease={grants['edge_bytes'].lease.lease_id}", secret["edge_bytes"]),
            },
            rounds, seconds, connections,
        )  # fmt: skip
    print(
        f"shard serving: wrk, 1 thread, {connections} connections, {rounds} interleaved rounds of {seconds:g} s, one {size / 1e3:.0f} KB shard (medians):"
    )
    for label, rates in (("https, as deployed", tls), ("http", http)):
        for name, rate in rates.items():
            print(f"  {label:<19} {name:<18} {rate:8.0f} req/s {rate * size / 1e6:8.0f} MB/s")
    print(f"  ratio edge behind nginx / plain nginx, https: {tls['edge behind nginx'] / tls['plain nginx']:.2f}")
    print(f"  ratio edge behind nginx / plain nginx, http:  {http['edge behind nginx'] / http['plain nginx']:.2f}")
    print(f"  ratio edge alone (no proxy) / plain nginx, http: {http['edge alone'] / http['plain nginx']:.2f}")


async def fan_out(urls: list[str], peers: int, messages: int) -> list[float]:
    """Seconds from a publisher's relay message (on the first edge) to each subscriber's receipt;
    subscriber i joins edge ``i % len(urls)``."""

    async def join(index: int) -> ClientConnection:
        signer = PureSigner(index.to_bytes(4, "big") * 8)
        ws_url = urls[index % len(urls)].replace("http", "ws") + "/v1/relay"
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
    publisher = await join(10**6 * len(urls))  # on the first edge
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


def fan_out_line(what: str, latencies: list[float]) -> str:
    quantiles = statistics.quantiles(latencies, n=10)
    return (
        f"relay fan-out to {what} ({len(latencies)} deliveries): "
        f"p50 {statistics.median(latencies) * 1e3:.1f} ms, p90 {quantiles[8] * 1e3:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved wrk rounds per side")
    parser.add_argument("--seconds", type=int, default=3, help="length of one wrk round (whole seconds)")
    parser.add_argument("--connections", type=int, default=8, help="wrk connections")
    parser.add_argument("--peers", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--messages", type=int, default=20)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dtn-bench-"))
    _shard_serving(root / "shards", args.rounds, args.seconds, args.connections)
    local = prepare_network(root / "relay", network=lambda key: bench_network(key, 50))
    edge_port = free_port()
    edge_url = f"http://127.0.0.1:{edge_port}"
    with Fleet(root / "relay") as fleet:
        fleet.start("edge", local.edge_argv(edge_port, *NO_LOOPBACK_LIMITS))
        fleet.wait_ready(f"{edge_url}/healthz")
        for peers in args.peers:
            print(fan_out_line(f"{peers} peers", asyncio.run(fan_out([edge_url], peers, args.messages))))
    shutil.rmtree(root)  # kept, with the nodes' logs, only when something failed


if __name__ == "__main__":
    main()
