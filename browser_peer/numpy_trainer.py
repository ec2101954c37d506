"""The browser's trainer: any model spec's forward, backward and Adam in plain NumPy (no I/O).

A ``Backend`` names what multiplies the matrices and applies Adam: the WebAssembly SIMD kernels
where the page linked them (``browser_peer.kernels``), else SciPy's BLAS, else NumPy.

Numerically it mirrors the native JAX trainer (``optax.adam`` defaults: b1=0.9, b2=0.999,
eps=1e-8, bias-corrected; mean softmax cross-entropy); ``tests/test_parity.py`` holds them to a
stated tolerance from the same head, batch and step. Everything is float32, like the artifacts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from protocol.layers import F32, Matmul, backward_chain, forward_chain
from protocol.model import ModelSpec, Params, softmax_cross_entropy

from .kernels import Kernels

__all__ = ["Adam", "AdamUpdate", "Backend", "Matmul", "fastest_backend", "fastest_matmul", "gradients", "train_epoch"]

# (param, grad, mu, nu, b1, b2, eps, step) -> the new param (mu, nu moved in place), or None where it
# does not apply and NumPy's update runs instead (see ``Kernels.adam``)
AdamUpdate = Callable[[F32, F32, F32, F32, float, float, float, float], F32 | None]


@dataclass(frozen=True)
class Backend:
    """What the trainer multiplies matrices with and how it applies Adam; ``name`` is shown on the page."""

    name: str
    matmul: Matmul = np.matmul
    adam: AdamUpdate | None = None  # a fused update, or None: NumPy's


NUMPY = Backend("numpy")


def fastest_backend(kernels: Kernels | None = None) -> Backend:
    """The linked WebAssembly SIMD kernels when given, else ``fastest_matmul``'s product with NumPy's Adam."""
    if kernels is not None:
        return Backend("wasm-simd", kernels.matmul, kernels.adam)
    matmul, name = fastest_matmul()
    return Backend(name, matmul)


def fastest_matmul() -> tuple[Matmul, str]:
    """BLAS ``sgemm`` from SciPy when it is importable, else NumPy's ``matmul``.

    Pyodide's NumPy is built without BLAS; its SciPy ships a wasm OpenBLAS that multiplies the
    MLP's matrices faster (docs/results/2026-12-benchmarks.md#browser-trainer). Transposed views
    make both operands Fortran-ordered, so ``sgemm`` copies nothing: ``A @ B == (Bᵀ Aᵀ)ᵀ``.
    """
    try:
        from scipy.linalg.blas import sgemm
    except ImportError:
        return np.matmul, "numpy"

    def matmul(a: F32, b: F32) -> F32:
        return sgemm(1.0, b.T, a.T).T  # type: ignore[no-any-return]

    return matmul, "blas"


def gradients(
    spec: ModelSpec, params: Mapping[str, F32], x: F32, y: npt.NDArray[np.integer], matmul: Matmul = np.matmul
) -> tuple[float, Params]:
    """Mean softmax cross-entropy of a batch (over every predicted position) and its gradient for
    every parameter: the spec's layers forward, then backward."""
    logits, tape = forward_chain(spec.layers, params, np.asarray(x, np.float32), matmul)
    losses, delta = softmax_cross_entropy(logits, y)
    delta[np.arange(len(delta)), np.asarray(y).reshape(-1)] -= 1.0
    delta /= np.float32(len(delta))
    _, grads = backward_chain(spec.layers, tape, delta.reshape(logits.shape), matmul, input_grad=False)
    return float(losses.mean()), grads


@dataclass
class Adam:
    """Adam with bias correction, state kept per parameter name (it stays in the browser)."""

    learning_rate: float
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    count: int = 0
    mu: Params = field(default_factory=dict)
    nu: Params = field(default_factory=dict)

    def step(self, params: Params, grads: Mapping[str, F32], fused: AdamUpdate | None = None) -> Params:
        """New parameters after one Adam step (``params`` are not modified; moments update in place,
        with few temporaries: allocation dominates elementwise work in WebAssembly). ``fused`` applies
        the step to a parameter where it can (the kernels), NumPy to the rest."""
        self.count += 1
        c1 = 1.0 - self.b1**self.count
        c2 = 1.0 - self.b2**self.count
        # lr · (mu / c1) / (sqrt(nu / c2) + eps) == scale · mu / (sqrt(nu) + eps · sqrt(c2))
        scale = np.float32(self.learning_rate * np.sqrt(c2) / c1)
        eps = np.float32(self.eps * np.sqrt(c2))
        updated: Params = {}
        for name, grad in grads.items():
            mu = self.mu.setdefault(name, np.zeros_like(grad))
            nu = self.nu.setdefault(name, np.zeros_like(grad))
            if fused is not None:
                new = fused(params[name], grad, mu, nu, self.b1, self.b2, float(eps), float(scale))
                if new is not None:
                    updated[name] = new
                    continue
            mu *= np.float32(self.b1)
            mu += np.float32(1.0 - self.b1) * grad
            work = grad * grad
            work *= np.float32(1.0 - self.b2)
            nu *= np.float32(self.b2)
            nu += work
            np.sqrt(nu, out=work)
            work += eps
            np.divide(mu, work, out=work)
            work *= scale
            updated[name] = params[name] - work
        return updated


def train_epoch(
    spec: ModelSpec,
    params: Params,
    optimizer: Adam,
    xb: F32,
    yb: npt.NDArray[np.integer],
    backend: Backend = NUMPY,
) -> tuple[Params, float]:
    """One pass over pre-batched data ``xb [n, batch, features]``; returns params and mean loss."""
    losses = []
    for x, y in zip(xb, yb, strict=True):
        loss, grads = gradients(spec, params, x, y, backend.matmul)
        params = optimizer.step(params, grads, backend.adam)
        losses.append(loss)
    return params, float(np.mean(losses))
