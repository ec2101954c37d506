"""Optional admission: bearer tokens issued by the edge operator, each with a role.

When the network manifest sets ``admission_required``, every write needs a token whose role allows
it: HTTP requests carry ``Authorization: Bearer <token>``, relay peers put ``"token"`` in their join
message. Only the sha256 of a token is stored. Signatures still decide what a message *is*; tokens
decide who may send it at all (e.g. only operator-approved trainers may lease data).

    python -m tools token issue --data-dir var/edge --role trainer --label alice [--ttl-days 30]
"""

from __future__ import annotations

import hashlib
import secrets

from protocol.clock import SYSTEM_CLOCK, Clock
from protocol.messages import PEER_KINDS, TRAINER_KINDS

from .errors import Forbidden, Unauthorized
from .store import Store

__all__ = ["ROLES", "ROLE_KINDS", "Admission", "issue_token"]

# what each role may do; "validator" may do everything a trainer or viewer may
ROLES: dict[str, frozenset[str]] = {
    "viewer": frozenset({"join"}),
    "trainer": frozenset({"join", "lease", "candidate"}),
    "validator": frozenset({"join", "lease", "candidate", "head", "verdict"}),
}
# the peer kinds a holder of each role may claim (a viewer's token cannot make a trainer)
ROLE_KINDS: dict[str, frozenset[str]] = {
    "viewer": frozenset({"viewer"}),
    "trainer": frozenset(TRAINER_KINDS),
    "validator": frozenset(PEER_KINDS),
}


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue_token(store: Store, role: str, label: str, ttl_s: float, clock: Clock = SYSTEM_CLOCK) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {sorted(ROLES)}")
    token = "dtn_" + secrets.token_urlsafe(24)
    now_ms = clock.now_ms()
    store.add_token(_digest(token), role, label, now_ms, now_ms + int(ttl_s * 1000))
    return token


class Admission:
    def __init__(self, store: Store, required: bool, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.required = required
        self.clock = clock

    def check(self, token: str | None, action: str, *, kind: str | None = None) -> None:
        """Raise ``Unauthorized`` (no or unknown token) or ``Forbidden`` (the role lacks ``action``, or
        may not claim peer ``kind``)."""
        if not self.required:
            return
        if not token:
            raise Unauthorized("this network requires an admission token (Authorization: Bearer ...)")
        found = self.store.token(_digest(token))
        if found is None or found[1] <= self.clock.now_ms():
            raise Unauthorized("unknown or expired admission token")
        role = found[0]
        if action not in ROLES[role]:
            raise Forbidden(f"role {role!r} may not {action}")
        if kind is not None and kind not in ROLE_KINDS[role]:
            raise Forbidden(f"role {role!r} may not act as a {kind} peer")

    def check_header(self, authorization: str | None, action: str) -> None:
        token = authorization.removeprefix("Bearer ").strip() if authorization else None
        self.check(token, action)
