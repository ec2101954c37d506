"""Lease sizing: the pure rule a continuous trainer sizes its next lease by, and the edge's bounds on it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from native_peer.lease_sizer import LeaseSizer
from protocol.errors import InvalidMessage
from protocol.ids import HeadId
from protocol.lease_size import granted_shards, next_lease_shards, waited
from protocol.messages import LeaseGrant
from protocol.signing import PureSigner
from server.serve import BackgroundEdge

from .support import EXPERIMENT, edge_settings, experiment_spec, head_envelope, proof, write_network


def _head(digit: str) -> HeadId:
    return HeadId("sha256:" + digit * 64)


def test_a_sizer_sizes_once_per_head_and_counts_a_wait_once() -> None:
    """The trainer's thread and its follower's thread both size the lease after a head: the first
    sizing on a head stands, and a wait already counted when that head arrived is not counted again."""
    sizer = LeaseSizer(least=2, most=20)
    assert sizer.shards is None
    sizer.waited(0.3)
    sizer.size(_head("1"), 4, 0.1)  # waited 3 x its training
    assert (sizer.shards, sizer.idle_s) == (16, 0.0)
    sizer.size(_head("1"), 16, 0.1, late=True)  # the same head again: no second sizing
    assert sizer.shards == 16
    sizer.size(_head("2"), 16, 0.1, waited_s=0.1)  # at h2's arrival, after a wait of its own
    assert sizer.shards == 20  # 16 x (0.1 + 0.1) / 0.1, within the most
    sizer.waited(0.1, until=_head("2"))  # the trainer woke on h2: that wait was counted at its arrival
    assert sizer.idle_s == 0.0
    sizer.waited(0.1, until=_head("3"))
    assert sizer.idle_s == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("shards", "train_s", "idle_s", "late", "calm", "expected"),
    [
        (4, 0.1, 0.3, False, 2, (16, 0)),  # waited 3 x its training: four times the shards fill the period
        (4, 0.1, 0.004, False, 0, (4, 1)),  # no wait worth counting (under 5 %): the first calm window
        (4, 0.1, 0.004, False, 1, (4, 2)),  # the second: it keeps its size
        (4, 0.1, 0.004, False, 2, (3, 0)),  # the third in a row: it was the one waited for, one back
        (4, 0.1, 0.3, True, 2, (2, 0)),  # its work came late: halve
        (4, 0.1, 10.0, False, 0, (20, 0)),  # never past the experiment's most
        (2, 0.1, 0.0, False, 2, (2, 0)),  # never below its least
        (5, 0.0, 1.0, False, 1, (5, 1)),  # nothing trained: nothing to go by
    ],
)
def test_next_lease_fills_the_period_it_waited_through(
    shards: int, train_s: float, idle_s: float, late: bool, calm: int, expected: tuple[int, int]
) -> None:
    assert next_lease_shards(shards, train_s, idle_s, least=2, most=20, late=late, calm=calm) == expected


def test_a_lone_trainer_whose_validator_just_keeps_up_waits_in_fewer_windows() -> None:
    """A trainer whose next head comes ``period(n)`` seconds after the last for a lease of n shards (its
    validator's pace: a fixed cost and a little per shard), training 4 ms a shard: it settles around
    the size where it stops waiting (26-27) and waits in under a fifth of its windows, 2.5 % of its
    time (a shard back after every calm window: a third of its windows, 3.5 %)."""

    def period(n: int) -> float:
        return 0.1 + 0.0003 * n

    shards, calm, sizes, waits = 4, 0, [], []
    for _ in range(300):
        train_s = 0.004 * shards
        idle_s = max(0.0, period(shards) - train_s)
        waits.append(waited(train_s, idle_s))
        shards, calm = next_lease_shards(shards, train_s, idle_s, least=4, most=40, calm=calm)
        sizes.append(shards)
    steady = sizes[100:]
    idle = sum(max(0.0, period(n) - 0.004 * n) for n in steady) / sum(max(period(n), 0.004 * n) for n in steady)
    assert sum(waits[100:]) < len(steady) / 5 and idle < 0.03, (sum(waits[100:]), idle)
    assert all(25 <= n <= 28 for n in steady), sorted(set(steady))


@pytest.mark.parametrize(
    ("asked", "free", "expected_peers", "granted"),
    [
        (30, 37, 0, 30),  # a trainer alone: what it asks, one newcomer's least left free
        (40, 37, 0, 33),  # ... never that least
        (30, 37, 2, 25),  # two peers of the last window not here yet: their least kept for them too
        (30, 37, 9, 4),  # more expected than there is room for: the least, first come
        (4, 37, 0, 4),  # what it asked, when that is less
        (30, 3, 0, 3),  # fewer free than the least: what there is
        (30, 0, 0, 0),  # the window is full
    ],
)
def test_a_lease_takes_only_what_is_free_beyond_the_least_of_each_expected_peer(
    asked: int, free: int, expected_peers: int, granted: int
) -> None:
    assert granted_shards(asked, free, least=4, expected_peers=expected_peers) == granted


@pytest.mark.parametrize(
    ("asked", "free", "expected_peers", "served_first", "granted"),
    [
        (30, 37, 2, 2, 25),  # room beyond the peers with a record: as for anyone
        (4, 10, 2, 2, 2),  # the least of the two with a record kept: what is left
        (4, 8, 2, 2, 0),  # nothing beyond their least: no lease
        (4, 8, 2, 0, 4),  # a peer with a record (or nobody has one): its least, first come
        (30, 37, 9, 9, 1),  # nine expected with a record: the one shard they leave
    ],
)
def test_a_peer_without_a_record_takes_none_of_the_least_kept_for_peers_with_one(
    asked: int, free: int, expected_peers: int, served_first: int, granted: int
) -> None:
    assert granted_shards(asked, free, least=4, expected_peers=expected_peers, served_first=served_first) == granted


def test_a_lease_holds_what_its_spec_bounds() -> None:
    fixed = experiment_spec(shards_per_lease=2)
    assert [fixed.lease_shards(n) for n in (None, 1, 2, 9)] == [2, 2, 2, 2]
    sized = experiment_spec(shards_per_lease=2, max_shards_per_lease=8)
    assert [sized.lease_shards(n) for n in (None, 1, 5, 9)] == [2, 2, 5, 8]
    assert type(sized).from_wire(sized.to_wire()) == sized
    with pytest.raises(InvalidMessage):
        experiment_spec(shards_per_lease=4, max_shards_per_lease=2)


def test_the_edge_grants_what_is_asked_within_the_bounds_and_keeps_the_least_free_for_a_newcomer(
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

        assert total >= 16
        first = lease(1, 8)
        assert len(first) == 8  # what it asked
        assert len(lease(3, None)) == 2 and len(lease(4, 1)) == 2  # the least, asked or not
        second = lease(2, 30)
        assert len(second) == min(30, total - 12 - 2) and not set(first) & set(second)  # a newcomer's least kept
        assert len(lease(6, 30)) == 2  # that newcomer
        assert lease(1, 2) == first  # asking again in the window: the lease as granted
        # the next window keeps the least for each peer of this one until it has leased there
        head, _ = head_envelope()
        _, body = head_envelope(parent=head.head_id, window=1)
        assert http.post(f"/v1/experiments/{EXPERIMENT}/heads", content=body).status_code == 201
        assert len(lease(1, 30)) == min(30, total - 2 * 4 - 2)  # 3, 4, 2 and 6 are expected, and a newcomer
        assert len(lease(3, 30)) == min(30, total - len(lease(1, 30)) - 2 * 3 - 2)
        too_many = http.post(
            f"/v1/experiments/{EXPERIMENT}/leases",
            json=proof(PureSigner(b"\x05" * 32), "lease"),
            params={"shards": 257},
        )
        assert too_many.status_code == 400 and "shards" in too_many.text  # a clear refusal, not a clamp
