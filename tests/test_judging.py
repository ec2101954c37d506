"""``protocol.judging``: the prechecks and the window decision, with real signatures."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from native_peer.models import builtin_model
from protocol.aggregation import flatten, fltrust_trimmed_mean
from protocol.codec import encode_tensors
from protocol.hashing import content_id
from protocol.ids import DatasetId, HeadId, LeaseId, ShardId
from protocol.judging import (
    Submission,
    anchor_window,
    judge_window,
    precheck,
    reference_batches,
    staleness,
    staleness_weight,
)
from protocol.messages import Candidate, HeadDescriptor, Lease
from protocol.model import evaluate, init_params
from protocol.reasons import Reason
from protocol.screening import ACCEPT, PRESETS
from protocol.signing import PureSigner, peer_id_from_public_key
from protocol.trust import TrustBook

from .support import EXPERIMENT

SPEC = builtin_model("mnist-mlp")
EDGE = PureSigner(b"\xee" * 32)
TRAINER = PureSigner(b"\x61" * 32)
HEAD = HeadId(content_id(b"current head"))
PARENT = HeadId(content_id(b"the head before"))
VALIDATOR = PureSigner(b"\x64" * 32)
CURRENT = HeadDescriptor(EXPERIMENT, HEAD, PARENT, 3, 0, (), VALIDATOR.public_key, 0)
BEFORE = HeadDescriptor(EXPERIMENT, PARENT, None, 2, 0, (), VALIDATOR.public_key, 0)


def _lease(signer: PureSigner = TRAINER, base: HeadId = HEAD, edge: PureSigner = EDGE, window: int = 3) -> Lease:
    return Lease(
        LeaseId("lease-1"), EXPERIMENT, peer_id_from_public_key(signer.public_key), base, window, DatasetId("mnist"),
        (ShardId("train-00001"),), 0, 10**13,
    ).signed(edge)  # fmt: skip


def _candidate(lease: Lease, examples: int = 960, signer: PureSigner = TRAINER, on: HeadId | None = None) -> Candidate:
    artifact = encode_tensors(init_params(SPEC, 5))
    return Candidate.for_lease(
        lease, on or lease.base_head, artifact, signer, peer_kind="native", examples=examples, steps=15, created_at_ms=1
    )


def _check(candidate: Candidate, lease: Lease | None, judged: set[str] | None = None) -> Reason:
    screen = precheck(
        candidate,
        current=CURRENT,
        base={HEAD: CURRENT, PARENT: BEFORE}.get(candidate.base_head),
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


def test_precheck_takes_a_delayed_update_and_a_lease_granted_ahead() -> None:
    late = _lease(base=PARENT, window=2)  # its window closed before it delivered: judged one window later
    assert _check(_candidate(late), late) == "accepted"
    ahead = _lease(base=PARENT, window=3)  # granted on the parent, for this window, before this head existed
    assert _check(_candidate(ahead, on=HEAD), ahead) == "accepted"
    assert _check(_candidate(ahead), ahead) == "wrong_lease"  # not a lease of the parent's own window


@pytest.mark.parametrize(("base_head", "behind"), [(HEAD, 0), (PARENT, 1), (HeadId(content_id(b"older head")), None)])
def test_staleness_counts_windows_behind_the_current_head(base_head: HeadId, behind: int | None) -> None:
    assert staleness(base_head, CURRENT) == behind


def test_a_delayed_update_is_discounted_in_the_merge_and_each_lease_window_counts_once(dataset_root) -> None:  # type: ignore[no-untyped-def]
    from datasets.layout import load_split

    x, y = load_split(dataset_root / "mnist", "validation")
    base = init_params(SPEC, 0)
    fresh = {k: v + np.float32(1e-3) for k, v in base.items()}
    delayed = {k: v + np.float32(0.8e-3) for k, v in base.items()}
    subs = [
        Submission("sha256:" + "1" * 64, "peer-a", "native", 1000.0, fresh, ACCEPT, lease_window=3),
        Submission("sha256:" + "2" * 64, "peer-a", "native", 1000.0, delayed, ACCEPT, lease_window=2, windows_behind=1),
    ]
    assert staleness_weight(0) == 1.0 and staleness_weight(1) == pytest.approx(1 / np.sqrt(2))
    decision = judge_window(
        SPEC, base, evaluate(SPEC, base, x[:1000], y[:1000]), subs, PRESETS["minimal"],
        lambda p: evaluate(SPEC, p, x[:1000], y[:1000]),
    )  # fmt: skip
    assert len(decision.accepted) == 2, decision.screens  # one peer, two lease windows: both count
    assert decision.merged is not None
    late = staleness_weight(1)  # a delayed update counts as s(τ)·Δ at its examples' weight (FedBuff)
    expected = base["dense0.bias"] + (1e-3 + late * 0.8e-3) / 2
    np.testing.assert_allclose(decision.merged["dense0.bias"], expected, rtol=1e-4)
    again = judge_window(
        SPEC, base, evaluate(SPEC, base, x[:1000], y[:1000]), [subs[0], replace(subs[1], lease_window=3)],
        PRESETS["minimal"], lambda p: evaluate(SPEC, p, x[:1000], y[:1000]),
    )  # fmt: skip
    assert again.screens["sha256:" + "2" * 64].reason is Reason.REPLAY  # the same lease window twice


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


@pytest.mark.parametrize(
    ("window", "every", "anchor"),
    [(0, 1, 0), (5, 1, 5), (0, 4, 0), (3, 4, 0), (4, 4, 4), (7, 4, 4), (9, 4, 8), (2, 3, 0), (6, 3, 6)],
)
def test_a_window_is_anchored_at_the_last_multiple_of_anchor_every(window: int, every: int, anchor: int) -> None:
    assert anchor_window(window, every) == anchor


@pytest.mark.parametrize(("window", "every"), [(-1, 4), (3, 0)])
def test_anchor_windows_refuse_a_negative_window_or_no_period(window: int, every: int) -> None:
    with pytest.raises(ValueError):
        anchor_window(window, every)


def test_reference_batches_are_seeded_by_the_head_and_cover_the_split() -> None:
    first = reference_batches(HEAD, 1000, 15, 256)
    assert first.shape == (15, 256) and first.dtype == np.int64
    np.testing.assert_array_equal(first, reference_batches(HEAD, 1000, 15, 256))  # every validator
    assert not np.array_equal(first, reference_batches(HeadId(content_id(b"next head")), 1000, 15, 256))
    flat = first.ravel()
    assert sorted(flat[:1000]) == list(range(1000))  # whole epochs of the split: each once before any twice
    with pytest.raises(ValueError):
        reference_batches(HEAD, 0, 15, 256)  # nothing to draw from


def test_judge_window_with_a_reference_update(dataset_root) -> None:  # type: ignore[no-untyped-def]
    """The validator's reference anchors the window: a sign-flipped update is untrusted, the others
    are merged with FLTrust trust, and the result does not depend on the order of submissions."""
    from datasets.layout import load_split

    x, y = load_split(dataset_root / "mnist", "validation")
    x, y = x[:1000], y[:1000]
    base = init_params(SPEC, 0)
    rng = np.random.default_rng(2)
    direction = {k: 0.002 * rng.standard_normal(v.shape).astype(np.float32) for k, v in base.items()}
    reference = {k: v + direction[k] for k, v in base.items()}
    honest = [
        {k: v + (0.6 + 0.2 * i) * direction[k] + 0.001 * rng.standard_normal(v.shape).astype(np.float32) for k, v in base.items()}
        for i in range(4)
    ]  # fmt: skip
    flipped = {k: v - direction[k] for k, v in base.items()}
    subs = [Submission(f"sha256:{i:064x}", f"peer-{i}", "native", 1000.0, p, ACCEPT) for i, p in enumerate(honest)]
    subs.append(Submission("sha256:" + "f" * 64, "peer-bad", "native", 1000.0, flipped, ACCEPT))

    def judge(order: list[Submission]) -> Any:
        return judge_window(
            SPEC, base, evaluate(SPEC, base, x, y), order, PRESETS["balanced"],
            lambda p: evaluate(SPEC, p, x, y), TrustBook(), reference=reference, salt=b"window salt",
        )  # fmt: skip

    decision = judge(subs)
    assert decision.anchored and decision.promoted and len(decision.accepted) == 4
    assert decision.screens["sha256:" + "f" * 64].reason is Reason.UNTRUSTED_DIRECTION
    assert decision.reference_cosines["sha256:" + "f" * 64] == pytest.approx(-1.0, abs=1e-3)
    assert decision.trust.strikes["peer-bad"] == Reason.UNTRUSTED_DIRECTION.strike_weight
    flat_base = flatten(SPEC, base)
    expected = fltrust_trimmed_mean(
        np.stack([flatten(SPEC, p) - flat_base for p in honest]),
        np.full(4, 1000.0),
        reference=flatten(SPEC, reference) - flat_base,
        ranks=None,
    )
    assert decision.merged is not None
    np.testing.assert_allclose(flatten(SPEC, decision.merged) - flat_base, expected, atol=1e-6)
    again = judge(list(reversed(subs)))
    assert again.merged is not None
    assert all(decision.merged[k].tobytes() == again.merged[k].tobytes() for k in SPEC.shapes)
    wrong = {"dense0.kernel": np.zeros((2, 2), np.float32)}
    with pytest.raises(ValueError):  # the validator's own update must be this model's
        judge_window(
            SPEC, base, evaluate(SPEC, base, x, y), subs, PRESETS["balanced"],
            lambda p: evaluate(SPEC, p, x, y), reference=wrong,
        )  # fmt: skip


@pytest.mark.parametrize("anchored", [False, True])
def test_leave_one_out_probes_from_running_sums_equal_the_merge_rebuilt_without_each_update(anchored: bool) -> None:
    """The O(n·D) probes compute what rebuilding the linear merge from the n − 1 others computed."""
    from protocol.aggregation import clipped, weighted_mean
    from protocol.judging import Merge

    rng = np.random.default_rng(7)
    base = init_params(SPEC, 0)
    flat = flatten(SPEC, base)
    subs = [
        Submission(
            f"sha256:{i:064x}", f"peer-{i}", "native", float(rng.integers(500, 1500)),
            {k: v + 0.01 * rng.standard_normal(v.shape).astype(np.float32) for k, v in base.items()}, ACCEPT,
        )
        for i in range(6)
    ]  # fmt: skip
    reference = {k: v + 0.01 * rng.standard_normal(v.shape).astype(np.float32) for k, v in base.items()}
    policy = PRESETS["balanced"]
    merge = Merge(SPEC, base, subs, policy, "weighted_mean", b"", reference if anchored else None)
    deltas = np.stack([flatten(SPEC, s.params) - flat for s in subs])  # type: ignore[arg-type]
    weights = np.array([s.examples for s in subs])
    ref = flatten(SPEC, reference) - flat
    for i in [None, *range(len(subs))]:
        keep = [j for j in range(len(subs)) if j != i]
        if anchored:  # the rows clipped to the anchor's norm; the anchor itself takes no part
            expected = weighted_mean(clipped(deltas[keep], float(np.linalg.norm(ref))), weights[keep])
        else:
            expected = weighted_mean(deltas[keep], weights[keep])
        np.testing.assert_allclose(flatten(SPEC, merge.probe(without=i)), flat + expected, rtol=1e-6, atol=1e-7)
