"""A rogue validator key: a key listed in the network manifest, used by a client that signs whatever it
likes (issue #27: one Byzantine validator of a k-of-n quorum), for the tests and the benchmarks.

Each ``Rogue.round`` on the window of a head: proposes ``proposals`` heads of its own on it, each with
its own attestation naming the window's candidates as considered (so that the other validators judge
them); posts accepted verdicts crediting a peer that never uploaded anything; posts a rejection of
every candidate of the experiment, merged or not. It returns the edge's answers by kind.
"""

from __future__ import annotations

import hashlib
import time

import httpx

from native_peer.edge_client import EdgeClient
from protocol.codec import encode_tensors
from protocol.envelope import pack_envelope
from protocol.hashing import content_id
from protocol.ids import ContentId, HeadId
from protocol.manifests import ExperimentSpec
from protocol.messages import Attestation, HeadDescriptor, Verdict
from protocol.model import init_params
from protocol.reasons import Reason
from protocol.signing import Signer, peer_id_from_public_key

__all__ = ["Rogue"]


class Rogue:
    def __init__(self, url: str, key: Signer, spec: ExperimentSpec, *, proposals: int = 4, minted: int = 3) -> None:
        self.key, self.spec, self.proposals, self.minted = key, spec, proposals, minted
        self.http = httpx.Client(base_url=url, timeout=30)
        self.reader = EdgeClient(url, reader=key)  # reads the open window as a validator does
        self._seed = 1000

    def close(self) -> None:
        self.http.close()
        self.reader.close()

    def round(self, head: HeadDescriptor) -> dict[str, list[httpx.Response]]:
        """Flood, mint and erase once in the window on ``head``."""
        path = f"/v1/experiments/{self.spec.key}"
        considered = [c.candidate_id for c in self.reader.candidates(self.spec.key, head.head_id)]
        answers: dict[str, list[httpx.Response]] = {"flood": [], "mint": [], "erase": []}
        for _ in range(self.proposals):
            self._seed += 1
            artifact = encode_tensors(init_params(self.spec.model, self._seed))
            proposal = HeadDescriptor(
                self.spec.key, HeadId(content_id(artifact)), head.head_id, head.window + 1, 0, (),
                self.key.public_key, int(time.time() * 1000),
            ).signed(self.key)  # fmt: skip
            answers["flood"].append(
                self.http.post(f"{path}/heads", content=pack_envelope(proposal.to_wire(), artifact))
            )
            attestation = Attestation.of(proposal, considered, self.key, int(time.time() * 1000))
            self.http.post(f"{path}/attestations", json=attestation.to_wire())
        nobody = peer_id_from_public_key(hashlib.sha256(b"nobody %d" % self._seed).digest())
        for i in range(self.minted):
            made_up = ContentId("sha256:" + hashlib.sha256(b"%d %d" % (self._seed, i)).hexdigest())
            minted = Verdict(
                self.spec.key, made_up, head.head_id, nobody, True, Reason.ACCEPTED, "", self.key.public_key,
                int(time.time() * 1000), head.head_id, {"examples": 1e9},
            ).signed(self.key)  # fmt: skip
            answers["mint"].append(self.http.post(f"{path}/verdicts", json=minted.to_wire()))
        for candidate in self.reader.candidates(self.spec.key):
            erased = Verdict(
                self.spec.key, candidate.candidate_id, candidate.base_head, candidate.peer_id, False,
                Reason.REGRESSION, "", self.key.public_key, int(time.time() * 1000),
            ).signed(self.key)  # fmt: skip
            answers["erase"].append(self.http.post(f"{path}/verdicts", json=erased.to_wire()))
        return answers
