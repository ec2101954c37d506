# Run inside Pyodide by tests/wasm_kernels_pyodide.mjs with the peer bundle: the browser trainer's steps
# with the kernels against the NumPy path, from the same head on the same batches.
import json

import numpy as np

from browser_peer.kernels import Kernels
from browser_peer.numpy_trainer import NUMPY, Adam, fastest_backend, train_epoch
from protocol.layers import Conv2D, Dense, Flatten, MaxPool2D, ReLU, Reshape
from protocol.model import ModelSpec, init_params, mlp


class Counted:
    """The linked exports, each call counted (to tell the kernels ran, not a fallback)."""

    def __init__(self, exports):
        self.calls = {"gemm_nn": 0, "gemm_nt": 0, "adam": 0}
        self._exports = exports

    def __getattr__(self, name):
        function = getattr(self._exports, name)

        def call(*args):
            self.calls[name] += 1
            return function(*args)

        return call


def compare(spec, steps, seed):
    rng = np.random.default_rng(seed)
    head = init_params(spec, seed)
    xb = rng.random((steps, 32, *spec.input_shape), dtype=np.float32)
    yb = rng.integers(0, spec.classes, (steps, 32)).astype(np.int32)
    counted = Counted(kernels)  # noqa: F821
    backend = fastest_backend(Kernels(counted))
    with_kernels, loss_kernels = train_epoch(spec, dict(head), Adam(1e-3), xb, yb, backend)
    with_numpy, loss_numpy = train_epoch(spec, dict(head), Adam(1e-3), xb, yb, NUMPY)
    differences = {
        name: float(np.abs((with_kernels[name] - head[name]) - (with_numpy[name] - head[name])).max()) for name in head
    }
    changed = min(float(np.abs(with_kernels[name] - head[name]).max()) for name in head)
    return {
        "backend": backend.name,
        "calls": counted.calls,
        "max_update_difference": max(differences.values()),
        "min_update": changed,
        "loss_difference": abs(loss_kernels - loss_numpy),
    }


def fallbacks():
    """Operands the kernels cannot take as they lie go to NumPy: float64, no contiguous axis."""
    counted = Counted(kernels)  # noqa: F821
    matmul = Kernels(counted).matmul
    rng = np.random.default_rng(5)
    a64 = rng.standard_normal((5, 7))
    b = rng.standard_normal((7, 3), dtype=np.float32)
    strided = rng.standard_normal((14, 6), dtype=np.float32)[::2, ::2]  # no axis of unit stride
    errors = [
        float(np.abs(matmul(a64, b) - a64 @ b).max()),
        float(np.abs(matmul(b.T, strided) - b.T @ strided).max()),
    ]
    return {"calls": counted.calls, "max_error": max(errors)}


mnist_mlp = mlp("mnist-mlp", [784, 128, 10])
cnn = ModelSpec(
    "small-cnn",
    (144,),
    (
        Reshape("image", (12, 12, 1)),
        Conv2D("conv0", 6, 3),
        ReLU("relu0"),
        MaxPool2D("pool0"),
        Flatten("flat"),
        Dense("dense0", 10),
    ),
)
json.dumps({"mlp": compare(mnist_mlp, 3, 0), "cnn": compare(cnn, 3, 1), "fallbacks": fallbacks()})
