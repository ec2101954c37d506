"""``protocol.judging``: the prechecks and the window decision, with real signatures."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from protocol.codec import encode_tensors
from protocol.hashing import content_id
from protocol.ids import DatasetId, HeadId, LeaseId, ShardId
from protocol.judging import Submission, judge_window, precheck
from protocol.messages import Candidate, Lease
from protocol.model import MODELS, evaluate, init_params
from protocol.reasons import Reason
from protocol.screening import ACCEPT, PRESETS
from protocol.signing import PureSigner, peer_id_from_public_key
from protocol.trust import TrustBook

from .support import EXPERIMENT

SPEC = MODELS["mnist-mlp"]
EDGE = PureSigner(b"\xee" * 32)
TRAINER = PureSigner(b"\x61" * 32)
HEAD = HeadId(content_id(b"current head"))


def _lease(signer: PureSigner = TRAINER, base: HeadId = HEAD, edge: PureSigner = EDGE) -> Lease:
    return Lease(
        LeaseId("lease-1"), EXPERIMENT, peer_id_from_public_key(signer.public_key), base, 3, DatasetId("mnist"),
        (ShardId("train-00001"),), 0, 10**13,
    ).signed(edge)  # fmt: skip


def _candidate(lease: Lease, examples: int = 960, signer: PureSigner = TRAINER) -> Candidate:
    artifact = encode_tensors(init_params(SPEC, 5))
    return Candidate.for_lease(
        lease, artifact, signer, peer_kind="native", examples=examples, steps=15, created_at_ms=1
    )


def _check(candidate: Candidate, lease: Lease | None, judged: set[str] | None = None) -> Reason:
    screen = precheck(
        candidate,
        current_head=HEAD,
        judged=judged or set(),
        lease=lease,
        leased_examples=1000,
        edge_key=EDGE.public_key,
    )
    return screen.reason


def test_precheck_accepts_a_proper_candidate() -> None:
    lease = _lease()
    assert _check(_candidate(lease), lease) == "accepted"


def test_precheck_reasons() -> None:
    lease = _lease()
    candidate = _candidate(lease)
    assert _check(candidate, lease, {candidate.candidate_id}) == "replay"
    assert _check(replace(candidate, examples=999), lease) == "bad_signature"
    assert _check(candidate, None) == "wrong_lease"
    other_peer = _lease(signer=PureSigner(b"\x62" * 32))
    assert _check(candidate, other_peer) == "wrong_lease"
    forged_lease = _lease(edge=PureSigner(b"\x63" * 32))
    assert _check(candidate, forged_lease) == "wrong_lease"
    assert _check(_candidate(lease, examples=5000), lease) == "out_of_lease"
    stale_lease = _lease(base=HeadId(content_id(b"older head")))
    assert _check(_candidate(stale_lease), stale_lease) == "stale_base"


def test_judge_window_decides_and_records_trust(dataset_root) -> None:  # type: ignore[no-untyped-def]
    from datasets.layout import load_split

    x, y = load_split(dataset_root / "mnist", "validation")
    base = init_params(SPEC, 0)
    rng = np.random.default_rng(1)
    honest = [
        {k: v + 0.001 * rng.standard_normal(v.shape).astype(np.float32) for k, v in base.items()} for _ in range(4)
    ]
    broken = {k: v.copy() for k, v in honest[0].items()}
    broken["dense0.bias"][0] = np.nan
    subs = [Submission(f"sha256:{i:064x}", f"peer-{i}", "native", 1000.0, p, ACCEPT) for i, p in enumerate(honest)]
    subs.append(Submission("sha256:" + "f" * 64, "peer-bad", "native", 1000.0, broken, ACCEPT))
    trust = TrustBook(max_strikes=1)
    decision = judge_window(
        SPEC, base, evaluate(SPEC, base, x[:1000], y[:1000]), subs, PRESETS["minimal"],
        lambda p: evaluate(SPEC, p, x[:1000], y[:1000]), trust,
    )  # fmt: skip
    assert decision.promoted and len(decision.accepted) == 4
    assert decision.screens["sha256:" + "f" * 64].reason is Reason.NON_FINITE
    assert decision.trust.quarantine == {"peer-bad"} and trust.quarantine == set()
    again = judge_window(
        SPEC, base, evaluate(SPEC, base, x[:1000], y[:1000]), subs[-1:], PRESETS["minimal"],
        lambda p: evaluate(SPEC, p, x[:1000], y[:1000]), decision.trust,
    )  # fmt: skip
    assert not again.promoted and again.screens["sha256:" + "f" * 64].reason is Reason.QUARANTINED
