"""The NumPy (browser) and JAX (native) twins of a model spec agree: the tolerances, and the comparison.

Validators judge a browser's update against their own JAX one, so a spec model's two twins must agree
from the same parameters and batch. Float32 sums run in another order in XLA than in NumPy, hence:
logits to ``LOGITS``, the loss to ``LOSS``, every gradient to ``GRADIENTS``. (Optimizer steps are not
compared element by element on random data: Adam's first step is about ``learning_rate`` times the
gradient's sign, so a gradient near zero that rounds to the other sign moves by twice the rate;
``tests/test_parity.py`` bounds them on MNIST.) ``tests/test_layer_gradients.py`` holds the built-in
models and a declared one to these tolerances, ``dtn workload check`` any spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import jax
import numpy as np

from browser_peer.numpy_trainer import Matmul, gradients
from native_peer.learner import JaxLearner
from protocol.model import ModelSpec, forward

__all__ = ["GRADIENTS", "LOGITS", "LOSS", "Tolerance", "spec_differences"]


@dataclass(frozen=True)
class Tolerance:
    """``|numpy - jax| <= atol + rtol * |jax|`` elementwise (``numpy.allclose``'s rule)."""

    atol: float
    rtol: float = 0.0

    def difference(self, what: str, numpy: object, jax_value: object) -> str | None:
        """``None`` when ``numpy`` and ``jax_value`` agree; else one line naming ``what`` and the worst element."""
        ours, theirs = np.asarray(numpy, np.float64), np.asarray(jax_value, np.float64)
        if ours.shape != theirs.shape:
            return f"{what}: shape {list(ours.shape)} in NumPy, {list(theirs.shape)} in JAX"
        excess = np.abs(ours - theirs) - (self.atol + self.rtol * np.abs(theirs))
        if not np.isnan(excess).any() and (excess <= 0).all():
            return None
        worst = np.unravel_index(int(np.nanargmax(np.where(np.isnan(excess), np.inf, excess))), excess.shape)
        return (
            f"{what}: NumPy {ours[worst]:.7g}, JAX {theirs[worst]:.7g} at {list(map(int, worst))}, "
            f"beyond {self.atol:g} + {self.rtol:g}·|JAX|"
        )


LOGITS = Tolerance(1e-5, 1e-4)
LOSS = Tolerance(1e-5)
GRADIENTS = Tolerance(1e-6, 1e-3)


def spec_differences(
    learner: JaxLearner,
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    matmul: Matmul = np.matmul,
) -> list[str]:
    """Where the browser's NumPy twin of ``learner``'s spec and the JAX learner differ beyond the
    tolerances, from ``params`` on the batch ``x`` (float32 features), ``y``: logits, loss and gradients."""
    spec = learner.model
    assert isinstance(spec, ModelSpec), spec  # the browser trains spec models only
    found = [
        LOGITS.difference("logits", forward(spec, params, x, matmul), learner.apply(learner.from_tensors(params), x))
    ]
    loss, grads = gradients(spec, params, x, y, matmul)
    jax_loss, jax_grads = jax.value_and_grad(lambda p: learner.loss(learner.apply(p, x), y))(
        learner.from_tensors(params)
    )
    found.append(LOSS.difference("loss", loss, jax_loss))
    found += [
        GRADIENTS.difference(f"gradient of {name}", grads[name], value)
        for name, value in learner.to_tensors(jax_grads).items()
    ]
    return [difference for difference in found if difference is not None]
