"""ICE servers for the WebRTC connections between browser tabs (heads from peers): STUN to find a
tab's public address, TURN to relay its traffic where no direct path exists (a NAT, a firewall).

``ice_urls`` reads a list of STUN/TURN URIs (RFC 7064, RFC 7065), comma-separated, each one of

    stun:host[:port]   stuns:host[:port]   turn:host[:port][?transport=udp|tcp]   turns:host[:port][?transport=udp|tcp]

where host is a DNS name, an IPv4 address or a bracketed IPv6 address: no user or password (TURN
credentials are never part of a URI), no path, no other query. At most ``MAX_ICE_URLS`` of them, each at
most ``MAX_ICE_URL_CHARS``; anything else is an ``InvalidMessage`` naming the entry.

``IceConfig`` is what the edge tells a page in the relay welcome (and in answer to ``{"type": "ice"}``):

    {"servers": [{"urls": [...], "username"?, "credential"?}, ...],  (an RTCIceServer each)
     "relay_only": bool,                                              (iceTransportPolicy "relay")
     "valid_s": float | null}                                         (the credentials' lifetime from now)

``IceConfig.from_wire`` reads one from the network strictly: at most ``MAX_ICE_SERVERS`` servers, each
URL as above, a username and credential both or neither, each at most ``MAX_CREDENTIAL_CHARS``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidMessage
from .fields import opt, read_bool, read_float, read_list, read_object, read_str
from .url_lists import url_list

__all__ = ["MAX_ICE_SERVERS", "MAX_ICE_URLS", "NO_ICE", "IceConfig", "IceServer", "ice_urls", "is_turn"]

MAX_ICE_URLS = 16
MAX_ICE_URL_CHARS = 256
MAX_ICE_SERVERS = 4
MAX_CREDENTIAL_CHARS = 512
MAX_VALID_S = 7 * 86_400.0

_ICE_URL = re.compile(
    r"(?P<scheme>stuns?|turns?):"
    r"(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\])"
    r"(?::(?P<port>[0-9]{1,5}))?"
    r"(?:\?transport=(?P<transport>udp|tcp))?"
)


def is_turn(url: str) -> bool:
    """Whether ``url`` (one ``ice_urls`` accepted) names a TURN server, which needs credentials."""
    return url.startswith(("turn:", "turns:"))


def ice_urls(listed: str | Sequence[str]) -> list[str]:
    """The STUN/TURN URIs of ``listed`` (the rules above), in order, each once; empty when it names none."""
    return url_list(
        listed,
        what="ICE server URL",
        form="stun(s):host[:port] or turn(s):host[:port][?transport=udp|tcp]",
        max_urls=MAX_ICE_URLS,
        accepts=_accepted,
    )


def _accepted(url: str) -> bool:
    match = _ICE_URL.fullmatch(url) if len(url) <= MAX_ICE_URL_CHARS else None
    if match is None or (match["port"] is not None and not 0 < int(match["port"]) < 65536):
        return False
    return match["transport"] is None or match["scheme"].startswith("turn")


@dataclass(frozen=True)
class IceServer:
    """One RTCIceServer: its URLs and, for TURN, the credential the edge issued for this connection."""

    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"urls": list(self.urls)}
        if self.username is not None:
            wire.update(username=self.username, credential=self.credential)
        return wire

    @classmethod
    def from_wire(cls, value: object) -> IceServer:
        data = read_object(value, "ICE server")
        urls = tuple(ice_urls(read_list(data, "urls", _string, max_len=MAX_ICE_URLS)))
        if not urls:
            raise InvalidMessage("an ICE server needs at least one URL")
        if ("username" in data) != ("credential" in data):
            raise InvalidMessage("an ICE server has a username and a credential, or neither")
        if "username" not in data:
            return cls(urls)
        username = read_str(data, "username", max_len=MAX_CREDENTIAL_CHARS)
        return cls(urls, username, read_str(data, "credential", max_len=MAX_CREDENTIAL_CHARS))


@dataclass(frozen=True)
class IceConfig:
    """What a page's RTCPeerConnections use: ``servers``, relayed candidates only if ``relay_only``, and
    how long the servers' credentials stay valid from when it was received (None: they do not expire)."""

    servers: tuple[IceServer, ...] = ()
    relay_only: bool = False
    valid_s: float | None = None

    @property
    def urls(self) -> list[str]:
        """Every server's URLs (what a status may show: no credentials)."""
        return [url for server in self.servers for url in server.urls]

    def to_wire(self) -> dict[str, Any]:
        return {"servers": [s.to_wire() for s in self.servers], "relay_only": self.relay_only, "valid_s": self.valid_s}

    @classmethod
    def from_wire(cls, value: object) -> IceConfig:
        data = read_object(value, "ICE configuration")
        servers = tuple(read_list(data, "servers", IceServer.from_wire, max_len=MAX_ICE_SERVERS))
        valid_s = opt(data, "valid_s", read_float)
        if valid_s is not None and not 0 < valid_s <= MAX_VALID_S:
            raise InvalidMessage(f"valid_s must be null or a number of seconds in (0, {MAX_VALID_S:.0f}]")
        relay_only = read_bool(data, "relay_only")
        if relay_only and not any(is_turn(url) for server in servers for url in server.urls):
            raise InvalidMessage("relay_only needs a TURN server")
        return cls(servers, relay_only, valid_s)


NO_ICE = IceConfig()  # host candidates only: tabs that reach each other directly (one LAN)


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidMessage("ICE server URLs must be strings")
    return value
