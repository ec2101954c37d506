"""The user's side of a native trainer: a JAX model, an optax optimizer, and batch loaders.

``JaxLearner`` holds what the user brings: ``init`` / ``apply`` for the model, how its parameter
pytree maps to the network's flat tensor names (the model spec), and ``make_optimizer`` which
builds the user's optax transformation (schedule included) for an experiment's hyperparameters.
``TrainEngine`` compiles one local epoch (``lax.scan`` over batches); ``Evaluator`` compiles evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from protocol.batches import make_batches
from protocol.manifests import ExperimentSpec
from protocol.model import ModelSpec

__all__ = ["BatchLoader", "Evaluator", "JaxLearner", "TrainEngine", "softmax_cross_entropy"]

PyTree = Any


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@dataclass(frozen=True)
class JaxLearner:
    model: ModelSpec
    init: Callable[[jax.Array], PyTree]
    apply: Callable[[PyTree, jax.Array], jax.Array]
    to_tensors: Callable[[PyTree], dict[str, np.ndarray]]
    from_tensors: Callable[[Mapping[str, np.ndarray]], PyTree]
    make_optimizer: Callable[[ExperimentSpec], optax.GradientTransformation]
    loss: Callable[[jax.Array, jax.Array], jax.Array] = softmax_cross_entropy


@dataclass(frozen=True)
class BatchLoader:
    """Turns the examples of a lease into shuffled, equal-sized batches (``protocol.batches``)."""

    batch_size: int

    def batches(self, x: np.ndarray, y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
        return make_batches(x, y, self.batch_size, seed)


class TrainEngine:
    """Compiled training and evaluation for one learner and one optimizer."""

    def __init__(self, learner: JaxLearner, optimizer: optax.GradientTransformation) -> None:
        self.learner = learner
        self.optimizer = optimizer

        def loss_fn(params: PyTree, x: jax.Array, y: jax.Array) -> jax.Array:
            return learner.loss(learner.apply(params, x), y)

        def step(carry: tuple[PyTree, PyTree], batch: tuple[jax.Array, jax.Array]) -> tuple[Any, jax.Array]:
            params, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        @jax.jit
        def epoch(params: PyTree, opt_state: PyTree, xb: jax.Array, yb: jax.Array) -> tuple[PyTree, PyTree, jax.Array]:
            (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), (xb, yb))
            return params, opt_state, losses.mean()

        self._epoch = epoch
        self.evaluate = Evaluator(learner)

    def init_optimizer(self, params: PyTree) -> PyTree:
        return self.optimizer.init(params)

    def train_epoch(
        self, params: PyTree, opt_state: PyTree, xb: np.ndarray, yb: np.ndarray
    ) -> tuple[PyTree, PyTree, float]:
        params, opt_state, loss = self._epoch(params, opt_state, jnp.asarray(xb), jnp.asarray(yb))
        return params, opt_state, float(loss)


class Evaluator:
    """Compiled mean loss and accuracy of a learner's model over (x, y), in chunks."""

    def __init__(self, learner: JaxLearner, *, chunk: int = 5000) -> None:
        self.chunk = chunk

        @jax.jit
        def batch_metrics(params: PyTree, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
            logits = learner.apply(params, x)
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
            return losses.sum(), (logits.argmax(axis=1) == y).sum()

        self._batch_metrics = batch_metrics

    def __call__(self, params: PyTree, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        total_loss, correct = 0.0, 0
        for start in range(0, len(x), self.chunk):
            end = start + self.chunk
            loss, hits = self._batch_metrics(params, jnp.asarray(x[start:end]), jnp.asarray(y[start:end]))
            total_loss += float(loss)
            correct += int(hits)
        n = max(len(x), 1)
        return {"loss": total_loss / n, "accuracy": correct / n}
