"""Optional admission: bearer tokens issued by the edge operator, each with a role.

When the network manifest sets ``admission_required``, every write and every read of training data,
leases and candidates needs a token whose role allows it: HTTP requests carry
``Authorization: Bearer <token>``, relay peers put ``"token"`` in their join message (and the relay
checks it again on every message and sweeps its open connections every ``REVOCATION_CHECK_S``, closing
those of a revoked or expired token with ``errors.CLOSE_REVOKED``). Heads,
verdicts and the directories stay public: anyone may verify the model. Only the sha256 of a token is
stored; its first 12 hex digits are the token's id for listing and revocation. Signatures still decide
what a message *is*; tokens decide who may send or read it at all.

    python -m tools token issue --data-dir var/edge --role trainer --label alice [--ttl-days 30]
    python -m tools token list --data-dir var/edge
    python -m tools token revoke --data-dir var/edge <token id or token>
"""

from __future__ import annotations

import hashlib
import secrets

from starlette.requests import HTTPConnection

from protocol.clock import SYSTEM_CLOCK, Clock
from protocol.errors import ProtocolError
from protocol.messages import PEER_KINDS, READ_PROOF_HEADER, TRAINER_KINDS, PeerProof

from .errors import Forbidden, Unauthorized
from .replay import Once
from .store import EdgeStore

__all__ = [
    "REVOCATION_CHECK_S",
    "ROLES",
    "ROLE_KINDS",
    "TOKEN_ID_LENGTH",
    "Admission",
    "issue_token",
    "reads_as_validator",
    "revoke_token",
    "token_id",
]

_TRAINER_ACTIONS = frozenset({"join", "lease", "candidate", "read_data"})
# what each role may do; "validator" may do everything a trainer or viewer may
ROLES: dict[str, frozenset[str]] = {
    "viewer": frozenset({"join"}),
    "trainer": _TRAINER_ACTIONS,
    "validator": _TRAINER_ACTIONS | {"head", "verdict", "read_leases", "read_candidates"},
    "mirror": frozenset({"read_candidates"}),  # another edge that follows this one (``server.follower``)
}
# the peer kinds a holder of each role may claim (a viewer's token cannot make a trainer)
ROLE_KINDS: dict[str, frozenset[str]] = {
    "viewer": frozenset({"viewer"}),
    "trainer": frozenset(TRAINER_KINDS),
    "validator": frozenset(PEER_KINDS),
    "mirror": frozenset(),  # joins no relay as any peer
}


TOKEN_ID_LENGTH = 12
REVOCATION_CHECK_S = 1.0  # how often the relay looks for open connections of revoked tokens
READ_PROOF_MAX_AGE_MS = 120_000


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_id(token: str) -> str:
    """The short public id of ``token``: the first digits of its stored digest."""
    return _digest(token)[:TOKEN_ID_LENGTH]


def issue_token(
    store: EdgeStore, role: str, label: str, ttl_s: float, clock: Clock = SYSTEM_CLOCK, *, max_keys: int = 1
) -> str:
    """A new token of ``role``; the first ``max_keys`` peer keys that use it are bound to it for good."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {sorted(ROLES)}")
    if max_keys < 1:
        raise ValueError("a token binds at least one key")
    token = "dtn_" + secrets.token_urlsafe(24)
    now_ms = clock.now_ms()
    store.add_token(_digest(token), role, label, now_ms, now_ms + int(ttl_s * 1000), max_keys)
    return token


def reads_as_validator(request: HTTPConnection, validator_keys: frozenset[bytes], now_ms: int, seen: Once) -> bool:
    """True when ``request`` carries a validator's fresh signed proof (``READ_PROOF_HEADER``) that it
    reads exactly this path, never presented before: what lets validators, and only them, read an open
    window's candidates. False without a proof; ``Forbidden``, saying why, for a proof that is not one
    (malformed, stale, another path, not a validator's, a bad signature) or was presented already
    (``seen`` records each for ``READ_PROOF_MAX_AGE_MS`` past its issue, after which it is stale)."""
    value = request.headers.get(READ_PROOF_HEADER)
    if value is None:
        return False
    try:
        proof = PeerProof.from_read_header(value)
        if proof.purpose != "read" or proof.read_path() != request.url.path:
            raise Forbidden("this read proof is not for this path")
        if abs(proof.issued_at_ms - now_ms) > READ_PROOF_MAX_AGE_MS:
            raise Forbidden("this read proof is stale: sign one when you send the request")
        if proof.public_key not in validator_keys:
            raise Forbidden("read proofs are taken from the network's validators only")
        proof.verify_own()
    except ProtocolError as exc:
        raise Forbidden(f"not a valid read proof: {exc}") from None
    until_stale_ms = max(1, proof.issued_at_ms + READ_PROOF_MAX_AGE_MS - now_ms)
    if not seen.first(f"read:{proof.peer_id}:{proof.nonce}", until_stale_ms):
        raise Forbidden("this read proof was presented already: sign a fresh one for each request")
    return True


def revoke_token(store: EdgeStore, token_or_id: str) -> int:
    """Revoke a token given as itself or as its id (``token_id``); how many tokens were revoked (0 or 1)."""
    is_id = len(token_or_id) == TOKEN_ID_LENGTH and all(c in "0123456789abcdef" for c in token_or_id)
    return store.delete_tokens(token_or_id if is_id else _digest(token_or_id))


class Admission:
    def __init__(self, store: EdgeStore, required: bool, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.required = required
        self.clock = clock

    def check(self, token: str | None, action: str, *, kind: str | None = None, peer_id: str | None = None) -> None:
        """Raise ``Unauthorized`` (no or unknown token) or ``Forbidden`` (the role lacks ``action``, may
        not claim peer ``kind``, or, given ``peer_id``, ``bind`` refuses it)."""
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
        if peer_id is not None:
            self.bind(token, peer_id)

    def allows(self, token: str | None, action: str) -> bool:
        """Whether ``token`` may ``action`` now (``check`` without the refusal)."""
        try:
            self.check(token, action)
        except (Unauthorized, Forbidden):
            return False
        return True

    def revoked(self, token: str | None) -> bool:
        """True when admission is on and ``token`` no longer admits anyone (revoked, expired, or none):
        what closes a relay connection that joined with it."""
        if not self.required:
            return False
        found = None if not token else self.store.token(_digest(token))
        return found is None or found[1] <= self.clock.now_ms()

    def bind(self, token: str | None, peer_id: str) -> None:
        """Bind ``peer_id``'s key to a token that passed ``check``; ``Forbidden`` when the token is
        bound to its limit of other keys already: a token admits a bounded number of identities, so
        Sybils cost tokens."""
        if not self.required:
            return
        if token is None or not self.store.bind_token_key(_digest(token), peer_id, self.clock.now_ms()):
            raise Forbidden("this admission token is bound to other peer keys")

    def check_header(self, authorization: str | None, action: str) -> str | None:
        """``check`` for an HTTP ``Authorization`` header, which must use the ``Bearer`` scheme; the
        token it carried (``None`` without admission)."""
        if not self.required:
            return None
        token = _bearer_token(authorization)
        self.check(token, action)
        return token

    def principal(self, token: str | None) -> str | None:
        """Who answers for a peer: its token's id on an admission network (``None`` without one)."""
        return token_id(token) if self.required and token else None


def _bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (``Unauthorized`` for another scheme)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("the Authorization header must be 'Bearer <token>'")
    return token.strip()
