# Run inside Pyodide by tests/wasm_kernels_pyodide.mjs: the kernels write into NumPy arrays in place.
import json

import numpy as np

rng = np.random.default_rng(2)
x = rng.standard_normal((33, 45), dtype=np.float32)
w = rng.standard_normal((45, 19), dtype=np.float32)
y = np.full((33, 19), np.nan, np.float32)


def address(array):
    return array.__array_interface__["data"][0]


kernels.gemm_nn(33, 19, 45, address(x), 45, 1, address(w), 19, address(y), 19, 0)  # noqa: F821
json.dumps({"max_error": float(np.abs(y - x @ w).max()), "finite": bool(np.isfinite(y).all())})
