"""Merge weight per admission principal: keys under one token weigh together what one peer may."""

from __future__ import annotations

import pytest

from native_peer.validator import share_principal_weight
from protocol.judging import Submission
from protocol.reasons import Reason
from protocol.screening import ACCEPT, PRESETS, Screen


def _submission(cid: str, examples: float, kind: str = "native", precheck: Screen = ACCEPT) -> Submission:
    return Submission(cid, f"peer-{cid}", kind, examples, None, precheck)


def test_keys_under_one_token_share_one_peers_weight() -> None:
    policy = PRESETS["balanced"]
    cap = dict(policy.max_examples_by_kind)["native"]
    sybils = [(_submission(f"s{i}", cap), "token-a") for i in range(4)]
    honest = [(_submission("h", 4000.0), "token-b"), (_submission("free", 4000.0), None)]
    out = {s.candidate_id: s.examples for s in share_principal_weight([*sybils, *honest], policy)}
    assert sum(out[f"s{i}"] for i in range(4)) == pytest.approx(cap)  # four keys: one peer's weight
    assert out["h"] == 4000.0 and out["free"] == 4000.0  # alone under its token, or no admission: as claimed


def test_rejected_submissions_take_no_share() -> None:
    policy = PRESETS["balanced"]
    stale = Screen(Reason.STALE_BASE, "old")
    out = share_principal_weight(
        [(_submission("a", 30000.0), "token"), (_submission("b", 30000.0, precheck=stale), "token")], policy
    )
    assert [s.examples for s in out] == [30000.0, 30000.0]  # b is rejected anyway; a keeps its weight
