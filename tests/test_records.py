"""A peer's record in the lineage and the merge weight it earns (issue #27 item 8): read from the
canonical heads' merged peers alone, in quarters, so every validator weighs a window alike."""

from __future__ import annotations

from protocol.judging import Submission
from protocol.reasons import Reason
from protocol.records import FULL_RECORD, RECORD_HEADS, peer_records, record_weight, weigh_by_record
from protocol.screening import Screen


def _submission(peer: str, examples: float = 4_000.0, kind: str = "native") -> Submission:
    return Submission(f"sha256:{peer:0>64}", peer, kind, examples, None, Screen(Reason.ACCEPTED))


def test_a_record_counts_the_recent_heads_that_merged_a_peers_work_once_each() -> None:
    heads = [{"a", "b"}, {"a"}, set(), ["a", "a"]]  # two candidates of a's in one head count once
    assert peer_records(heads) == {"a": 3, "b": 1}
    assert RECORD_HEADS == 8 and FULL_RECORD == 3


def test_a_new_identity_weighs_a_quarter_and_an_established_peer_fully_in_quarters() -> None:
    assert [record_weight(n) for n in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    window = [_submission("old"), _submission("new"), _submission("browser", 9_000.0, "browser")]
    weighed = weigh_by_record(window, {"old": 5, "browser": 1}, {"browser": 2_000.0})
    assert [s.examples for s in weighed] == [4_000.0, 1_000.0, 1_000.0]  # a browser: capped, then weighed
    # a window of new peers only (a lone trainer, a first cohort) keeps its relative weights
    fresh = weigh_by_record([_submission("x"), _submission("y", 2_000.0)], {}, {})
    assert [s.examples for s in fresh] == [1_000.0, 500.0]
