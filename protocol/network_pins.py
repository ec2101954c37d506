"""Trust a joining peer can pin: validator fingerprints, the validators' signatures over the network's
terms, and the one rule native and browser peers apply before they train for a network an edge serves.

The network's *terms* are its manifest without what each edge fills in (its own key, whether it
asks for admission): id, validator keys, quorum, experiments. Each validator signs them
(``NetworkSignature``, domain ``dtn/network/v1``) and gives the signature to the edge, which serves
them beside the manifest; an edge cannot sign for a validator, and a replacement edge with a key of its
own serves the same terms.

A peer pins validators by key or fingerprint (``pin_matches``). ``pin_problem`` accepts a served
network when every pin names one of its validators and either every pinned validator signed these
terms, or every quorum of its validators includes a pinned one (which needs n − k + 1 pins of a
k-of-n network, and then no head is canonical without a pinned validator even if the other terms
were changed). So one pin of a validator the peer trusts is enough once that validator has signed:
the edge cannot forge its signature. A peer that trusts only the quorum (any k − 1 validators may
lie) pins k of them: at least one of k signers is honest, and an honest one signs only the real terms.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .errors import SignatureError
from .manifests import NetworkManifest
from .signing import Signer, ValidatorSignature, canonical_json, verify_signature

if TYPE_CHECKING:
    from .network_revisions import SignedNetworkRevision

__all__ = [
    "FINGERPRINT_HEX",
    "NetworkSignature",
    "fingerprint",
    "network_terms",
    "pin_matches",
    "pin_problem",
    "served_by",
    "signed_by",
]

FINGERPRINT_HEX = 16  # a fingerprint is the first 16 hex digits of sha256(public key); longer prefixes work too
_HEX = re.compile(r"[0-9a-f]{16,64}")
DOMAIN = b"dtn/network/v1\n"


def fingerprint(public_key: bytes) -> str:
    """A validator key's fingerprint: the first ``FINGERPRINT_HEX`` hex digits of its sha256."""
    return hashlib.sha256(public_key).hexdigest()[:FINGERPRINT_HEX]


def pin_matches(pin: str, public_key: bytes) -> bool:
    """Whether ``pin`` (a base64 key, standard or URL-safe, or a hex fingerprint of at least 16 digits,
    optionally ``sha256:``-prefixed or with colons) names ``public_key``."""
    text = pin.strip()
    hex_pin = text.lower().removeprefix("sha256:").replace(":", "")
    if _HEX.fullmatch(hex_pin):
        return hashlib.sha256(public_key).hexdigest().startswith(hex_pin)
    try:
        decoded = base64.urlsafe_b64decode(text.replace("+", "-").replace("/", "_") + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return False
    return len(decoded) == 32 and decoded == public_key


def network_terms(network: NetworkManifest) -> dict[str, Any]:
    """What validators sign of ``network``: its wire form without the serving edge's own fields."""
    wire = network.to_wire()
    for edge_field in ("edge_key", "admission_required"):
        del wire[edge_field]
    return wire


@dataclass(frozen=True)
class NetworkSignature(ValidatorSignature):
    """A validator's signature over a network's terms."""

    WHAT = "network signature"

    @classmethod
    def of(cls, network: NetworkManifest, signer: Signer) -> NetworkSignature:
        return cls(signer.public_key, signer.sign(DOMAIN + canonical_json(network_terms(network))))

    def verifies(self, network: NetworkManifest) -> bool:
        """Whether this is a signature of one of ``network``'s validators over its terms."""
        return self.validator_key in network.validator_key_set and verify_signature(
            self.validator_key, DOMAIN, network_terms(network), self.signature
        )


def served_by(
    network: NetworkManifest, served: NetworkManifest, chain: Sequence[SignedNetworkRevision] = ()
) -> NetworkManifest:
    """``served`` (the manifest an edge serves now) when its terms are ``network``'s, or follow from them
    through the revisions of ``chain`` (``protocol.network_revisions.follow``: each signed by a quorum of
    the validators before it): a replaced edge (a new store makes a new key) and a revised network are
    followed, an edge serving other terms is not (``SignatureError``). A peer's trust root is the
    validators, never the edge's key."""
    from .network_revisions import follow  # that module builds on this one

    revised = follow(network, chain) if served.revision > network.revision else network
    if network_terms(served) != network_terms(revised):
        raise SignatureError(
            f"the edge now serves network {served.network_id!r} on other terms (validators, quorum or "
            f"experiments) than {network.network_id!r} and the revisions its validators signed; refusing it"
        )
    return replace(revised, edge_key=served.edge_key, admission_required=served.admission_required)


def signed_by(network: NetworkManifest, signatures: Iterable[NetworkSignature]) -> frozenset[bytes]:
    """The validators of ``network`` whose signature over its terms is among ``signatures``."""
    return frozenset(s.validator_key for s in signatures if s.verifies(network))


def pin_problem(network: NetworkManifest, pins: Sequence[str], signed: frozenset[bytes]) -> str | None:
    """Why a peer pinning ``pins`` must not train for ``network`` whose validators ``signed`` signed its
    terms (``signed_by``), or ``None`` when it may (the rule of the module docstring)."""
    listed = ", ".join(fingerprint(key) for key in network.validator_keys)
    pinned: set[bytes] = set()
    for pin in pins:
        named = [key for key in network.validator_keys if pin_matches(pin, key)]
        if not named:
            return f"network {network.network_id!r} has validators [{listed}]: none is the pinned validator {pin}"
        pinned.update(named)
    if pinned <= signed or len(network.validator_key_set - pinned) < network.quorum:
        return None
    unsigned = ", ".join(fingerprint(key) for key in sorted(pinned - signed))
    return (
        f"network {network.network_id!r}: the pinned validators [{unsigned}] have not signed its terms, and "
        f"{network.quorum} of the validators [{listed}] can make a head canonical without a pinned one; "
        "pin a validator that signed, or more of them"
    )
