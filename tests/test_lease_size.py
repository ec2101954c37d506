"""Lease sizing: the pure rule a continuous trainer sizes its next lease by, and the edge's bounds on it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from protocol.errors import InvalidMessage
from protocol.lease_size import next_lease_shards
from protocol.messages import LeaseGrant
from protocol.signing import PureSigner
from server.serve import BackgroundEdge

from .support import EXPERIMENT, edge_settings, experiment_spec, head_envelope, proof, write_network


@pytest.mark.parametrize(
    ("shards", "train_s", "idle_s", "late", "expected"),
    [
        (4, 0.1, 0.3, False, 16),  # waited 3 x its training: four times the shards fill the period
        (4, 0.1, 0.004, False, 3),  # no wait worth counting (under 5 %): it was the one waited for, one back
        (4, 0.1, 0.3, True, 2),  # its work came late: halve
        (4, 0.1, 10.0, False, 20),  # never past the experiment's most
        (2, 0.1, 0.0, False, 2),  # never below its least
        (5, 0.0, 1.0, False, 5),  # nothing trained: nothing to go by
    ],
)
def test_next_lease_fills_the_period_it_waited_through(
    shards: int, train_s: float, idle_s: float, late: bool, expected: int
) -> None:
    assert next_lease_shards(shards, train_s, idle_s, least=2, most=20, late=late) == expected


def test_a_lease_holds_what_its_spec_bounds() -> None:
    fixed = experiment_spec(shards_per_lease=2)
    assert [fixed.lease_shards(n) for n in (None, 1, 2, 9)] == [2, 2, 2, 2]
    sized = experiment_spec(shards_per_lease=2, max_shards_per_lease=8)
    assert [sized.lease_shards(n) for n in (None, 1, 5, 9)] == [2, 2, 5, 8]
    assert type(sized).from_wire(sized.to_wire()) == sized
    with pytest.raises(InvalidMessage):
        experiment_spec(shards_per_lease=4, max_shards_per_lease=2)


def test_the_edge_grants_what_is_asked_within_the_bounds_and_half_the_free_shards(
    tmp_path: Path, dataset_root: Path
) -> None:
    write_network(tmp_path / "network.json", experiment_spec(shards_per_lease=2, max_shards_per_lease=30))
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge, httpx.Client(base_url=edge.url) as http:
        _, body = head_envelope()
        assert http.post(f"/v1/experiments/{EXPERIMENT}/heads", content=body).status_code == 201
        total = len(http.get("/v1/datasets/mnist/fetch-manifest.json").json()["shards"])

        def lease(seed: int, shards: int | None) -> tuple[str, ...]:
            params = {} if shards is None else {"shards": shards}
            response = http.post(
                f"/v1/experiments/{EXPERIMENT}/leases",
                json=proof(PureSigner(bytes([seed]) * 32), "lease"),
                params=params,
            )
            assert response.status_code == 200, response.text
            return LeaseGrant.from_wire(response.json()).lease.shard_ids

        first = lease(1, 30)
        assert len(first) == min(30, total // 2)  # half of the free shards at most
        second = lease(2, 30)
        assert len(second) == min(30, (total - len(first)) // 2) and not set(first) & set(second)
        assert len(lease(3, None)) == 2 and len(lease(4, 1)) == 2  # the least, asked or not
        assert lease(1, 2) == first  # asking again in the window: the lease as granted
        too_many = http.post(
            f"/v1/experiments/{EXPERIMENT}/leases",
            json=proof(PureSigner(b"\x05" * 32), "lease"),
            params={"shards": 257},
        )
        assert too_many.status_code == 400 and "shards" in too_many.text  # a clear refusal, not a clamp
