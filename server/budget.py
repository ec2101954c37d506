"""Who may hold the edge's open connections: the bookkeeping behind ``server.connections``, with no I/O.

A ``ConnectionBudget`` holds every open connection (HTTP, and WebSocket after its upgrade) under its
client's address group (``address_group``: an IPv4 address, an IPv6 /64, or the proxy's unix socket)
and decides, when one opens, among four ``Admission``\\ s:

* ``ADMITTED``: below ``cap`` in total and ``per_address`` from its group;
* ``ADMITTED`` too at ``cap``, when the heaviest group holds at least two more connections than the
  newcomer's: that group's oldest connection is shed (``Sheddable.shed``) to make room. Whoever holds
  the edge from a few addresses gives way to everyone else, however many connections they open;
* ``RESERVE``: at ``cap`` with nobody heavier to shed, one of ``reserve`` further slots, for health
  and readiness only (``server.connections`` answers anything else 503). A full reserve sheds its
  oldest slot: the newest connection is the one most likely to be a probe that asks at once;
* ``OVER_ADDRESS``: its group already holds ``per_address`` (answered 429 at once) or, with no
  reserve, ``OVER_CAP`` (503 at once).

Connections are keyed by any hashable (``server.connections`` uses the transport, which outlives a
WebSocket upgrade); ``release`` forgets one, and may be called again for one already shed.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Hashable
from typing import Protocol

__all__ = ["Admission", "ConnectionBudget", "Sheddable", "address_group"]

IPV6_GROUP_PREFIX = 64  # one IPv6 subscriber gets a /64: its addresses count as one


class Admission(enum.Enum):
    ADMITTED = "admitted"
    RESERVE = "reserve"
    OVER_ADDRESS = "over the per-address cap"
    OVER_CAP = "over the connection cap"


class Sheddable(Protocol):
    def shed(self) -> None:
        """Close this connection at once (with a clear answer where one can still be sent)."""


def address_group(host: str | None) -> str:
    """The group a client address counts in: the IPv4 address (an IPv4-mapped IPv6 one too), the IPv6
    /64 it lies in, or ``host`` itself for anything else (a unix socket's client: ``""``)."""
    try:
        ip = ipaddress.ip_address(host or "")
    except ValueError:
        return host or ""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_GROUP_PREFIX), strict=False))
    return str(ip)


class ConnectionBudget:
    """The open connections of one server and the rules above; ``cap``, ``per_address`` at least 1."""

    def __init__(self, cap: int, per_address: int, reserve: int) -> None:
        self.cap, self.per_address, self.reserve = max(1, cap), max(1, per_address), max(0, reserve)
        self._groups: dict[str, dict[Hashable, Sheddable]] = {}  # each in opening order
        self._reserved: dict[Hashable, Sheddable] = {}
        self._group_of: dict[Hashable, str] = {}
        self._held = 0

    @property
    def held(self) -> int:
        """Connections held, outside the reserve."""
        return self._held

    @property
    def reserved(self) -> int:
        return len(self._reserved)

    def admit(self, key: Hashable, host: str | None, connection: Sheddable) -> Admission:
        """Decide on a new connection from ``host`` (see the module's docstring); an admitted or reserved
        one is held until ``release(key)``. Sheds at most one other connection."""
        group = address_group(host)
        held = self._groups.get(group, {})
        if len(held) >= self.per_address:
            return Admission.OVER_ADDRESS
        if self._held >= self.cap:
            heaviest = max(self._groups.values(), key=len)
            if len(heaviest) < len(held) + 2:
                return self._reserve(key, connection)
            self._shed(next(iter(heaviest)))
        self._groups.setdefault(group, {})[key] = connection
        self._group_of[key] = group
        self._held += 1
        return Admission.ADMITTED

    def rebind(self, key: Hashable, connection: Sheddable) -> None:
        """``key``'s connection is now ``connection`` (a WebSocket taking over its HTTP connection)."""
        if key in self._reserved:
            self._reserved[key] = connection
        elif key in self._group_of:
            self._groups[self._group_of[key]][key] = connection

    def release(self, key: Hashable) -> None:
        """Forget ``key`` (closed); nothing if it is not held."""
        if self._reserved.pop(key, None) is not None:
            return
        group = self._group_of.pop(key, None)
        if group is None:
            return
        members = self._groups[group]
        del members[key]
        if not members:
            del self._groups[group]
        self._held -= 1

    def _reserve(self, key: Hashable, connection: Sheddable) -> Admission:
        if self.reserve == 0:
            return Admission.OVER_CAP
        if len(self._reserved) >= self.reserve:
            self._shed(next(iter(self._reserved)))
        self._reserved[key] = connection
        return Admission.RESERVE

    def _shed(self, key: Hashable) -> None:
        connection = self._reserved.get(key) or self._groups[self._group_of[key]][key]
        self.release(key)
        connection.shed()
