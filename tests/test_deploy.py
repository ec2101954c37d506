"""The runbook in deploy/README.md, step by step, through a real nginx on loopback.

What the runbook runs as root on a host is run here the same way, with three stand-ins: a self-signed
certificate (``python -m deploy self-signed``) for certbot's, nginx as a plain process with Debian's
``nginx.conf`` around the rendered site (``deploy.host.standalone_nginx_conf``) for the nginx service,
and each unit's ``ExecStart`` (environment file applied, as systemd does) for ``systemctl start``.
Packages (apt, pip), ``useradd``/``chown`` and the runtime's download are not repeated; the runtime
comes from ``var/pyodide`` (``--pyodide-from``) since tests do not reach the registries.

Needs nginx and openssl (``make setup`` installs them); under CI a missing one fails the test, elsewhere
it is skipped with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from deploy.host import DEPLOY, exec_start, read_env_file, standalone_nginx_conf
from lab.stack import Fleet, free_port
from protocol.messages import LEASE_SECRET_HEADER, LeaseGrant, PeerProof
from protocol.signing import PureSigner, b64encode

from .conftest import REPO
from .support import metric, now_ms

pytestmark = pytest.mark.slow  # nginx, the edge and a validator as processes, Chromium

PYTHON = sys.executable
EXPERIMENT = "study/mnist/rev-1"
OTHER_EXPERIMENT = "study/mnist-low-lr/rev-1"


def _missing(message: str) -> NoReturn:
    """Under CI (``make test`` installs everything first) a missing prerequisite fails; elsewhere it skips."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path is None:
        _missing(f"{name} is not installed (make setup: apt-get install {name})")
    return path


def _run(*argv: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{argv} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@dataclass
class Host:
    """A deployed host on loopback: its environment file, public URL and the TLS context that trusts it."""

    root: Path
    env_file: Path
    env: dict[str, str]
    public_url: str
    edge_url: str
    tls: ssl.SSLContext
    join_command: str

    def client(self, **options: object) -> httpx.Client:
        return httpx.Client(base_url=self.public_url, verify=self.tls, timeout=30, **options)  # type: ignore[arg-type]


def _configure(root: Path) -> Path:
    """Step 2: the example environment file, edited for this host (here: loopback ports, temp dirs)."""
    ports = {"edge": free_port(), "https": free_port(), "http": free_port()}
    edits = {
        "DTN_PUBLIC_URL": f"https://127.0.0.1:{ports['https']}",
        "DTN_PORT": str(ports["edge"]),
        "DTN_NGINX_LISTEN": f"127.0.0.1:{ports['https']}",
        "DTN_NGINX_HTTP_LISTEN": f"127.0.0.1:{ports['http']}",
        "DTN_TLS_CERT": str(root / "tls" / "cert.pem"),
        "DTN_TLS_KEY": str(root / "tls" / "key.pem"),
        "DTN_ACME_ROOT": str(root / "acme"),
        "DTN_UNIX_SOCKET": str(root / "run" / "dtn" / "edge.sock"),  # systemd's RuntimeDirectory=dtn
        # small, so that one client address runs out quickly below (a trainer needs 2 per window)
        "DTN_ADDRESS_CHECKS_PER_MIN": "60",
    }
    lines = []
    for line in (DEPLOY / "dtn.env.example").read_text().splitlines():
        key, equals, value = line.partition("=")
        if equals and not line.startswith("#"):
            value = edits.pop(key, value).replace("/var/lib/dtn", str(root / "var"))
        lines.append(f"{key}={value}" if equals and not line.startswith("#") else line)
    env_file = root / "etc" / "dtn.env"
    env_file.parent.mkdir(parents=True)
    env_file.write_text("\n".join([*lines, *(f"{key}={value}" for key, value in edits.items())]) + "\n")
    (root / "acme").mkdir()
    return env_file


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    nginx = _tool("nginx")
    _tool("openssl")
    runtime = REPO / "var" / "pyodide"
    if not (runtime / "pyodide-lock.json").exists():
        _missing("var/pyodide is missing (make setup assembles it)")
    root = tmp_path_factory.mktemp("vps")
    env_file = _configure(root)
    deploy = [PYTHON, "-m", "deploy"]
    _run(*deploy, "self-signed", "--env", str(env_file))  # a public host: certbot (runbook step 4)
    env_file.chmod(0o644)  # as a plain copy of the example leaves it
    prepared = _run(*deploy, "prepare", "--env", str(env_file), "--pyodide-from", str(runtime))
    assert env_file.stat().st_mode & 0o777 == 0o600  # secrets: root's alone
    join_command = prepared.strip().splitlines()[-1]
    site, units = root / "etc" / "nginx" / "sites-enabled" / "dtn.conf", root / "etc" / "systemd" / "system"
    _run(*deploy, "render", "--env", str(env_file), "--nginx-site", str(site), "--systemd-dir", str(units))
    conf = root / "nginx" / "nginx.conf"
    conf.parent.mkdir()
    conf.write_text(standalone_nginx_conf(site, conf.parent))
    _run(nginx, "-t", "-c", str(conf), "-p", str(conf.parent))
    env = read_env_file(env_file)
    public_url = env["DTN_PUBLIC_URL"]
    tls = ssl.create_default_context(cafile=env["DTN_TLS_CERT"])
    with Fleet(root) as fleet:
        fleet.start("nginx", [nginx, "-c", str(conf), "-p", str(conf.parent)])
        for unit in ("dtn-edge", "dtn-validator"):  # systemctl enable --now dtn-edge dtn-validator
            _start_unit(fleet, unit, units / f"{unit}.service", env)
        edge_url = f"http://{env['DTN_HOST']}:{env['DTN_PORT']}"
        deadline = time.monotonic() + 90
        with httpx.Client(verify=tls, timeout=5) as http:
            while True:  # runbook step 6: curl -fsS <public url>/readyz, once the genesis heads exist
                fleet.check_alive()
                try:
                    ready = http.get(f"{public_url}/readyz")
                    if ready.status_code == 200 and None not in ready.json()["windows"].values():
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the deployed edge did not become ready"
                time.sleep(0.2)
        yield Host(root, env_file, env, public_url, edge_url, tls, join_command)
        # the services stop on SIGTERM within their TimeoutStopSec
        for name in ("dtn-validator", "dtn-edge"):
            assert fleet.stop(name) in (0, -signal.SIGTERM), f"{name} did not stop cleanly"


def _start_unit(fleet: Fleet, name: str, unit: Path, env: dict[str, str]) -> None:
    """What systemd does for the unit here: its ExecStart with the environment file applied (``env``
    puts it in the process's environment), in its WorkingDirectory (the checkout, where Fleet runs)."""
    text = unit.read_text()
    assert f"WorkingDirectory={REPO}" in text and "EnvironmentFile=" in text
    fleet.start(name, ["env", *(f"{key}={value}" for key, value in env.items()), *exec_start(unit, env)])


def test_rendered_files_are_complete_and_the_units_verify(host: Host) -> None:
    site = (host.root / "etc" / "nginx" / "sites-enabled" / "dtn.conf").read_text()
    assert "{{" not in site and f"server unix:{host.env['DTN_UNIX_SOCKET']};" in site
    units = sorted((host.root / "etc" / "systemd" / "system").glob("*.service"))
    assert [unit.name for unit in units] == ["dtn-edge.service", "dtn-validator.service"]
    for unit in units:
        assert "{{" not in unit.read_text() and f"EnvironmentFile={host.env_file}" in unit.read_text()
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: the units were only parsed")
    result = subprocess.run([analyze, "verify", *map(str, units)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr


def test_the_page_and_its_runtime_through_nginx(host: Host) -> None:
    with host.client() as http:
        page = http.get("/")
        assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["strict-transport-security"] and page.headers["x-content-type-options"] == "nosniff"
        runtime = http.get("/v1/peer-runtime").json()
        for path in (
            "/static/app.js",
            "/static/worker.js",
            runtime["bundle"]["url"],
            "/portal/snapshot",
            "/v1/network",
        ):
            assert http.get(path).status_code == 200, path
        core = runtime["pyodide"]["url"]  # from nginx's disk, under the edge's content id: cached for a year
        for name, media_type in [
            ("pyodide.asm.wasm", "application/wasm"),
            ("pyodide.js", "text/javascript"),
            ("numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl", "application/octet-stream"),
        ]:
            served = http.get(f"{core}{name}")
            assert served.status_code == 200 and served.headers["content-type"] == media_type, name
            assert served.headers["cache-control"] == "public, max-age=31536000, immutable", name
        assert http.get("/pyodide/pyodide.js").status_code == 404  # never without the id
        assert http.get("/metrics").status_code == 404  # scraped on the edge's own address
        assert http.get("/livez").json() == {"live": True}
    redirect = httpx.get(f"http://{host.env['DTN_NGINX_HTTP_LISTEN']}/v1/network?x=1")
    assert redirect.status_code == 301 and redirect.headers["location"] == f"{host.public_url}/v1/network?x=1"


def test_websockets_through_nginx_check_the_public_origin(host: Host) -> None:
    asyncio.run(_websockets_check_the_public_origin(host))


async def _websockets_check_the_public_origin(host: Host) -> None:
    """With websockets' asyncio client: its sync client reads in a thread of its own while the caller
    writes, two threads on one OpenSSL connection, which OpenSSL does not support. On TLS 1.3 (nginx
    sends session tickets right after the handshake) that lost the opening request now and then: nginx
    waited for a request that never came and the handshake timed out."""
    wss = host.public_url.replace("https://", "wss://")
    for path in ("/v1/events", "/v1/relay"):
        async with connect(f"{wss}{path}", ssl=host.tls, origin=host.public_url, open_timeout=10) as ws:  # type: ignore[arg-type]
            if path == "/v1/relay":
                assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "challenge"
            else:
                await ws.send('{"type": "ping"}')
                assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "pong"
        with pytest.raises(InvalidStatus) as refused:
            async with connect(f"{wss}{path}", ssl=host.tls, origin="https://evil.example", open_timeout=10):  # type: ignore[arg-type]
                pass
        assert refused.value.response.status_code == 403


def test_shards_are_sent_by_nginx_after_the_edges_lease_check(host: Host) -> None:
    datasets = Path(host.env["DTN_DATASETS_DIR"])
    with host.client() as http:
        grant = _lease(http)
        shard_id = grant.lease.shard_ids[0]
        url = f"/v1/datasets/mnist/shards/{shard_id}"
        lease, secret = {"lease": grant.lease.lease_id}, {LEASE_SECRET_HEADER: grant.secret}
        on_disk = (datasets / "mnist" / "train" / "shards" / f"{shard_id}.safetensors").read_bytes()
        full = http.get(url, params=lease, headers=secret)
        assert full.status_code == 200 and full.content == on_disk
        etag = full.headers["etag"]
        assert etag.startswith('"sha256:') and full.headers["cache-control"] == "private, max-age=31536000, immutable"
        assert full.headers["server"] == "nginx" and full.headers["accept-ranges"] == "bytes"
        part = http.get(url, params=lease, headers={**secret, "range": "bytes=100-199"})
        assert part.status_code == 206 and part.content == on_disk[100:200] and part.headers["etag"] == etag
        assert part.headers["content-range"] == f"bytes 100-199/{len(on_disk)}"
        assert http.get(url, params=lease, headers={**secret, "if-none-match": etag}).status_code == 304
        resumed = http.get(url, params=lease, headers={**secret, "range": "bytes=100-199", "if-range": etag})
        assert resumed.status_code == 206 and resumed.content == on_disk[100:200]
        head = http.head(url, params=lease, headers=secret)
        assert head.status_code == 200 and head.headers["content-length"] == str(len(on_disk))
        # the lease check is still the edge's: nothing without the lease and its secret
        assert http.get(url, headers=secret).status_code == 401
        assert http.get(url, params=lease, headers={LEASE_SECRET_HEADER: "0" * 64}).status_code == 403
        assert http.get(url, params={"lease": "lease-forged"}, headers=secret).status_code == 403
        # the internal location is not reachable from outside, validation data never
        assert http.get(f"/_shards/mnist/train/shards/{shard_id}.safetensors").status_code == 404
        assert http.get("/_shards/mnist/validation/shards/validation-00000.safetensors").status_code == 404
    direct = httpx.get(f"{host.edge_url}{url}", params=lease, headers=secret)  # what nginx gets from the edge
    assert (
        direct.content == b""
        and direct.headers["x-accel-redirect"] == f"/_shards/mnist/train/shards/{shard_id}.safetensors"
    )


def test_rate_limits_see_the_client_address_nginx_saw(host: Host) -> None:
    """Per-address limits count the client's address, which nginx forwards and the edge believes from
    nginx only: a client cannot name another address (X-Forwarded-For is overwritten)."""
    flooder = httpx.HTTPTransport(local_address="127.0.0.2", verify=host.tls)
    bystander = httpx.HTTPTransport(local_address="127.0.0.3", verify=host.tls)
    with host.client(transport=flooder) as http:
        refused = [http.post(f"/v1/experiments/{EXPERIMENT}/leases", json=_unverifiable_proof()) for _ in range(20)]
    assert refused[0].status_code == 401 and refused[-1].status_code == 429
    assert refused[-1].json()["detail"].startswith("127.0.0.2 is over")
    with host.client(transport=bystander, headers={"x-forwarded-for": "127.0.0.2"}) as http:
        assert http.post(f"/v1/experiments/{EXPERIMENT}/leases", json=_unverifiable_proof()).status_code == 401


def test_a_trainer_on_another_machine_joins_by_the_validator_key_and_trains(host: Host) -> None:
    """Runbook step 7, as printed by ``python -m deploy prepare``: ``dtn train --edge <public url>
    --validator-key <fingerprint>``; the trainer trusts the host's certificate (SSL_CERT_FILE)."""
    dtn = Path(PYTHON).parent / "dtn"
    assert dtn.exists(), "the dtn console script is installed by `pip install -e .`"
    words = host.join_command.split()
    assert words[:4] == ["dtn", "train", "--edge", host.public_url] and words[4] == "--validator-key"
    env = {key: value for key, value in os.environ.items() if not key.startswith("DTN_")}
    env["SSL_CERT_FILE"] = host.env["DTN_TLS_CERT"]
    storage = host.root / "remote-trainer"
    train = [str(dtn), *words[1:], "--storage", str(storage), "--windows", "2", "--experiment", EXPERIMENT]
    result = subprocess.run(train, cwd=host.root, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "include the pinned key" in result.stderr and result.stdout.count("published") == 2
    wrong = [*train[:5], "0123456789abcdef", *train[6:]]
    refused = subprocess.run(wrong, cwd=host.root, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "none is the pinned validator 0123456789abcdef" in refused.stderr
    # the validator judged the remote trainer's candidates; Prometheus sees it on the edge's address
    deadline = time.monotonic() + 60
    while True:
        metrics = httpx.get(f"{host.edge_url}/metrics").text
        accepted = metric(metrics, "dtn_verdicts_total", decision="accepted", experiment=str(EXPERIMENT))
        if accepted >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert accepted >= 2, metrics
    assert metric(metrics, "dtn_window", experiment=str(EXPERIMENT)) >= 2
    assert metric(metrics, "dtn_shard_bytes_total") > 0 and metric(metrics, "dtn_leases_total") >= 2


def test_the_web_page_in_chromium_on_the_public_url(host: Host) -> None:
    _tool("npx")
    if not (REPO / "node_modules" / "@playwright" / "test").exists():
        _missing("node_modules has no @playwright/test (make setup: npm ci)")
    env = dict(os.environ, DTN_PUBLIC_URL=host.public_url)
    result = subprocess.run(
        ["npx", "playwright", "test", "--config", "deploy/playwright.config.ts"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def _lease(http: httpx.Client) -> LeaseGrant:
    """A lease in the other experiment, which the trainer below does not train (it would hold the
    trainer's window open until the deadline)."""
    signer = PureSigner(os.urandom(32))
    proof = PeerProof("lease", signer.public_key, "native", "-", now_ms()).signed(signer)
    response = http.post(f"/v1/experiments/{OTHER_EXPERIMENT}/leases", json=proof.to_wire())
    assert response.status_code == 200, response.text
    return LeaseGrant.from_wire(response.json())


def _unverifiable_proof() -> dict[str, object]:
    """A current lease proof whose signature does not verify: counted against its address, then refused."""
    signer = PureSigner(b"\x55" * 32)
    wire = PeerProof("lease", signer.public_key, "native", "-", now_ms()).signed(signer).to_wire()
    wire["signature"] = b64encode(b"\x00" * 64)
    return wire
