"""Heads on their parent's int8 grid (``protocol.head_grid``) and their deltas (``protocol.head_delta``
v2): the same head from the same salt at every validator, unbiased and bounded steps, a delta of a
quarter of the head that rebuilds it bit for bit, exceptions kept exactly, and tampered deltas refused."""

from __future__ import annotations

import base64
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from protocol.codec import decode_tensors, encode_tensors
from protocol.errors import CodecError, IntegrityError, ProtocolError
from protocol.hashing import content_id
from protocol.head_delta import FORMAT, GRID_FORMAT, apply_delta, encode_delta
from protocol.head_grid import BLOCK, block_of, block_starts, snap
from protocol.model import init_params
from server.peer_runtime import PeerBundle

from .conftest import REPO
from .support import SPEC, on_pyodide


def _adam_window(params: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """``params`` after a window of Adam-like steps: most weights move by up to 0.06, some barely."""
    rng = np.random.default_rng(seed)
    moved = {}
    for name, value in params.items():
        size = 0.06 * rng.random(value.shape) * (rng.random(value.shape) < 0.9) + 1e-6
        moved[name] = (value + size * np.sign(rng.standard_normal(value.shape))).astype(np.float32)
    return moved


GENESIS = init_params(SPEC, 0)
STEPPED = _adam_window(GENESIS, 1)
ON_GRID = snap(GENESIS, STEPPED, b"window 1")
PARENT, CHILD = encode_tensors(GENESIS, {"window": "0"}), encode_tensors(ON_GRID, {"window": "1"})


def test_validators_that_merge_alike_snap_alike_and_the_salt_draws_the_rounding() -> None:
    again = snap(GENESIS, STEPPED, b"window 1")
    assert all(again[name].tobytes() == ON_GRID[name].tobytes() for name in ON_GRID)
    other = snap(GENESIS, STEPPED, b"window 2")
    assert any(other[name].tobytes() != ON_GRID[name].tobytes() for name in ON_GRID)


def test_a_grid_step_is_within_its_blocks_quantum_and_unbiased() -> None:
    name = max(GENESIS, key=lambda n: GENESIS[n].size)
    base, new = GENESIS[name].ravel().astype(np.float64), STEPPED[name].ravel().astype(np.float64)
    starts = block_starts([base.size])
    quantum = (2 * np.maximum.reduceat(np.abs(new - base), starts) / 127)[block_of(starts, base.size)]
    error = ON_GRID[name].ravel() - new
    assert (np.abs(error) <= quantum + 1e-7).all()  # 2^e < 2 · the block's largest step / 127
    # unbiased: over salts the mean grid step is the step, also for weights that barely move
    draws = np.stack([snap(GENESIS, STEPPED, bytes([i]))[name].ravel() for i in range(64)]).astype(np.float64)
    spread = quantum / np.sqrt(64)
    assert np.abs(draws.mean(axis=0) - new).mean() < 0.3 * spread.mean()
    # the mean of 64 unbiased draws errs about 1/8 as much as one draw; a biased rounding as much as one
    assert np.abs(draws.mean(axis=0) - new).mean() < 0.25 * np.abs(error).mean()


def test_what_has_no_grid_step_is_kept_as_it_is() -> None:
    new = {
        "w": np.array([1.0, np.inf], np.float32),  # a step that is not finite
        "ints": np.arange(3, dtype=np.int32),  # not float32
        "shape": np.ones(4, np.float32),  # another shape than the parent's
        "new": np.ones(2, np.float32),  # the parent lacks it
    }
    base = {"w": np.zeros(2, np.float32), "ints": np.zeros(3, np.int32), "shape": np.ones(5, np.float32)}
    snapped = snap(base, new, b"s")
    assert all(snapped[name] is new[name] for name in new)


def test_a_head_on_its_parents_grid_comes_as_a_quarter_of_itself_bit_for_bit() -> None:
    delta = encode_delta(PARENT, CHILD, "int8")
    assert decode_tensors(delta)[1]["format"] == GRID_FORMAT
    assert apply_delta(PARENT, content_id(PARENT), delta, content_id(CHILD)) == CHILD
    assert len(delta) <= 0.3 * len(CHILD)
    exact = encode_delta(PARENT, CHILD)  # the exact format of the same heads
    assert decode_tensors(exact)[1]["format"] == FORMAT and len(exact) > 1.5 * len(delta)


def test_words_off_the_grid_travel_as_exceptions_and_a_head_off_it_goes_exact() -> None:
    touched = {name: value.copy() for name, value in ON_GRID.items()}
    name = max(touched, key=lambda n: touched[n].size)
    touched[name].ravel()[[5, 700, 4000]] = np.float32(0.123456)  # three words off the grid
    target = encode_tensors(touched, {"window": "1"})
    delta = encode_delta(PARENT, target, "int8")
    tensors, metadata = decode_tensors(delta)
    assert metadata["format"] == GRID_FORMAT and len(tensors["except_index"]) >= 3
    assert apply_delta(PARENT, content_id(PARENT), delta, content_id(target)) == target
    exact_step = encode_tensors(STEPPED, {"window": "1"})  # merged without the grid: most words off it
    assert decode_tensors(encode_delta(PARENT, exact_step, "int8"))[1]["format"] == FORMAT


def _tampered(change: str) -> bytes:
    tensors, metadata = decode_tensors(encode_delta(PARENT, CHILD, "int8"))
    if change == "steps":
        q = bytearray(zlib.decompress(tensors["steps"].tobytes()))
        q[len(q) // 2] ^= 1
        tensors["steps"] = np.frombuffer(zlib.compress(bytes(q)), np.uint8)
    elif change == "bomb":
        tensors["steps"] = np.frombuffer(zlib.compress(bytes(64 << 20)), np.uint8)
    elif change == "segments":
        tensors["segments"] = tensors["segments"] + np.uint32(1)
    elif change == "exponents":
        tensors["exponents"] = tensors["exponents"][:-1]
    elif change == "exponent range":
        tensors["exponents"] = np.full_like(tensors["exponents"], 32767)
    elif change == "exceptions":
        tensors["except_index"] = np.array([2**31], np.uint32)
        tensors["except_words"] = np.zeros(1, np.uint32)
    elif change == "exception count":
        tensors["except_words"] = np.zeros(5, np.uint32)
    elif change == "dtype":
        tensors["exponents"] = tensors["exponents"].astype(np.int32)
    return encode_tensors(tensors, metadata)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ("steps", IntegrityError),
        ("bomb", CodecError),
        ("segments", CodecError),
        ("exponents", CodecError),
        ("exponent range", IntegrityError),
        ("exceptions", CodecError),
        ("exception count", CodecError),
        ("dtype", CodecError),
    ],
)
def test_a_tampered_grid_delta_is_refused(change: str, error: type[ProtocolError]) -> None:
    with pytest.raises(error):
        apply_delta(PARENT, content_id(PARENT), _tampered(change), content_id(CHILD))


def test_blocks_stay_within_their_tensor() -> None:
    starts = block_starts([3, 0, BLOCK + 1])
    assert starts.tolist() == [0, 3, 3 + BLOCK]
    assert block_of(starts, 3 + BLOCK + 1).tolist() == [0, 0, 0] + [1] * BLOCK + [2]


@pytest.mark.slow  # starts Node
def test_a_tab_rebuilds_a_grid_head_and_snaps_alike_in_pyodide(tmp_path: Path) -> None:
    """The peer bundle's code under Pyodide (32-bit NumPy in WebAssembly) rebuilds the head from the
    grid delta made here, and snaps the same step to the same bytes as this machine."""
    (tmp_path / "bundle.zip").write_bytes(PeerBundle(REPO).data)
    with zipfile.ZipFile(tmp_path / "bundle.zip") as archive:
        assert "protocol/head_grid.py" in archive.namelist()
    delta = encode_delta(PARENT, CHILD, "int8")
    given = {name: base64.b64encode(data).decode() for name, data in (("parent", PARENT), ("delta", delta))}
    stepped = base64.b64encode(encode_tensors(STEPPED)).decode()
    (tmp_path / "grid.py").write_text(
        f"""
import base64, json
from protocol.codec import decode_tensors, encode_tensors
from protocol.hashing import content_id
from protocol.head_delta import apply_delta
from protocol.head_grid import snap
parent, delta = (base64.b64decode(s) for s in ({given["parent"]!r}, {given["delta"]!r}))
rebuilt = apply_delta(parent, content_id(parent), delta, {content_id(CHILD)!r})
genesis, stepped = decode_tensors(parent)[0], decode_tensors(base64.b64decode({stepped!r}))[0]
json.dumps({{"rebuilt": content_id(rebuilt), "snapped": content_id(encode_tensors(snap(genesis, stepped, b"window 1"), {{"window": "1"}}))}})
"""
    )
    kernels = REPO / "var" / "kernels" / "kernels.wasm"
    result = on_pyodide(tmp_path / "grid.py", kernels, str(tmp_path / "bundle.zip"))
    assert result == {"rebuilt": content_id(CHILD), "snapped": content_id(CHILD)}
