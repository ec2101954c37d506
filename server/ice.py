"""The ICE servers this edge gives browser pages (edge settings ``ice_servers``, ``turn_secret_file``,
``turn_credential_ttl_s``, ``ice_relay_only``), each relay connection its own TURN credential.

TURN credentials follow the TURN REST API scheme that coturn's ``use-auth-secret`` checks (and other
TURN servers alike): the edge and the TURN server share a secret (coturn's ``static-auth-secret``); a
credential is valid until a time written into its username, ``<expiry unix seconds>:<peer id>``, and
its password is ``base64(HMAC-SHA1(secret, username))``. The TURN server needs no call to the edge and
no user database; the edge keeps no credential it issued; a credential names the peer it was issued
to (in the TURN server's log) and expires on its own. The secret is read from a file (never a flag,
an environment variable or a URL: it would show in process lists and logs) and is never sent or logged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass, field
from pathlib import Path

from protocol.clock import Clock
from protocol.ice import NO_ICE, IceConfig, IceServer, is_turn

__all__ = ["MAX_SECRET_BYTES", "IceIssuer", "read_turn_secret", "turn_credential"]

MAX_SECRET_BYTES = 1024


def read_turn_secret(path: Path) -> bytes:
    """The shared secret in ``path`` (one line; surrounding whitespace dropped); a ``ValueError`` that
    names the file, never its content, when it cannot be read, is empty or too long."""
    try:
        with path.open("rb") as file:
            secret = file.read(MAX_SECRET_BYTES + 2).strip()
    except OSError as exc:
        raise ValueError(f"turn_secret_file {str(path)!r} cannot be read: {exc.strerror}") from None
    if not secret or len(secret) > MAX_SECRET_BYTES or b"\n" in secret:
        raise ValueError(f"turn_secret_file {str(path)!r} must hold one line of 1 to {MAX_SECRET_BYTES} bytes")
    return secret


def turn_credential(secret: bytes, username: str) -> str:
    """The TURN REST API password for ``username``: base64 of its HMAC-SHA1 under ``secret``."""
    return base64.b64encode(hmac.new(secret, username.encode(), hashlib.sha1).digest()).decode()


@dataclass(frozen=True)
class IceIssuer:
    """Issues the ``IceConfig`` a page's connection is given: STUN URLs as they are, TURN URLs with a
    credential for that peer valid ``ttl_s`` from now."""

    urls: tuple[str, ...] = ()
    secret: bytes = field(default=b"", repr=False)
    ttl_s: float = 3600.0
    relay_only: bool = False

    def issue(self, peer_id: str, clock: Clock) -> IceConfig:
        """The ICE servers for ``peer_id``'s connection, its TURN credential expiring ``ttl_s`` from now."""
        stun = tuple(url for url in self.urls if not is_turn(url))
        turn = tuple(url for url in self.urls if is_turn(url))
        if not stun and not turn:
            return NO_ICE
        servers = [IceServer(stun)] if stun else []
        if turn:
            username = f"{int(clock.now_ms() / 1000 + self.ttl_s)}:{peer_id}"
            servers.append(IceServer(turn, username, turn_credential(self.secret, username)))
        return IceConfig(tuple(servers), self.relay_only, self.ttl_s if turn else None)
