"""Edge settings. Every field has a CLI flag (``--data-dir``) and an environment variable
(``DTN_DATA_DIR``); flags win. The embedded default needs no external service: a local directory
and SQLite.

Several edges behind one proxy share their state: ``store_url`` (PostgreSQL: heads, candidates,
verdicts, leases, tokens), ``redis_url`` (Redis: event fan-out and relay messages across edges, rate
limits) and ``blobs_dir`` (one artifact directory they all mount) or ``blobs_url`` (an S3-compatible
bucket; ``blobs_dir`` then holds each edge's cached copies).

Behind a reverse proxy (``deploy/``): ``host``/``port`` are the bind address the proxy forwards to,
``public_url`` the address browsers and remote trainers use (its origin may open the WebSockets),
``forwarded_allow_ips`` the proxy addresses whose ``X-Forwarded-For``/``-Proto`` name the real client
(per-address rate limits then count real clients) and ``accel_prefix`` the proxy's internal location
that serves shard files once the edge has checked the lease (``X-Accel-Redirect``)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from protocol.edge_urls import edge_urls
from protocol.errors import InvalidMessage
from protocol.ice import ice_urls, is_turn
from protocol.leases import ARREARS_WINDOWS
from protocol.uploads import UPLOAD_CHUNK_BYTES

from .ice import IceIssuer, read_turn_secret

__all__ = ["Settings"]

# What an honest trainer asks of the edge per window of each experiment it trains: one lease and one
# candidate upload. The default per-peer budget of an experiment covers honest trainers at windows
# as short as SHORTEST_WINDOW_S: a lone trainer's network on 2 cores promotes 230–270 heads a minute
# (0.22–0.26 s a window), and a trainer past its budget backs off for seconds.
REQUESTS_PER_WINDOW = 2
SHORTEST_WINDOW_S = 0.1
# a TURN credential outlives a page's refresh (at half of it, checked every heartbeat) and is short-lived
MIN_TURN_TTL_S, MAX_TURN_TTL_S = 300.0, 86_400.0

_HELP = {
    "host": "interface to listen on",
    "port": "TCP port (0 picks a free one)",
    "data_dir": "edge state: SQLite database and artifact blobs",
    "datasets_dir": "prepared datasets (<dir>/<dataset>/train/fetch-manifest.json); only train is served",
    "network": "network manifest JSON (validator keys, experiments); the edge fills in its own key",
    "static_dir": "the web app",
    "pyodide_dir": "self-hosted Pyodide runtime prepared by `python -m tools pyodide-runtime`",
    "max_artifact_bytes": "largest candidate or head artifact accepted (staged in chunks when over max_inline_bytes); each experiment's model sets its own, lower limit",
    "max_inline_bytes": "largest artifact carried in one request body; larger ones are staged in chunks (uploads)",
    "max_frame_bytes": "largest WebSocket frame; larger frames are closed with 1009",
    "lease_ttl_s": "how long a lease stays valid at most (a lease lives no longer than its window: window_timeout_s)",
    "lease_release_grace_s": "seconds after a peer's relay connection closes before the leases it took over it and did "
    "not deliver are given back, unless it joined again meanwhile",
    "join_timeout_s": "time a WebSocket peer has to answer the join challenge",
    "idle_timeout_s": "a joined peer silent this long (no message, no ping) is closed with 4408",
    "send_queue_size": "outgoing messages buffered per connection before it is closed as a slow consumer",
    "messages_per_s": "sustained messages per second a connection may send (burst: 4x)",
    "max_long_poll_s": "longest a long-poll (a head, the activity token) may wait",
    "peer_requests_per_min": f"lease requests and candidate uploads per minute one peer may make in one experiment (burst: a quarter); the default fits an honest trainer's {REQUESTS_PER_WINDOW} per window at one window per {SHORTEST_WINDOW_S} s",
    "header_timeout_s": "a request's headers must arrive within this, however slowly they trickle",
    "body_timeout_s": "a request body must arrive within this after its headers",
    "max_connections": "open connections (HTTP and WebSocket); lowered to what the file-descriptor limit allows; at the cap the address holding the most gives way to a newcomer from another",
    "allowed_origins": "browser origins (scheme://host[:port], comma-separated; * for any) that may open the WebSockets besides the edge's own (an Origin whose host[:port] is the request's Host); behind a proxy that rewrites Host, list the public origin",
    "max_connections_per_address": "open connections from one client address, an IPv6 /64 counting as one (behind a proxy: set it high)",
    "reserved_connections": "connections past max_connections on which only /healthz, /livez and /readyz are answered",
    # native verification's cost per signature: docs/results/2026-12-signatures.md
    "address_checks_per_min": "signed joins, lease requests and uploads per minute from one client address, counted before their signatures are checked (burst: a quarter); bounds the CPU a flood of bad signatures costs (native verification: about 0.1 ms each)",
    "window_quota_bytes": "candidate bytes the edge stores per window of an experiment; uploads past it get 507",
    "validator_proposals_per_window": "heads one validator key may propose per window of an experiment (an honest one proposes one); past it 429",
    "validator_window_bytes": "bytes of proposed heads and outer optimizer states one validator key may store per window of an experiment; past it 413 (0: two artifacts of the model per proposal)",
    "upload_chunk_bytes": "largest chunk of a staged upload (PUT /v1/experiments/<key>/uploads/<cid>, for artifacts too large for one request); larger chunks get 413",
    "upload_address_bytes": "bytes of staged uploads one client address may hold on this edge at once (each counts its whole size, at least one chunk); past it 507",
    "upload_stage_bytes": "bytes of staged uploads this edge holds at once, all clients together (each counts its whole size, at least one chunk); past it 507",
    "upload_idle_s": "a staged upload (partial, or complete but not published) untouched this long is dropped",
    "upload_min_bytes_per_s": "the pace a staged upload pays for its reservation with: once behind it past --upload-grace-s (stalled, or complete and not published), it gives way to a new upload that needs its room",
    "upload_grace_s": "seconds a staged upload may hold its reservation before it must keep --upload-min-bytes-per-s",
    "candidate_retention_windows": "candidate artifacts are deleted once their window is this many heads behind the current one (0: keep all)",
    "lease_retention_windows": "leases, their holders and release marks are forgotten once their window is this many heads behind the current one; at least the windows whose lapsed leases cost their holders priority (0: keep all)",
    "public_url": "the edge's public URL as browsers and remote trainers reach it (https://host[:port], no path; behind a proxy: the proxy's); its origin may open the WebSockets",
    "forwarded_allow_ips": "addresses (comma-separated; * for any) of proxies whose X-Forwarded-For and X-Forwarded-Proto name the real client: per-address limits then see the client, not the proxy; empty: trust none",
    "unix_socket": "also listen on this unix socket (for a proxy on the same host: cheaper than TCP); connections on it are trusted like forwarded_allow_ips",
    "access_log": "log every request (behind a proxy that logs them, turn it off: --no-access-log or DTN_ACCESS_LOG=0)",
    "store_url": "PostgreSQL URL (postgresql://user@host:port/db) of a store several edges share; empty: SQLite in data_dir",
    "redis_url": "Redis URL (redis://host:port/db) through which several edges share events, relay messages and rate limits; empty: in this process only",
    "blobs_dir": "artifact files (several edges: one shared directory); empty: data_dir/blobs",
    "blobs_url": "s3://bucket/prefix of an S3-compatible store several edges share (endpoint and credentials: "
    "the AWS_* environment); blobs_dir then holds this edge's cached copies",
    "follow": "URLs (comma-separated) of edges of this network that this edge follows: it mirrors their canonical heads, artifacts, candidates and verdicts, each verified against this network's validators (server.follower), from the first that answers; empty: it follows none",
    "follow_tokens_file": 'file with a line "<followed edge URL> <admission token>" for each followed edge that asks for admission: the token (role mirror, issued by that edge\'s operator) this edge shows it to read candidates; empty: none',
    "mirrors": "public URLs (comma-separated) of the other edges of this network, told to browser pages (the relay welcome) so that a page can be moved to one when this edge is gone",
    "ice_servers": "STUN/TURN URIs (comma-separated: stun:host[:port], turn:host[:port][?transport=udp|tcp], stuns:, turns:; no credentials in them) that browser pages use to reach each other for heads beyond one LAN (the relay welcome); empty: host candidates only",
    "turn_secret_file": "file holding the secret shared with the TURN servers of ice_servers (coturn: use-auth-secret, static-auth-secret): each relay connection is given its own credential, valid turn_credential_ttl_s; required with a turn: URL",
    "turn_credential_ttl_s": f"how long a TURN credential the edge issues stays valid ({MIN_TURN_TTL_S:.0f} to {MAX_TURN_TTL_S:.0f}); pages ask for a new one at half of it",
    "ice_relay_only": "pages connect to each other only through the TURN servers of ice_servers (iceTransportPolicy relay): no tab learns another's address",
    "accel_prefix": "serve shard bytes through the reverse proxy: after the lease check the edge answers X-Accel-Redirect: <prefix><dataset>/<split>/<locator> (an internal location of the proxy, e.g. /_shards/) instead of the bytes; empty: the edge sends the bytes itself",
}

_ACCEL_PREFIX = re.compile(r"/(?:[A-Za-z0-9_-]+/)+")


def _flag(env: str, value: object) -> bool:
    """A boolean setting's value: ``value`` itself, or its environment text (1/0, true/false, yes/no, on/off)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise SystemExit(f"{env}={value!r}: expected 1/0, true/false, yes/no or on/off")
    return text in ("1", "true", "yes", "on")


def _scheme(url: str) -> str:
    """What a refused URL is, without the rest of it (it may hold a password)."""
    return f"{urlsplit(url).scheme}://..." if "://" in url else "a URL without a scheme"


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = Path("var/edge")
    datasets_dir: Path = Path("var/datasets")
    network: Path = Path("var/network.json")
    static_dir: Path = Path(__file__).resolve().parent.parent / "static"
    pyodide_dir: Path = Path("var/pyodide")
    max_artifact_bytes: int = 1024 * 1024 * 1024
    max_inline_bytes: int = 8 * 1024 * 1024
    max_frame_bytes: int = 9 * 1024 * 1024
    lease_ttl_s: float = 300.0
    lease_release_grace_s: float = 0.5
    join_timeout_s: float = 10.0
    idle_timeout_s: float = 90.0
    send_queue_size: int = 256
    messages_per_s: float = 50.0
    max_long_poll_s: float = 30.0
    peer_requests_per_min: float = REQUESTS_PER_WINDOW * 60 / SHORTEST_WINDOW_S
    address_checks_per_min: float = 3000.0
    window_quota_bytes: int = 256 * 1024 * 1024
    validator_proposals_per_window: int = 2
    validator_window_bytes: int = 0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 120.0
    max_connections: int = 4096
    max_connections_per_address: int = 256
    reserved_connections: int = 16
    candidate_retention_windows: int = 2
    lease_retention_windows: int = 64
    upload_chunk_bytes: int = UPLOAD_CHUNK_BYTES
    upload_address_bytes: int = 64 * 1024 * 1024
    upload_stage_bytes: int = 1024 * 1024 * 1024
    upload_idle_s: float = 600.0
    upload_min_bytes_per_s: float = 64 * 1024
    upload_grace_s: float = 10.0
    allowed_origins: str = ""
    public_url: str = ""
    forwarded_allow_ips: str = "127.0.0.1,::1"
    accel_prefix: str = ""
    unix_socket: str = ""
    access_log: bool = True
    store_url: str = ""
    redis_url: str = ""
    blobs_dir: str = ""
    blobs_url: str = ""
    follow: str = ""
    follow_tokens_file: str = ""
    mirrors: str = ""
    ice_servers: str = ""
    turn_secret_file: str = ""
    turn_credential_ttl_s: float = 3600.0
    ice_relay_only: bool = False

    def __post_init__(self) -> None:
        if self.public_url:
            parts = urlsplit(self.public_url)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
                raise ValueError(
                    f"public_url {self.public_url!r} must be http(s)://host[:port] (the edge serves at the root)"
                )
            origin = f"{parts.scheme}://{parts.netloc}".lower()
            listed = {entry.strip().rstrip("/").lower() for entry in self.allowed_origins.split(",") if entry.strip()}
            if origin not in listed:  # the public page's origin may open the WebSockets (idempotent under replace())
                object.__setattr__(self, "allowed_origins", ",".join(filter(None, [self.allowed_origins, origin])))
        if self.store_url and urlsplit(self.store_url).scheme not in ("postgresql", "postgres"):
            raise ValueError(
                f"store_url must be a postgresql:// URL (or empty for SQLite), not {_scheme(self.store_url)}"
            )
        if self.redis_url and urlsplit(self.redis_url).scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"redis_url must be a redis://, rediss:// or unix:// URL, not {_scheme(self.redis_url)}")
        if self.blobs_url and urlsplit(self.blobs_url).scheme != "s3":
            raise ValueError(f"blobs_url must be an s3://bucket/prefix URL, not {_scheme(self.blobs_url)}")
        for name in ("follow", "mirrors"):
            try:
                edge_urls(getattr(self, name))
            except InvalidMessage as exc:
                raise ValueError(f"{name}: {exc}") from None
        if 0 < self.lease_retention_windows < ARREARS_WINDOWS:
            raise ValueError(
                f"lease_retention_windows must be 0 (keep all) or at least {ARREARS_WINDOWS}: the windows whose"
                " lapsed leases cost their holders priority"
            )
        if self.accel_prefix and not _ACCEL_PREFIX.fullmatch(self.accel_prefix):
            raise ValueError(f"accel_prefix {self.accel_prefix!r} must look like /_shards/ (letters, digits, _ and -)")
        self.ice  # noqa: B018 - validates the ICE settings (and reads the TURN secret) now, not at the first page
        self.follow_tokens  # noqa: B018 - reads and checks the tokens file now, not at the first follow

    @property
    def ice(self) -> IceIssuer:
        """What pages are told about ICE servers (``ice_servers`` and the TURN settings), checked."""
        try:
            urls = ice_urls(self.ice_servers)
        except InvalidMessage as exc:
            raise ValueError(f"ice_servers: {exc}") from None
        turn = any(is_turn(url) for url in urls)
        if turn != bool(self.turn_secret_file):
            raise ValueError("a turn: URL in ice_servers and turn_secret_file go together: one needs the other")
        if self.ice_relay_only and not turn:
            raise ValueError("ice_relay_only needs a turn: URL in ice_servers")
        if not MIN_TURN_TTL_S <= self.turn_credential_ttl_s <= MAX_TURN_TTL_S:
            raise ValueError(f"turn_credential_ttl_s must be within [{MIN_TURN_TTL_S:.0f}, {MAX_TURN_TTL_S:.0f}]")
        secret = read_turn_secret(Path(self.turn_secret_file)) if turn else b""
        return IceIssuer(tuple(urls), secret, self.turn_credential_ttl_s, self.ice_relay_only)

    @property
    def followed(self) -> list[str]:
        """The edges this edge follows, in order (``follow``)."""
        return edge_urls(self.follow)

    @property
    def follow_tokens(self) -> dict[str, str]:
        """The admission token to show each followed edge that has one (``follow_tokens_file``)."""
        return _read_follow_tokens(Path(self.follow_tokens_file)) if self.follow_tokens_file else {}

    @property
    def mirror_urls(self) -> list[str]:
        """The other edges of this network browser pages are told about (``mirrors``)."""
        return edge_urls(self.mirrors)

    @property
    def blobs_root(self) -> Path:
        """Where artifact files live: ``blobs_dir``, or ``data_dir/blobs``."""
        return Path(self.blobs_dir) if self.blobs_dir else self.data_dir / "blobs"

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> Settings:
        parser = argparse.ArgumentParser(prog="python -m server", description="Run the bootstrap / browser edge.")
        for f in dataclasses.fields(cls):
            env = f"DTN_{f.name.upper()}"
            default = os.environ.get(env, f.default)
            if isinstance(f.default, bool):
                parser.add_argument(
                    f"--{f.name.replace('_', '-')}",
                    action=argparse.BooleanOptionalAction,
                    default=_flag(env, default),
                    help=f"{_HELP[f.name]} (env {env}=1/0, default {'on' if f.default else 'off'})",
                )
                continue
            parser.add_argument(
                f"--{f.name.replace('_', '-')}",
                type=type(f.default),
                default=type(f.default)(default),  # type: ignore[call-arg]
                help=f"{_HELP[f.name]} (env {env}, default {f.default})",
            )
        args = parser.parse_args(argv)
        try:
            return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
        except ValueError as exc:
            parser.error(str(exc))


MAX_TOKENS_FILE_BYTES = 64 * 1024
_TOKEN = re.compile(r"[A-Za-z0-9_\-]{16,128}")


def _read_follow_tokens(path: Path) -> dict[str, str]:
    """``follow_tokens_file``: a line ``<edge URL> <token>`` each (blank lines and ``#`` comments left
    out), URLs as ``follow`` reads them; a ``ValueError`` that names the file and line, never a token."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_TOKENS_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"follow_tokens_file {str(path)!r} cannot be read: {exc.strerror}") from None
    if len(data) > MAX_TOKENS_FILE_BYTES:
        raise ValueError(f"follow_tokens_file {str(path)!r} is larger than {MAX_TOKENS_FILE_BYTES} bytes")
    tokens: dict[str, str] = {}
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        try:
            urls = edge_urls(fields[0]) if len(fields) == 2 and _TOKEN.fullmatch(fields[1]) else []
        except InvalidMessage:
            urls = []
        if len(urls) != 1:
            raise ValueError(f'follow_tokens_file {str(path)!r} line {number}: expected "<edge URL> <admission token>"')
        tokens[urls[0]] = fields[1]
    return tokens
