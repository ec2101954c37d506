"""Emulated home links: a peer's processes in a network namespace whose only way to the rest of this
machine is a link with its own rate each way, a one-way delay and random packet loss.

    with HomeLink(HOME) as link:        # namespace dtn-link-<i>; gone again when the block ends
        link.host                       # the root namespace's end of the link: bind the edge here
        link.argv([...])                # a command line that runs inside the namespace
        link.counters()                 # IP bytes offered to the link, down and up, so far
    link.stats                          # the forwarder's packet counts (forwarded, lost), once closed

How: two TUN devices, ``dtn-<i>h`` in the root namespace (address 10.213.<i>.1) and ``dtn-<i>p`` in the
peer's namespace (10.213.<i>.2), and a forwarder process (``python -m lab.links forward``) that moves
every IP packet between them, holding each for the one-way delay and dropping a seeded random fraction.
TCP runs end to end between the peer and the edge, so it sees the link's round trip and its losses (a
TCP proxy could do neither: it would answer for the far end and retransmit for it). Rates are ``tc``
token buckets (``tbf``) on each device's egress: ``h``'s is the download, ``p``'s the upload. This
kernel has no ``netem``; delay and loss are therefore done in user space, where they cost CPU the
forwarder shares with the rest of the machine (see docs/decisions/0026).

Bounded: at most ``MAX_LINKS`` links at once on this machine; a forwarder ends when its parent closes
its stdin (the parent ended, however) or after ``max_s``; leaving the block, or failing to set up,
stops the forwarder (its TUN devices go with it), ends what still runs in the namespace and deletes it.
Needs root, ``/dev/net/tun``, ``ip`` and ``tc`` (``link_unsupported()`` says what is missing).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["DIRECT", "HOME", "MAX_LINKS", "HomeLink", "LinkProfile", "link_unsupported", "placed"]

MAX_LINKS = 16  # links at once on this machine: namespaces dtn-link-0 .. dtn-link-15
MAX_QUEUED = 4096  # packets held per direction (delayed); beyond: lost, like a full router buffer
MTU = 1500
TUNSETIFF, IFF_TUN, IFF_NO_PI = 0x400454CA, 0x0001, 0x1000
SETUP_TIMEOUT_S = 10.0
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class LinkProfile:
    """A link's rates in Mbit/s (``None``: not limited), its round trip in ms (half each way) and the
    fraction of packets lost in each direction."""

    down_mbit: float | None
    up_mbit: float | None
    rtt_ms: float
    loss: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.loss < 1.0 or self.rtt_ms < 0:
            raise ValueError(f"bad link profile {self}")
        if any(rate is not None and rate <= 0 for rate in (self.down_mbit, self.up_mbit)):
            raise ValueError(f"bad link profile {self}")


HOME = LinkProfile(down_mbit=20.0, up_mbit=5.0, rtt_ms=60.0, loss=0.01)  # issue #25's home connection
DIRECT = LinkProfile(down_mbit=None, up_mbit=None, rtt_ms=0.0, loss=0.0)  # the same path, nothing emulated


@contextlib.contextmanager
def placed(profile: LinkProfile | None, seed: int) -> Iterator[HomeLink | None]:
    """A ``HomeLink`` of ``profile`` for the block, or ``None`` (``profile`` ``None``: loopback)."""
    if profile is None:
        yield None
        return
    with HomeLink(profile, seed=seed) as link:
        yield link


def _capable(capability: int) -> bool:
    """Whether this process holds ``capability`` (its effective set, ``/proc/self/status``)."""
    status = Path("/proc/self/status").read_text()
    effective = next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:"))
    return bool(int(effective, 16) >> capability & 1)


def link_unsupported() -> str | None:
    """Why no link can be made here (``None``: it can)."""
    if os.geteuid() != 0:
        return "emulated links need root (network namespaces, TUN devices, tc)"
    if not _capable(CAP_SYS_ADMIN) or not _capable(CAP_NET_ADMIN):
        return "emulated links need CAP_SYS_ADMIN and CAP_NET_ADMIN (network namespaces, tc)"
    if not os.path.exists("/dev/net/tun"):
        return "emulated links need /dev/net/tun"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"emulated links need {' and '.join(missing)} (iproute2)"
    return None


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=SETUP_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


def _ip(*args: str) -> None:
    _run("ip", *args)


def _tbf(device: str, mbit: float, namespace: str | None = None) -> list[str]:
    """``tc`` arguments shaping ``device``'s egress to ``mbit``: a bucket of 10 ms of the rate (at least
    two packets) and a queue of at most 100 ms of it (then packets are dropped, as a router would)."""
    rate = int(mbit * 1e6)
    burst = max(rate // 8 // 100, 2 * MTU)
    where = ["-n", namespace] if namespace else []
    return [*where, "qdisc", "add", "dev", device, "root", "tbf", "rate", f"{rate}bit", "burst", str(burst),
            "latency", "100ms"]  # fmt: skip


def _exists(namespace: str) -> bool:
    return Path("/run/netns", namespace).exists()


@dataclass
class HomeLink:
    """One emulated link (see the module docstring); a context manager."""

    profile: LinkProfile
    seed: int = 0
    max_s: float = 3600.0
    index: int = -1
    stats: dict[str, Any] = field(default_factory=dict)
    _forwarder: subprocess.Popen[str] | None = None

    @property
    def namespace(self) -> str:
        return f"dtn-link-{self.index}"

    @property
    def host(self) -> str:
        return f"10.213.{self.index}.1"

    @property
    def peer(self) -> str:
        return f"10.213.{self.index}.2"

    @property
    def host_device(self) -> str:
        return f"dtn-{self.index}h"

    @property
    def peer_device(self) -> str:
        return f"dtn-{self.index}p"

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside the link's namespace."""
        return ["ip", "netns", "exec", self.namespace, *command]

    def counters(self) -> tuple[int, int]:
        """IP bytes offered to the link so far, (down, up): what the edge side sent towards the peer and
        what the peer sent, before loss."""
        return self._tx_bytes(self.host_device), self._tx_bytes(self.peer_device, self.namespace)

    @staticmethod
    def _tx_bytes(device: str, namespace: str | None = None) -> int:
        where = ["-n", namespace] if namespace else []
        out = subprocess.run(["ip", *where, "-j", "-s", "link", "show", "dev", device],
                             capture_output=True, text=True, check=True, timeout=SETUP_TIMEOUT_S).stdout  # fmt: skip
        return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])

    def __enter__(self) -> HomeLink:
        reason = link_unsupported()
        if reason:
            raise RuntimeError(reason)
        self._claim()
        try:
            self._start_forwarder()
            _ip("link", "set", self.peer_device, "netns", self.namespace)
            _ip("addr", "add", self.host, "peer", self.peer, "dev", self.host_device)
            _ip("link", "set", self.host_device, "up")
            _ip("-n", self.namespace, "addr", "add", self.peer, "peer", self.host, "dev", self.peer_device)
            _ip("-n", self.namespace, "link", "set", self.peer_device, "up")
            _ip("-n", self.namespace, "link", "set", "lo", "up")
            if self.profile.down_mbit is not None:
                _run("tc", *_tbf(self.host_device, self.profile.down_mbit))
            if self.profile.up_mbit is not None:
                _run("tc", *_tbf(self.peer_device, self.profile.up_mbit, self.namespace))
        except BaseException:
            self.close()
            raise
        return self

    def _claim(self) -> None:
        """Take the first free index: create its namespace (``ip netns add`` fails when it exists). A
        namespace without its root-side device is left from a process that ended: it is deleted and taken."""
        for index in range(MAX_LINKS):
            self.index = index
            if _exists(self.namespace) and not Path("/sys/class/net", self.host_device).exists():
                with contextlib.suppress(RuntimeError):
                    _ip("netns", "del", self.namespace)
            with contextlib.suppress(RuntimeError):
                _ip("netns", "add", self.namespace)
                return
        raise RuntimeError(f"all {MAX_LINKS} emulated links are in use")

    def _start_forwarder(self) -> None:
        argv = [sys.executable, "-m", "lab.links", "forward", self.host_device, self.peer_device,
                "--delay-ms", str(self.profile.rtt_ms / 2), "--loss", str(self.profile.loss),
                "--seed", str(self.seed), "--max-s", str(self.max_s)]  # fmt: skip
        self._forwarder = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True
        )
        assert self._forwarder.stdout is not None
        ready = self._forwarder.stdout.readline().strip()  # the forwarder answers at once, or exits
        if ready != "ready":
            raise RuntimeError(f"the link forwarder did not start (exit {self._forwarder.wait(SETUP_TIMEOUT_S)})")

    def close(self) -> None:
        """Stop the forwarder (reading its counts into ``stats``), end what runs in the namespace, delete it."""
        try:
            self._stop_forwarder()
        finally:
            self._delete_namespace()

    def _stop_forwarder(self) -> None:
        if self._forwarder is None:
            return
        forwarder, self._forwarder = self._forwarder, None
        try:
            out, _ = forwarder.communicate(timeout=SETUP_TIMEOUT_S)  # closing its stdin ends it
        except subprocess.TimeoutExpired:
            forwarder.kill()
            out, _ = forwarder.communicate()
        lines = out.strip().splitlines()
        self.stats = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}

    def _delete_namespace(self) -> None:
        if self.index >= 0 and _exists(self.namespace):
            pids = subprocess.run(
                ["ip", "netns", "pids", self.namespace], capture_output=True, text=True, timeout=SETUP_TIMEOUT_S
            ).stdout
            for pid in pids.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", self.namespace)

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


# the forwarder: its own process, so that its timing does not share a GIL with the caller


@dataclass
class Direction:
    """Packets one way: read from ``source``, written to ``sink`` ``delay_s`` later, or lost."""

    source: int
    sink: int
    delay_s: float
    loss: float
    rng: random.Random
    queue: deque[tuple[float, bytes]] = field(default_factory=deque)
    forwarded: int = 0
    lost: int = 0
    overflowed: int = 0
    bytes: int = 0

    def readable(self, loop: asyncio.AbstractEventLoop) -> None:
        for _ in range(256):  # a burst at a time; the rest when the loop comes back
            try:
                packet = os.read(self.source, 65536)
            except BlockingIOError:
                return
            if self.rng.random() < self.loss:
                self.lost += 1
            elif len(self.queue) >= MAX_QUEUED:
                self.overflowed += 1
            else:
                self.queue.append((loop.time() + self.delay_s, packet))
                if len(self.queue) == 1:
                    loop.call_at(self.queue[0][0], self.drain, loop)

    def drain(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        while self.queue and self.queue[0][0] <= now:
            packet = self.queue.popleft()[1]
            try:
                os.write(self.sink, packet)
                self.forwarded += 1
                self.bytes += len(packet)
            except OSError:  # the other end is gone or full: lost
                self.overflowed += 1
        if self.queue:
            loop.call_at(self.queue[0][0], self.drain, loop)

    def counts(self) -> dict[str, int]:
        return {"forwarded": self.forwarded, "lost": self.lost, "overflowed": self.overflowed, "bytes": self.bytes}


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


async def forward(host_device: str, peer_device: str, delay_s: float, loss: float, seed: int, max_s: float) -> None:
    """Create both TUN devices, say ``ready``, forward until stdin closes or ``max_s`` passes, then print
    the counts (JSON) of each direction."""
    host, peer = open_tun(host_device), open_tun(peer_device)
    rng = random.Random(seed)
    down = Direction(host, peer, delay_s, loss, rng)
    up = Direction(peer, host, delay_s, loss, rng)
    loop = asyncio.get_running_loop()
    loop.add_reader(host, down.readable, loop)
    loop.add_reader(peer, up.readable, loop)
    closed = asyncio.Event()
    loop.add_reader(sys.stdin.fileno(), closed.set)  # readable at EOF: the parent is done or gone
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, closed.set)
    print("ready", flush=True)
    started = time.monotonic()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(closed.wait(), max_s)
    print(json.dumps({"down": down.counts(), "up": up.counts(), "seconds": time.monotonic() - started}), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.links", description="an emulated link's packet forwarder")
    commands = parser.add_subparsers(dest="command", required=True)
    fwd = commands.add_parser("forward", help="forward packets between two TUN devices it creates")
    fwd.add_argument("host_device")
    fwd.add_argument("peer_device")
    fwd.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay, each direction")
    fwd.add_argument("--loss", type=float, default=0.0, help="fraction of packets lost, each direction")
    fwd.add_argument("--seed", type=int, default=0)
    fwd.add_argument("--max-s", type=float, default=3600.0, help="end after this many seconds")
    args = parser.parse_args(argv)
    asyncio.run(forward(args.host_device, args.peer_device, args.delay_ms / 1000, args.loss, args.seed, args.max_s))


if __name__ == "__main__":
    main()
