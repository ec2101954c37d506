"""Private PostgreSQL, Redis and TURN (coturn) servers for edges on one machine (tests and benchmarks).

Each runs as a plain process on a free loopback port with everything it writes in a temporary
directory, removed when it stops; no system service is touched. PostgreSQL refuses to run as root,
so as root the cluster is created and run as the ``postgres`` user that Debian's package adds. On a
host, use the distribution's services instead (docs/scale-out.md).

    with PrivatePostgres() as postgres, PrivateRedis() as redis:
        store_url = postgres.create_database("edges")   # DTN_STORE_URL
        redis_url = redis.url                            # DTN_REDIS_URL
    with PrivateTurn() as turn:
        ice_servers = turn.url                           # DTN_ICE_SERVERS
        turn_secret_file = turn.secret_file              # DTN_TURN_SECRET_FILE
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import psycopg
import redis
from psycopg import sql

from lab.stack import free_port

__all__ = ["PrivatePostgres", "PrivateRedis", "PrivateTurn", "ServiceMissing", "postgres_bin"]

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
POSTGRES_USER = "dtn"


class ServiceMissing(RuntimeError):
    """A server program is not installed (``make setup`` installs them: apt ``postgresql redis-server``)."""


def postgres_bin() -> Path:
    """The directory of the newest installed PostgreSQL's ``initdb`` and ``postgres``."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise ServiceMissing("PostgreSQL is not installed (apt-get install postgresql)")
    return Path(initdb).resolve().parent


class _Server:
    """A server process with its directory; subclasses say how to start it and when it answers."""

    name = "server"

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"dtn-{self.name}-"))
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log = self.root / f"{self.name}.log"
        self.user: str | None = None  # run as this user (PostgreSQL, as root)

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _answers(self) -> bool:
        raise NotImplementedError

    def start(self) -> _Server:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self._argv(), stdout=log, stderr=subprocess.STDOUT, cwd=self.root, user=self.user, group=self.user
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not start:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.1)
        return self

    def halt(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # PostgreSQL: fast shutdown; Redis: shut down
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def restart(self) -> None:
        """Shut the server down and start it again on its data and port (clients lose their connections)."""
        self.halt()
        self.start()

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.root, ignore_errors=True)

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()


class PrivatePostgres(_Server):
    """A throwaway cluster (trust authentication for user ``dtn``, no fsync: data is not kept)."""

    name = "postgres"

    def __init__(self) -> None:
        self.bin = postgres_bin()
        super().__init__()
        if os.geteuid() == 0:  # initdb and postgres refuse root
            owner = pwd.getpwnam("postgres")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self.user = owner.pw_name
        subprocess.run(
            [str(self.bin / "initdb"), "-D", str(self.root / "data"), "-A", "trust", "-U", POSTGRES_USER,
             "-E", "UTF8", "--no-sync"],
            check=True, capture_output=True, timeout=120, cwd=self.root, user=self.user, group=self.user,
        )  # fmt: skip

    def _argv(self) -> list[str]:
        return [
            str(self.bin / "postgres"), "-D", str(self.root / "data"), "-k", str(self.root),
            "-p", str(self.port), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
            "-c", "max_connections=200",
        ]  # fmt: skip

    def _answers(self) -> bool:
        try:
            psycopg.connect(self.url("postgres"), connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    def url(self, database: str) -> str:
        return f"postgresql://{POSTGRES_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, database: str) -> str:
        """A new, empty database; its URL."""
        with psycopg.connect(self.url("postgres"), autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        return self.url(database)

    def __enter__(self) -> PrivatePostgres:
        self.start()
        return self


class PrivateRedis(_Server):
    """A throwaway ``redis-server`` (nothing persisted)."""

    name = "redis"

    def __init__(self) -> None:
        server = shutil.which("redis-server")
        if server is None:
            raise ServiceMissing("redis-server is not installed (apt-get install redis-server)")
        self.server = server
        super().__init__()

    def _argv(self) -> list[str]:
        return [self.server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.root)]  # fmt: skip

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_timeout=2).ping())
        except redis.ConnectionError:
            return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> PrivateRedis:
        self.start()
        return self


class PrivateTurn(_Server):
    """A throwaway coturn ``turnserver`` on loopback (UDP and TCP on ``port``, relay ports from its own
    range), checking TURN REST API credentials (``use-auth-secret``) against a secret of its own in
    ``secret_file``; verbose, its log names every allocation and what it relayed (``peer usage``, written
    when an allocation ends). An allocation lives at most ``ALLOCATION_S`` without a refresh, so a client
    that vanished without releasing its relay is reported within that, not at the default 600 s.
    Loopback peers are allowed: the tabs it relays for are on this machine."""

    name = "turn"
    RELAY_PORTS = 64
    ALLOCATION_S = 20

    def __init__(self) -> None:
        server = shutil.which("turnserver")
        if server is None:
            raise ServiceMissing("coturn is not installed (apt-get install coturn)")
        self.server = server
        super().__init__()
        self.secret_file = self.root / "secret"
        self.secret_file.write_text(secrets.token_urlsafe(32))
        self.secret_file.chmod(0o600)
        first = 20000 + self.port % 40000  # a relay range of its own (coturn picks ports within it)
        config = [
            "listening-ip=127.0.0.1", "relay-ip=127.0.0.1", f"listening-port={self.port}",
            f"min-port={first}", f"max-port={first + self.RELAY_PORTS - 1}",
            "use-auth-secret", f"static-auth-secret={self.secret_file.read_text()}", "realm=dtn.test",
            f"max-allocate-lifetime={self.ALLOCATION_S}", "no-tls", "no-dtls", "no-cli", "allow-loopback-peers",
            "no-software-attribute", "verbose",
            "log-file=stdout", f"pidfile={self.root / 'turnserver.pid'}", f"userdb={self.root / 'turndb'}",
        ]  # fmt: skip
        (self.root / "turnserver.conf").write_text("\n".join(config) + "\n")
        (self.root / "turnserver.conf").chmod(0o600)

    def _argv(self) -> list[str]:
        return [self.server, "-c", str(self.root / "turnserver.conf")]  # the secret stays out of argv

    def _answers(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
        except OSError:
            return False
        return True

    @property
    def url(self) -> str:
        """Its ``ice_servers`` entry (TURN over UDP)."""
        return f"turn:127.0.0.1:{self.port}?transport=udp"

    def read_log(self) -> str:
        return self.log.read_text(errors="replace")

    def __enter__(self) -> PrivateTurn:
        self.start()
        return self
