"""Host the edge on a VPS: one environment file (``dtn.env.example``) configures nginx, the systemd
units and the edge itself; ``python -m deploy`` turns it into files and host state.

    render   the nginx site (``nginx/dtn.conf``) and the units (``systemd/*.service``), every
             ``{{NAME}}`` filled in from the environment file and the values derived from it
    prepare  the host's state: MNIST under DTN_DATASETS_DIR, the validator identity and network
             manifest (DTN_NETWORK), the Pyodide runtime (Python alone, from the registries, or a
             shipped copy), file modes that let nginx read only what it serves; prints the join command
    join     the command a trainer on another machine runs (the edge's URL and the validator's pin)
    self-signed  a throwaway certificate for DTN_PUBLIC_URL's host, for a machine without a domain

``standalone_nginx_conf`` wraps a rendered site in a complete nginx.conf for running nginx as a plain
process (tests and benchmarks on loopback; on a host, Debian's /etc/nginx/nginx.conf does this).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import stat
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

__all__ = [
    "DEPLOY",
    "REPO",
    "derived_values",
    "exec_start",
    "main",
    "read_env_file",
    "render",
    "render_template",
    "self_signed_certificate",
    "standalone_nginx_conf",
    "upstream_servers",
]

log = logging.getLogger(__name__)

DEPLOY = Path(__file__).resolve().parent
REPO = DEPLOY.parent
NGINX_SITE = DEPLOY / "nginx" / "dtn.conf"
UNITS = tuple(sorted((DEPLOY / "systemd").glob("*.service")))
# connections per nginx worker (each proxied request or WebSocket takes two): what a few flooding
# addresses' slow connections must not use up before nginx's timeouts close them (deploy/README.md)
NGINX_WORKER_CONNECTIONS = 4096
_PLACEHOLDER = re.compile(r"\{\{([A-Z0-9_]+)\}\}")
_SHELL_VARIABLE = re.compile(r"\$\{([A-Za-z0-9_]+)\}")
_UPSTREAM = re.compile(r"unix:/[^\s;{}'\"]+|(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}")


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines as systemd's ``EnvironmentFile=`` reads them (``#``/``;`` comments, blank
    lines, values optionally in matching quotes; no inline comments, no expansion)."""
    values: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, equals, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not equals or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise SystemExit(f"{path}:{number}: not KEY=VALUE: {raw!r}")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    return values


def derived_values(env: Mapping[str, str], env_file: Path) -> dict[str, str]:
    """The environment file's values plus what the templates derive from them."""
    public_url = env.get("DTN_PUBLIC_URL", "")
    parts = urlsplit(public_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SystemExit(f"{env_file}: DTN_PUBLIC_URL must be https://host[:port], not {public_url!r}")
    host, port = env.get("DTN_HOST", "127.0.0.1"), env.get("DTN_PORT", "8000")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    # nginx reaches the edge on its unix socket when it has one (cheaper than TCP), else on host:port;
    # DTN_NGINX_UPSTREAMS lists several edges sharing one state instead
    upstreams = upstream_servers(env.get("DTN_NGINX_UPSTREAMS", ""), env_file)
    if not upstreams:
        upstreams = [f"unix:{env['DTN_UNIX_SOCKET']}" if env.get("DTN_UNIX_SOCKET") else address]
    return {
        **env,
        "SERVER_NAME": parts.hostname,
        "PUBLIC_ORIGIN": f"{parts.scheme}://{parts.netloc}",
        "EDGE_ADDRESS": address,
        "EDGE_UPSTREAM_SERVERS": "\n".join(f"    server {upstream};" for upstream in upstreams),
        "INSTALL_DIR": str(REPO),
        "ENV_FILE": str(env_file.resolve()),
        "PYTHON": sys.executable,
    }


def upstream_servers(value: str, env_file: Path) -> list[str]:
    """``DTN_NGINX_UPSTREAMS``: edges as ``host:port``, ``[v6]:port`` or ``unix:/path``, separated by
    commas or spaces; ``SystemExit`` naming an entry nginx would not take."""
    servers = [entry for entry in re.split(r"[,\s]+", value.strip()) if entry]
    for server in servers:
        if not _UPSTREAM.fullmatch(server):
            raise SystemExit(f"{env_file}: DTN_NGINX_UPSTREAMS: {server!r} is not host:port or unix:/path")
    if len(set(servers)) != len(servers):
        raise SystemExit(f"{env_file}: DTN_NGINX_UPSTREAMS names an edge twice")
    return servers


def render_template(template: str, values: Mapping[str, str], name: str) -> str:
    """``template`` with every ``{{NAME}}`` replaced; ``SystemExit`` naming any value that is missing."""
    missing = sorted({key for key in _PLACEHOLDER.findall(template) if not values.get(key)})
    if missing:
        raise SystemExit(f"{name} needs {', '.join(missing)} in the environment file")
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


def render(env_file: Path, nginx_site: Path, systemd_dir: Path) -> list[Path]:
    """Write the nginx site to ``nginx_site`` and the units into ``systemd_dir``; returns the files."""
    values = derived_values(read_env_file(env_file), env_file)
    written = []
    for template, target in [(NGINX_SITE, nginx_site), *((unit, systemd_dir / unit.name) for unit in UNITS)]:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render_template(template.read_text(), values, template.name))
        written.append(target)
    return written


def exec_start(unit: Path, env: Mapping[str, str]) -> list[str]:
    """A rendered unit's ``ExecStart`` as argv, ``${NAME}`` expanded from ``env`` as systemd does."""
    for line in unit.read_text().splitlines():
        if line.startswith("ExecStart="):
            command = _SHELL_VARIABLE.sub(lambda match: env.get(match.group(1), ""), line.removeprefix("ExecStart="))
            return shlex.split(command)
    raise SystemExit(f"{unit} has no ExecStart")


def standalone_nginx_conf(site: Path, prefix: Path, *, workers: int = 1) -> str:
    """A complete nginx.conf running ``site`` as a plain foreground process with everything it writes
    under ``prefix`` (the part of Debian's /etc/nginx/nginx.conf a site relies on), with the
    connections deploy/README.md asks of a host's nginx.conf (``NGINX_WORKER_CONNECTIONS``)."""
    temp = "\n".join(
        f"    {kind}_temp_path {prefix / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    user = "user root;\n" if os.geteuid() == 0 else ""  # as root, workers read the test's private temp dirs
    return f"""daemon off;
{user}worker_processes {workers};
worker_rlimit_nofile {2 * NGINX_WORKER_CONNECTIONS};
pid {prefix / "nginx.pid"};
error_log {prefix / "error.log"} warn;
events {{
    worker_connections {NGINX_WORKER_CONNECTIONS};
}}
http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    access_log off;
{temp}
    include {site};
}}
"""


def self_signed_certificate(cert: Path, key: Path, host: str = "127.0.0.1") -> None:
    """A throwaway certificate for ``host`` (an IP address or a name) made with ``openssl``, for trying
    the deployment on loopback or a machine without a domain (browsers warn; trainers need
    ``SSL_CERT_FILE=<cert>``). A public host uses a CA's (certbot)."""
    for path in (cert, key):
        path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))  # the key is never readable by others
    key.chmod(0o600)  # a key file that was there before
    san = f"IP:{host}" if re.fullmatch(r"[0-9.]+|[0-9a-fA-F:]*:[0-9a-fA-F:]*", host) else f"DNS:{host}"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "30", "-subj", f"/CN={host}", "-addext", f"subjectAltName={san}",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip


def _readable_by_others(path: Path) -> None:
    """Let nginx (another user) read ``path``'s tree: o+r on files, o+rx on directories."""
    for item in [path, *path.rglob("*")]:
        mode = item.stat().st_mode
        item.chmod(mode | stat.S_IROTH | (stat.S_IXOTH if item.is_dir() else 0))


def prepare(env_file: Path, pyodide_from: Path | None) -> None:
    from datasets import mnist
    from protocol.manifests import NetworkManifest
    from protocol.network_pins import fingerprint
    from tools.networks import write_network
    from tools.pyodide_runtime import copy_runtime, prepare_runtime

    env = read_env_file(env_file)
    if env_file.stat().st_mode & 0o077:  # it may hold tokens and database passwords: root's alone
        log.info("the environment file %s was readable by others; now 0600", env_file)
        env_file.chmod(0o600)
    datasets = Path(env["DTN_DATASETS_DIR"])
    network_path = Path(env["DTN_NETWORK"])
    validator = Path(env["DTN_VALIDATOR_STORAGE"])
    pyodide = Path(env["DTN_PYODIDE_DIR"])
    mnist.prepare(datasets)
    if network_path.exists():
        network = NetworkManifest.from_wire(json.loads(network_path.read_bytes()))
        log.info("keeping the network manifest %s", network_path)
    else:
        network = write_network([validator], network_path, env.get("DTN_NETWORK_ID", "public"), datasets=datasets)
    if pyodide_from is not None:
        copy_runtime(pyodide_from, pyodide)
    elif _runtime_complete(pyodide):
        log.info("keeping the Pyodide runtime in %s (every file checked)", pyodide)
    else:
        prepare_runtime(
            pyodide, REPO / "node_modules", None, core="npm-registry", package_lock=REPO / "package-lock.json"
        )
    # nginx reads the runtime and the train splits (only through the edge's X-Accel-Redirect); the
    # validators' splits and the services' own state stay private to the service user
    datasets.chmod(datasets.stat().st_mode | stat.S_IXOTH)
    for split in sorted(datasets.glob("*/*")):
        if split.is_dir() and split.name != "train":
            split.chmod(0o750)
    for train in sorted(datasets.glob("*/train")):
        _readable_by_others(train)
        train.parent.chmod(train.parent.stat().st_mode | stat.S_IXOTH)
    _readable_by_others(pyodide)
    for private in (Path(env["DTN_DATA_DIR"]), validator):
        private.mkdir(parents=True, exist_ok=True)
        private.chmod(0o700)
    print(f"network {network.network_id}: validators {[fingerprint(key) for key in network.validator_keys]}")
    print(join_command(env))


def _runtime_complete(runtime: Path) -> bool:
    from tools.pyodide_runtime import verify_runtime

    try:
        verify_runtime(runtime)
    except (SystemExit, OSError, KeyError, ValueError):
        return False
    return True


def join_command(env: Mapping[str, str]) -> str:
    """What a trainer on another machine runs to join: the public URL and the validators' pins."""
    from protocol.manifests import NetworkManifest
    from protocol.network_pins import fingerprint

    network = NetworkManifest.from_wire(json.loads(Path(env["DTN_NETWORK"]).read_bytes()))
    pins = " ".join(f"--validator-key {fingerprint(key)}" for key in network.validator_keys)
    return f"dtn train --edge {env['DTN_PUBLIC_URL']} {pins}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m deploy", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    env = argparse.ArgumentParser(add_help=False)
    env.add_argument("--env", type=Path, default=Path("/etc/dtn/dtn.env"), help="the environment file")

    rendering = sub.add_parser("render", parents=[env], help="write the nginx site and the systemd units")
    rendering.add_argument("--nginx-site", type=Path, default=Path("/etc/nginx/sites-enabled/dtn.conf"))
    rendering.add_argument("--systemd-dir", type=Path, default=Path("/etc/systemd/system"))

    preparing = sub.add_parser("prepare", parents=[env], help="datasets, network manifest, Pyodide runtime, modes")
    preparing.add_argument(
        "--pyodide-from",
        type=Path,
        default=None,
        help="install this runtime (assembled elsewhere, every file checked) instead of assembling it from the registries",
    )
    sub.add_parser("join", parents=[env], help="print the command a remote trainer runs to join")
    sub.add_parser(
        "self-signed",
        parents=[env],
        help="write a self-signed certificate to DTN_TLS_CERT/DTN_TLS_KEY for DTN_PUBLIC_URL's host (no domain yet)",
    )

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "render":
        for path in render(args.env, args.nginx_site, args.systemd_dir):
            print(f"wrote {path}")
    elif args.command == "prepare":
        prepare(args.env, args.pyodide_from)
    elif args.command == "self-signed":
        values = read_env_file(args.env)
        host = urlsplit(values.get("DTN_PUBLIC_URL", "")).hostname or "127.0.0.1"
        self_signed_certificate(Path(values["DTN_TLS_CERT"]), Path(values["DTN_TLS_KEY"]), host)
        print(f"wrote a self-signed certificate for {host} to {values['DTN_TLS_CERT']}")
    else:
        print(join_command(read_env_file(args.env)))
