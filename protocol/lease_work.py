"""A small proof of work per lease, set per experiment (``ExperimentSpec.lease_work_bits``). Pure.

An open network cannot tell a fresh identity from a new contributor, so a lease costs what the
experiment says: the requester finds a ``nonce`` such that

    sha256(challenge ‖ nonce as 8 bytes, big-endian)   starts with ``bits`` zero bits,
    challenge = sha256("dtn/lease-work/v1\\n" ‖ experiment ‖ "\\n" ‖ peer id ‖ "\\n" ‖ head id)

about 2^bits hashes to find and one to check. The work is bound to the peer (one identity's work buys
no other identity a lease) and to the head the lease is asked on (work done for one window buys nothing
in the next), so a client leasing under many identities pays for each of them, every window. The edge
takes work for the current head or its parent (a lease asked as the next head is published), checks
it before anything else of the request costs it, and refuses a lease without it (``server.leasing``).
0 bits (the default) asks for none. A trainer pays it once per lease, about 2^bits hashes: an operator
sets the bits so that a window's work dwarfs it.
"""

from __future__ import annotations

import hashlib
import itertools

__all__ = [
    "LEASE_WORK_DOMAIN",
    "MAX_LEASE_WORK_BITS",
    "MAX_NONCE",
    "lease_work",
    "lease_work_done",
    "solve_lease_work",
    "work_challenge",
]

LEASE_WORK_DOMAIN = b"dtn/lease-work/v1\n"
MAX_LEASE_WORK_BITS = 32  # an experiment may ask for this many at most (about 4e9 hashes: minutes)
MAX_NONCE = 2**53  # exact in every JSON reader


def work_challenge(experiment: str, peer_id: str, head_id: str) -> bytes:
    """What a lease's work is bound to: the experiment, the peer asking and the head it asks on."""
    return hashlib.sha256(LEASE_WORK_DOMAIN + f"{experiment}\n{peer_id}\n{head_id}".encode()).digest()


def _zero_bits(digest: bytes) -> int:
    value = int.from_bytes(digest, "big")
    return len(digest) * 8 - value.bit_length()


def lease_work_done(challenge: bytes, nonce: int, bits: int) -> bool:
    """Whether ``nonce`` is work of ``bits`` zero bits on ``challenge`` (a nonce out of range is not)."""
    if not 0 <= nonce <= MAX_NONCE:
        return False
    return bits <= 0 or _zero_bits(hashlib.sha256(challenge + nonce.to_bytes(8, "big")).digest()) >= bits


def solve_lease_work(challenge: bytes, bits: int, start: int = 0) -> int:
    """The first nonce from ``start`` that is work of ``bits`` zero bits on ``challenge``."""
    if bits <= 0:
        return start
    prefix = hashlib.sha256(challenge)
    for nonce in itertools.count(start):
        digest = prefix.copy()
        digest.update(nonce.to_bytes(8, "big"))
        if _zero_bits(digest.digest()) >= bits:
            return nonce
    raise AssertionError("unreachable")  # pragma: no cover


def lease_work(bits: int, experiment: str, peer_id: str, head_id: str) -> int | None:
    """What a lease request of ``peer_id`` on head ``head_id`` carries as its proof of work when the
    experiment asks ``bits`` (``ExperimentSpec.lease_work_bits``); ``None`` when it asks none."""
    return solve_lease_work(work_challenge(experiment, peer_id, head_id), bits) if bits > 0 else None
