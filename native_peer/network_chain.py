"""The network a native peer trusts, followed through the edges that serve it.

A peer starts from the manifest it was given (its trust root: the validators and their quorum). The
edge it talks to may since have been replaced (a new store signs with a new key), or the network's
terms revised by its validators (``protocol.network_revisions``: a new experiment, new validators).
``NetworkChain.read`` takes the network as the edge serves it only when it follows from the terms held
here (``protocol.network_pins.served_by``): the same terms under another edge key, or the revisions a
quorum of the validators before each one signed. An edge that serves an *earlier* revision (one that
lost its store and started again from the manifest file) is given the revisions it lacks: like heads,
revisions are public, signed data any party can carry back. It may take one only later (a change of
validators applies once the edge's heads reach its handover, as validators give the heads back);
meanwhile the peer keeps the terms it holds.

The revisions followed are kept (``path``, for a validator: a restarted validator given the first
manifest again still trusts the revised one and can give the revisions back).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from protocol.errors import ProtocolError
from protocol.manifests import NetworkManifest
from protocol.messages import HeadDescriptor
from protocol.network_pins import served_by
from protocol.network_revisions import MAX_REVISIONS, SignedNetworkRevision, head_network, revisions_after
from protocol.signing import canonical_json

from .edge_client import EdgeClient, EdgeRequestError
from .storage import write_atomic

__all__ = ["NetworkChain"]

log = logging.getLogger(__name__)


@dataclass
class NetworkChain:
    """``network``, the terms trusted now, ``chain``, the revisions that led to them from the manifest
    given (kept at ``path`` when there is one), and ``networks``, the network at each of them."""

    network: NetworkManifest
    path: Path | None = None
    chain: list[SignedNetworkRevision] = field(default_factory=list)
    # the network at each revision from the manifest given (empty: ``network`` alone), kept with ``chain``
    networks: list[NetworkManifest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.networks = self.networks or [self.network]

    def history(self) -> list[NetworkManifest]:
        """The network at each revision from the manifest given to the one held, in order: whose
        validators made which heads and orders (``protocol.network_revisions``)."""
        return list(self.networks)

    def verify_head(self, head: HeadDescriptor) -> None:
        """``SignatureError`` unless the validators of ``head``'s era (``head_network``: a head made
        before a change of validators is theirs) vouch for it."""
        head_network(self.history(), head.experiment, head.window).verify_head(head)

    @classmethod
    def load(cls, network: NetworkManifest, path: Path | None = None) -> NetworkChain:
        """``network`` revised by the revisions kept at ``path`` (none when it does not exist), each
        checked again against the terms before it."""
        chain: list[SignedNetworkRevision] = []
        networks = [network]
        if path is not None and path.exists():
            try:
                saved = json.loads(path.read_bytes())
                if not isinstance(saved, list) or len(saved) > MAX_REVISIONS:
                    raise ValueError(f"at most {MAX_REVISIONS} revisions in a list")
                chain = [SignedNetworkRevision.from_wire(r) for r in saved]
                networks += [revised for _, revised in revisions_after(network, chain)]
            except (OSError, ValueError, ProtocolError) as exc:
                raise ValueError(
                    f"the network revisions kept at {path} do not follow the manifest given: {exc}"
                ) from exc
        return cls(networks[-1], path, chain, networks)

    def read(self, edge: EdgeClient) -> NetworkManifest | None:
        """The network as ``edge`` serves it now, checked and held here, when its edge key or revision is
        another than the one held; ``None`` when neither moved, or when the edge serves an earlier
        revision than the one held and takes the later ones not yet (``_give_back``). ``SignatureError``
        when the edge serves terms that do not follow from those held (another network, or revisions
        without their quorum)."""
        served = edge.network()
        if (served.edge_key, served.revision) == (self.network.edge_key, self.network.revision):
            return None
        if served.revision < self.network.revision:
            if not self._give_back(edge, served.revision):
                return None
            served = edge.network()
        chain = edge.network_revisions() if served.revision > self.network.revision else []
        followed = served_by(self.network, served, chain)
        if followed.revision > self.network.revision:
            held = {signed.revision.number for signed in self.chain}
            new = [s for s in chain if s.revision.number <= followed.revision and s.revision.number not in held]
            revised = revisions_after(self.networks[-1], new)  # checked by served_by already: cheap and rare
            self.chain += [signed for signed, _ in revised]
            self.networks += [network for _, network in revised]
            self._save()
            log.info("network %s is at revision %d now, checked", followed.network_id, followed.revision)
        self.network = followed
        return followed

    def _give_back(self, edge: EdgeClient, served: int) -> bool:
        """Give ``edge``, which serves revision ``served``, the revisions held after it, in order, up to
        the first it does not take now; whether it serves the one held here now."""
        missing = [signed for signed in self.chain if signed.revision.number > served]
        if not missing:  # not held here either: nothing to give
            return False
        log.warning("the edge serves network revision %d; giving back the %d after it", served, len(missing))
        for signed in missing:
            try:
                edge.submit_revision(signed)
            except EdgeRequestError as exc:
                if exc.status != 409:
                    raise
                if edge.network().revision < signed.revision.number:  # not held there: not yet
                    log.warning("the edge takes network revision %d not yet: %s", signed.revision.number, exc)
                    return False
        return True

    def _save(self) -> None:
        if self.path is not None:
            write_atomic(self.path, canonical_json([signed.to_wire() for signed in self.chain]) + b"\n")
