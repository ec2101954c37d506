"""Heads are measured on the test split after they are published (issue #22 item 1): a validator's
signed ``Evaluation`` of a head, taken by a real uvicorn edge (SQLite) and listed by window, merged
into the viewer's snapshot, read back by clients only when a listed validator signed it."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from native_peer.edge_client import EdgeClient
from protocol.errors import InvalidMessage
from protocol.messages import EVALUATION_PAGE, Evaluation, HeadDescriptor, evaluated_metrics, merged_evaluations
from protocol.signing import PureSigner
from server.portal import EARLIER_POINTS, RECENT_HEADS, chart_heads
from server.serve import BackgroundEdge

from .support import EXPERIMENT, VALIDATOR, edge_settings, head_envelope, write_network

OUTSIDER = PureSigner(b"\x5a" * 32)
BASE = f"/v1/experiments/{EXPERIMENT}"


def _evaluation(head: HeadDescriptor, accuracy: float, signer: PureSigner = VALIDATOR) -> Evaluation:
    return Evaluation.of(head, "test", {"accuracy": accuracy, "loss": 1.0 - accuracy}, signer, 1_000)


def test_an_evaluation_is_signed_apart_from_its_head_and_read_only_from_listed_validators() -> None:
    head, _ = head_envelope()
    evaluation = _evaluation(head, 0.9)
    assert evaluation.metrics == {"test_accuracy": 0.9, "test_loss": pytest.approx(0.1)}
    assert Evaluation.from_wire(json.loads(json.dumps(evaluation.to_wire()))) == evaluation
    keys = frozenset({VALIDATOR.public_key})
    forged = Evaluation.from_wire({**evaluation.to_wire(), "metrics": {"test_accuracy": 1.0}})
    later = _evaluation(head, 0.5)  # the first one a validator signed for the head counts
    stranger = _evaluation(head, 0.99, OUTSIDER)
    assert evaluated_metrics([stranger, forged, evaluation, later], keys) == {head.head_id: evaluation.metrics}
    assert evaluated_metrics([stranger], keys) == {}
    assert merged_evaluations([later, evaluation]) == {head.head_id: later.metrics}
    with pytest.raises(InvalidMessage, match="split"):
        Evaluation.from_wire({**evaluation.to_wire(), "split": "holdout"})


@pytest.fixture
def edge(tmp_path: Path, dataset_root: Path) -> Iterator[tuple[httpx.Client, list[HeadDescriptor]]]:
    """A real edge with a lineage of three heads (quorum 1: each canonical as it is published)."""
    write_network(tmp_path / "network.json")
    with (
        BackgroundEdge(edge_settings(tmp_path, dataset_root)) as server,
        httpx.Client(base_url=server.url, timeout=10) as http,
    ):
        heads: list[HeadDescriptor] = []
        for window in range(3):
            head, body = head_envelope(parent=heads[-1].head_id if heads else None, window=window)
            assert http.post(f"{BASE}/heads", content=body).status_code == 201
            heads.append(head)
        yield http, heads


def test_the_edge_keeps_a_validators_evaluation_of_a_head_of_its_lineage(
    edge: tuple[httpx.Client, list[HeadDescriptor]],
) -> None:
    http, heads = edge
    assert http.get(f"{BASE}/evaluations").json() == []
    assert "test_accuracy" not in http.get("/portal/snapshot").json()["experiments"][0]["lineage"][0]["metrics"]
    first = _evaluation(heads[0], 0.11)
    assert http.post(f"{BASE}/evaluations", json=first.to_wire()).status_code == 201
    again = http.post(f"{BASE}/evaluations", json=_evaluation(heads[0], 0.5).to_wire())
    assert again.status_code == 200 and again.json()["metrics"]["test_accuracy"] == 0.5  # taken as a retry:
    assert http.post(f"{BASE}/evaluations", json=_evaluation(heads[2], 0.93).to_wire()).status_code == 201
    listed = [Evaluation.from_wire(e) for e in http.get(f"{BASE}/evaluations").json()]
    assert listed == [first, _evaluation(heads[2], 0.93)]  # ...the first copy stays
    assert [e.window for e in map(Evaluation.from_wire, http.get(f"{BASE}/evaluations?since_window=1").json())] == [2]
    assert len(http.get(f"{BASE}/evaluations?limit=1").json()) == 1
    assert http.get(f"{BASE}/evaluations?limit={EVALUATION_PAGE + 1}").status_code == 400

    lineage = http.get("/portal/snapshot").json()["experiments"][0]["lineage"]
    assert [h["metrics"].get("test_accuracy") for h in lineage] == [0.11, None, 0.93]
    client = EdgeClient(str(http.base_url))
    try:
        read = client.evaluated(EXPERIMENT, frozenset({VALIDATOR.public_key}))
    finally:
        client.close()
    assert read == {heads[0].head_id: first.metrics, heads[2].head_id: _evaluation(heads[2], 0.93).metrics}


def test_the_edge_refuses_evaluations_it_cannot_check_with_a_reason(
    edge: tuple[httpx.Client, list[HeadDescriptor]],
) -> None:
    http, heads = edge
    unknown, _ = head_envelope(window=7)  # a head this edge never took
    cases = {
        "outsider": (_evaluation(heads[1], 0.9, OUTSIDER).to_wire(), 401, "not signed by a validator"),
        "forged": ({**_evaluation(heads[1], 0.9).to_wire(), "metrics": {"test_accuracy": 1.0}}, 401, "signature"),
        "unknown head": (_evaluation(unknown, 0.9).to_wire(), 404, "no head"),
        "wrong window": (Evaluation.of(
            HeadDescriptor.from_wire({**heads[1].to_wire(), "window": 2}), "test", {"accuracy": 0.9}, VALIDATOR, 1
        ).to_wire(), 400, "of window 1"),
        "not a number": ({**_evaluation(heads[1], 0.9).to_wire(), "metrics": {"test_accuracy": "high"}}, 400, "finite number"),
    }  # fmt: skip
    for name, (body, status, reason) in cases.items():
        answer = http.post(f"{BASE}/evaluations", json=body)
        assert answer.status_code == status and reason in answer.json()["detail"], (name, answer.text)
    too_big = http.post(f"{BASE}/evaluations", content=b"{" + b" " * (32 << 10) + b"}")
    assert too_big.status_code == 413, too_big.text
    assert http.get(f"{BASE}/evaluations").json() == []  # nothing refused was kept


@pytest.mark.parametrize("length", [0, 1, 120, 240, 241, 10_000])
def test_the_snapshot_lists_a_bounded_lineage_with_every_recent_head(length: int) -> None:
    """However long the lineage, the viewer's snapshot lists its first head, every one of its newest
    ``RECENT_HEADS`` and at most ``EARLIER_POINTS`` evenly spaced before them, oldest first."""
    lineage = list(range(length))
    listed = chart_heads(lineage)  # type: ignore[arg-type]  # it only slices: windows stand for heads
    assert len(listed) <= RECENT_HEADS + EARLIER_POINTS
    assert listed[-RECENT_HEADS:] == lineage[-RECENT_HEADS:] and listed[:1] == lineage[:1]
    assert listed == sorted(set(listed))
    if length <= RECENT_HEADS + EARLIER_POINTS:
        assert listed == lineage
    else:
        gaps = [b - a for a, b in itertools.pairwise(listed[:EARLIER_POINTS])]
        assert max(gaps) - min(gaps) <= 1  # evenly spaced
