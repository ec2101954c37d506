"""The WebAssembly SIMD kernels (browser_peer/kernels/kernels.wat, built by ``make
var/kernels/kernels.wasm`` and, with relaxed SIMD's fused multiply-adds, ``kernels-fma.wasm``) agree
with NumPy, each build: the GEMMs in the layouts a dense layer's forward, weight gradient and input
gradient use, and the fused Adam update, run in Node on one shared linear memory."""

from __future__ import annotations

import io
import json
import os
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from server.peer_runtime import PeerBundle

from .conftest import REPO
from .support import node_command, on_pyodide

BUILDS = ("kernels.wasm", "kernels-fma.wasm")
HARNESS = Path(__file__).with_name("wasm_kernels_harness.mjs")

pytestmark = pytest.mark.slow  # starts Node


@pytest.fixture(params=BUILDS)
def kernels(request: pytest.FixtureRequest) -> Path:
    """Each build of the kernels, built (``make setup``)."""
    built = REPO / "var" / "kernels" / request.param
    if not built.exists():
        message = f"{built} is missing (make var/kernels/{request.param})"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return built


def _run(
    tmp_path: Path, kernels: Path, arrays: dict[str, np.ndarray], calls: list[list[object]]
) -> dict[str, np.ndarray]:
    for name, array in arrays.items():
        (tmp_path / f"{name}.f32").write_bytes(np.ascontiguousarray(array, dtype=np.float32).tobytes())
    job = {"arrays": {name: int(array.size) for name, array in arrays.items()}, "calls": calls}
    (tmp_path / "job.json").write_text(json.dumps(job))
    subprocess.run([*node_command(), str(HARNESS), str(kernels), str(tmp_path)], check=True, timeout=60)
    return {
        name: np.frombuffer((tmp_path / f"{name}.out.f32").read_bytes(), dtype=np.float32).reshape(array.shape)
        for name, array in arrays.items()
    }


def test_gemm_matches_numpy_forward_and_weight_gradient(tmp_path: Path, kernels: Path) -> None:
    rng = np.random.default_rng(0)
    m, k, n = 37, 29, 23  # odd sizes: the SIMD body and the scalar tail both run
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    dy = rng.standard_normal((m, n), dtype=np.float32)
    y = np.full((m, n), np.nan, np.float32)
    dw = np.full((k, n), 7.0, np.float32)
    out = _run(
        tmp_path,
        kernels,
        {"x": x, "w": w, "dy": dy, "y": y, "dw": dw},
        [
            # y = x @ w
            ["gemm_nn", [m, n, k, "x", k, 1, "w", n, "y", n, 0]],
            # dw += x.T @ dy (x read transposed through its strides)
            ["gemm_nn", [k, n, m, "x", 1, k, "dy", n, "dw", n, 1]],
        ],
    )
    np.testing.assert_allclose(out["y"], x @ w, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(out["dw"], 7.0 + x.T @ dy, rtol=1e-5, atol=1e-4)


def test_gemm_nt_matches_numpy_input_gradient(tmp_path: Path, kernels: Path) -> None:
    rng = np.random.default_rng(3)
    m, k, n = 37, 29, 23  # dot products of 23 (5 SIMD steps and a tail of 3) into 29 columns
    dy = rng.standard_normal((m, n), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    dx = np.full((m, k), np.nan, np.float32)
    # through row strides wider than the rows: dy[:, :19] @ w[:17, :19].T
    part = np.full((m, 17), np.nan, np.float32)
    out = _run(
        tmp_path,
        kernels,
        {"dy": dy, "w": w, "dx": dx, "part": part},
        [
            # dx = dy @ w.T
            ["gemm_nt", [m, k, n, "dy", n, "w", n, "dx", k]],
            ["gemm_nt", [m, 17, 19, "dy", n, "w", n, "part", 17]],
        ],
    )
    np.testing.assert_allclose(out["dx"], dy @ w.T, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(out["part"], dy[:, :19] @ w[:17, :19].T, rtol=1e-5, atol=1e-4)


def test_adam_matches_numpy(tmp_path: Path, kernels: Path) -> None:
    rng = np.random.default_rng(1)
    size = 103
    p, g = rng.standard_normal(size, dtype=np.float32), rng.standard_normal(size, dtype=np.float32)
    m, v = rng.standard_normal(size, dtype=np.float32), rng.random(size, dtype=np.float32)
    b1, b2, eps, lr, t = 0.9, 0.999, 1e-8, 1e-3, 3
    step = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
    out = _run(
        tmp_path, kernels, {"p": p, "g": g, "m": m, "v": v}, [["adam", [size, "p", "g", "m", "v", b1, b2, eps, step]]]
    )
    m_ref = b1 * m + (1 - b1) * g
    v_ref = b2 * v + (1 - b2) * g * g
    np.testing.assert_allclose(out["m"], m_ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["v"], v_ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["p"], p - step * m_ref / (np.sqrt(v_ref) + eps), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["g"], g)


def test_gemm_writes_numpy_arrays_in_pyodides_heap(kernels: Path) -> None:
    """Linked by Pyodide's loader, the kernel reads and writes NumPy arrays by address: no copies."""
    result = on_pyodide("wasm_kernels_on_heap.py", kernels)
    assert result["finite"]
    assert result["max_error"] <= 1e-4


def test_trainer_with_kernels_matches_its_numpy_path_in_pyodide(tmp_path: Path, kernels: Path) -> None:
    """The browser trainer (from the peer bundle the edge serves, kernels included) takes the same
    steps with the kernels as on its NumPy path: an MLP and a small CNN (conv by im2col), 3 Adam steps
    from one head on one set of batches; every product and every Adam update ran in the kernels; and
    operands the kernels cannot take go to NumPy."""
    bundle = PeerBundle(REPO)
    with zipfile.ZipFile(io.BytesIO(bundle.data)) as archive:
        assert archive.read(f"browser_peer/kernels/{kernels.name}") == kernels.read_bytes()
    (tmp_path / "bundle.zip").write_bytes(bundle.data)
    result = on_pyodide("wasm_kernels_trainer.py", kernels, str(tmp_path / "bundle.zip"))
    # per step: the MLP's two dense layers forward and their weight gradients (gemm_nn), the second's
    # input gradient (gemm_nt), Adam on 4 tensors; the CNN's conv and dense alike, with the conv's input
    # gradient too (a reshape comes first)
    assert result["mlp"]["calls"] == {"gemm_nn": 3 * 4, "gemm_nt": 3 * 1, "adam": 3 * 4}
    assert result["cnn"]["calls"] == {"gemm_nn": 3 * 4, "gemm_nt": 3 * 2, "adam": 3 * 4}
    for model in ("mlp", "cnn"):
        assert result[model]["backend"] == "wasm-simd"
        assert result[model]["min_update"] > 1e-4  # every tensor moved
        assert result[model]["max_update_difference"] <= 2e-6, result[model]
        assert result[model]["loss_difference"] <= 1e-5
    assert result["fallbacks"]["calls"] == {"gemm_nn": 0, "gemm_nt": 0, "adam": 0}
    assert result["fallbacks"]["max_error"] <= 1e-5
