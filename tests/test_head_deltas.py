"""Heads as deltas from their parents (``protocol.head_delta``): rebuilt bit for bit and checked by
content id, refused when they are not what they claim; the edge serves them from a head's parent only
(a real uvicorn edge, real signed heads) and the native follower rebuilds heads from them."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest

from native_peer.edge_client import EdgeClient
from native_peer.head_follower import HeadFollower
from native_peer.storage import StorageConfig
from protocol.codec import decode_tensors, encode_tensors
from protocol.errors import CodecError, IntegrityError, ProtocolError
from protocol.hashing import content_id
from protocol.head_delta import FORMAT, GRID_FORMAT, apply_delta, encode_delta
from protocol.head_grid import snap
from protocol.model import init_params
from server.serve import BackgroundEdge

from .support import EXPERIMENT, SPEC, edge_settings, experiment_spec, head_envelope, metric, write_network

BASE = f"/v1/experiments/{EXPERIMENT}"


def _stepped(params: dict[str, np.ndarray], seed: int, size: float = 0.03) -> dict[str, np.ndarray]:
    """``params`` moved as a window moves them: every weight by a few per cent, a few sign changes."""
    rng = np.random.default_rng(seed)
    return {
        name: (
            value + size * np.abs(value) * rng.standard_normal(value.shape) + 1e-4 * rng.standard_normal(value.shape)
        ).astype(np.float32)
        for name, value in params.items()
    }


def _noise(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Finite float32s of random bits: a head no delta can make smaller."""
    rng = np.random.default_rng(7)
    noise = {}
    for name, value in params.items():
        bits = rng.integers(0, 2**32, value.shape, dtype=np.uint32) & np.uint32(0x807FFFFF)
        noise[name] = (bits | rng.integers(1, 255, value.shape, dtype=np.uint32) << np.uint32(23)).view(np.float32)
    return noise


PARENT = encode_tensors(init_params(SPEC, 0), {"window": "0"})
CHILD = encode_tensors(_stepped(init_params(SPEC, 0), 1), {"window": "1"})


def test_a_delta_rebuilds_the_child_bit_for_bit_and_is_smaller() -> None:
    delta = encode_delta(PARENT, CHILD)
    assert apply_delta(PARENT, content_id(PARENT), delta, content_id(CHILD)) == CHILD
    assert len(delta) < 0.8 * len(CHILD)
    same = encode_delta(PARENT, PARENT)  # a window that merged nothing: its head's tensors unchanged
    assert apply_delta(PARENT, content_id(PARENT), same, content_id(PARENT)) == PARENT
    assert len(same) < 0.01 * len(PARENT)


def _tampered(delta: bytes, change: str) -> bytes:
    tensors, metadata = decode_tensors(delta)
    if change == "planes":
        packed = bytearray(zlib.decompress(tensors["planes"].tobytes()))
        packed[len(packed) // 2] ^= 1
        tensors["planes"] = np.frombuffer(zlib.compress(bytes(packed)), np.uint8)
    elif change == "bomb":  # inflates far past the base's size
        tensors["planes"] = np.frombuffer(zlib.compress(bytes(64 << 20)), np.uint8)
    elif change == "truncated":
        tensors["planes"] = tensors["planes"][:-10]
    elif change == "words":
        metadata["words"] = "7"
    elif change == "header":
        tensors["header"] = np.zeros(2 << 20, np.uint8)
    elif change == "dtype":
        tensors["header"] = tensors["header"].astype(np.int16)
    return encode_tensors(tensors, metadata)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ("planes", IntegrityError),
        ("bomb", CodecError),
        ("truncated", CodecError),
        ("words", CodecError),
        ("header", CodecError),
        ("dtype", CodecError),
    ],
)
def test_a_tampered_delta_is_refused(change: str, error: type[ProtocolError]) -> None:
    with pytest.raises(error):
        apply_delta(PARENT, content_id(PARENT), _tampered(encode_delta(PARENT, CHILD), change), content_id(CHILD))


def test_a_delta_applies_only_from_its_base_to_its_target() -> None:
    delta = encode_delta(PARENT, CHILD)
    other = encode_tensors(init_params(SPEC, 5), {"window": "0"})
    with pytest.raises(CodecError):  # named for another base
        apply_delta(other, content_id(other), delta, content_id(CHILD))
    with pytest.raises(IntegrityError):  # another base's bytes under the right id: rebuilds other bytes
        apply_delta(other, content_id(PARENT), delta, content_id(CHILD))
    with pytest.raises(CodecError):  # asked for another head
        apply_delta(PARENT, content_id(PARENT), delta, content_id(other))
    with pytest.raises(CodecError):  # artifacts of different sizes have no delta
        encode_delta(PARENT, encode_tensors({"x": np.zeros(3, np.float32)}))
    with pytest.raises(ProtocolError):  # not even an artifact
        apply_delta(PARENT, content_id(PARENT), b"not an artifact", content_id(CHILD))


@pytest.fixture
def edge(tmp_path: Path, dataset_root: Path) -> Iterator[BackgroundEdge]:
    write_network(tmp_path / "network.json")
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as running:
        yield running


def _promote(http: httpx.Client, params: dict[str, np.ndarray], parent: str | None, window: int) -> str:
    head, body = head_envelope(params, parent=parent, window=window)  # type: ignore[arg-type]
    assert http.post(f"{BASE}/heads", content=body).status_code == 201
    return head.head_id


def _delta_bytes_served(http: httpx.Client) -> float:
    return metric(http, "dtn_head_delta_bytes_total")


def test_the_edge_serves_a_head_as_a_delta_from_its_parent_only(edge: BackgroundEdge) -> None:
    genesis = init_params(SPEC, 0)
    with httpx.Client(base_url=edge.url, timeout=10) as http:
        parent = _promote(http, genesis, None, 0)
        child = _promote(http, _stepped(genesis, 1), parent, 1)
        unrelated = _promote(http, _noise(genesis), child, 2)  # a jump: its delta is no smaller
        base_bytes = http.get(f"/v1/artifacts/{parent}").content
        answer = http.get(f"{BASE}/heads/{child}/delta", params={"from": parent})
        assert answer.status_code == 200 and answer.headers["cache-control"].endswith("immutable")
        assert apply_delta(base_bytes, parent, answer.content, child) == http.get(f"/v1/artifacts/{child}").content
        assert _delta_bytes_served(http) == len(answer.content)
        again = http.get(
            f"{BASE}/heads/{child}/delta", params={"from": parent}, headers={"if-none-match": answer.headers["etag"]}
        )
        assert again.status_code == 304 and _delta_bytes_served(http) == len(answer.content)
        for head_id, base, why in (
            (child, unrelated, "from its parent"),  # not its parent: no delta between heads of one's choosing
            (parent, parent, "from its parent"),  # genesis has none
            (unrelated, child, "no smaller than the head"),  # a jump: download the head
        ):
            refused = http.get(f"{BASE}/heads/{head_id}/delta", params={"from": base})
            assert refused.status_code == 404 and why in refused.json()["detail"], refused.text
        assert http.get(f"{BASE}/heads/sha256:{'0' * 64}/delta", params={"from": parent}).status_code == 404
        assert http.get(f"{BASE}/heads/not-an-id/delta", params={"from": parent}).status_code == 400
        assert http.get(f"{BASE}/heads/{child}/delta").status_code == 400  # no base named


def test_an_experiment_on_the_int8_grid_has_its_heads_served_as_a_quarter_of_a_head(
    tmp_path: Path, dataset_root: Path
) -> None:
    write_network(tmp_path / "network.json", replace(experiment_spec(), head_grid="int8"))
    genesis = init_params(SPEC, 0)
    with (
        BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge,
        httpx.Client(base_url=edge.url, timeout=10) as http,
    ):
        parent = _promote(http, genesis, None, 0)
        on_grid = _promote(http, snap(genesis, _stepped(genesis, 1), b"w1"), parent, 1)
        off_grid = _promote(
            http, _stepped(decode_tensors(http.get(f"/v1/artifacts/{on_grid}").content)[0], 2), on_grid, 2
        )
        for head_id, base, kind in ((on_grid, parent, GRID_FORMAT), (off_grid, on_grid, FORMAT)):
            answer = http.get(f"{BASE}/heads/{head_id}/delta", params={"from": base})
            assert answer.status_code == 200 and decode_tensors(answer.content)[1]["format"] == kind
            artifact = http.get(f"/v1/artifacts/{head_id}").content
            assert apply_delta(http.get(f"/v1/artifacts/{base}").content, base, answer.content, head_id) == artifact
            if kind == GRID_FORMAT:
                assert len(answer.content) <= 0.3 * len(artifact)


def test_a_native_follower_rebuilds_heads_from_deltas(edge: BackgroundEdge, tmp_path: Path) -> None:
    genesis = init_params(SPEC, 0)
    with httpx.Client(base_url=edge.url, timeout=10) as http:
        parent = _promote(http, genesis, None, 0)
        client = EdgeClient(edge.url)
        follower = HeadFollower(client, EXPERIMENT, StorageConfig(tmp_path / "trainer"))
        try:
            first = follower.current()
            assert first is not None and first.head.head_id == parent and follower.delta_bytes == 0  # whole
            child = _promote(http, _stepped(genesis, 1), parent, 1)
            followed = follower.newer(parent, 10.0)
            assert followed is not None and followed.head.head_id == child
            assert 0 < follower.delta_bytes == _delta_bytes_served(http)
            for name, value in decode_tensors(http.get(f"/v1/artifacts/{child}").content)[0].items():
                np.testing.assert_array_equal(followed.tensors[name], value)
        finally:
            follower.close()
            client.close()
