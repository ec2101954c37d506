"""The user's side of a native trainer: a JAX model, an optax optimizer, and batch loaders.

``JaxLearner`` holds what the user brings: ``init`` / ``apply`` for the model, how its parameter
pytree maps to the network's flat tensor names (the model spec), and ``make_optimizer`` which
builds the user's optax transformation (schedule included) for an experiment's hyperparameters.
``spec_learner`` is that learner for any ``ModelSpec`` (layers from ``jax_layers``);
``native_peer.workloads`` builds it from the user's own JAX code (a workload), names and all.
``TrainEngine`` compiles one local epoch (``lax.scan`` over batches); ``Evaluator`` compiles evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from protocol.batches import make_batches
from protocol.evidence import lease_evidence_z
from protocol.manifests import ExperimentSpec
from protocol.model import Model, ModelSpec, evaluation_metrics, init_params

from . import jax_layers

__all__ = [
    "BatchLoader",
    "Evaluator",
    "JaxLearner",
    "TrainEngine",
    "adam",
    "at_learning_rate",
    "softmax_cross_entropy",
    "spec_learner",
]

PyTree = Any


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy over every predicted position (``[n, C]`` or ``[n, T, V]`` logits)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@dataclass(frozen=True)
class JaxLearner:
    model: Model  # a ModelSpec (``spec_learner``) or a workload's (``native_peer.workloads``)
    init: Callable[[jax.Array], PyTree]
    apply: Callable[[PyTree, jax.Array], jax.Array]
    to_tensors: Callable[[PyTree], dict[str, np.ndarray]]
    from_tensors: Callable[[Mapping[str, np.ndarray]], PyTree]
    make_optimizer: Callable[[ExperimentSpec], optax.GradientTransformation]
    loss: Callable[[jax.Array, jax.Array], jax.Array] = softmax_cross_entropy


def adam(spec: ExperimentSpec) -> optax.GradientTransformation:
    """Adam at the experiment's learning rate (the default optimizer); its learning rate lives in the
    optimizer state, so ``at_learning_rate`` can follow the experiment's schedule window by window."""
    return optax.inject_hyperparams(optax.adam)(learning_rate=spec.learning_rate)


def at_learning_rate(opt_state: PyTree, learning_rate: float) -> PyTree:
    """``opt_state`` with its learning rate set, where the optimizer keeps it in its state
    (``optax.inject_hyperparams``, as ``adam`` does); any other optimizer's state as it is (a user's
    own optax chain follows its own schedule)."""
    hyperparams = getattr(opt_state, "hyperparams", None)
    if not isinstance(hyperparams, dict) or "learning_rate" not in hyperparams:
        return opt_state
    return opt_state._replace(hyperparams={**hyperparams, "learning_rate": jnp.asarray(learning_rate, jnp.float32)})


def spec_learner(
    model: ModelSpec, make_optimizer: Callable[[ExperimentSpec], optax.GradientTransformation] = adam
) -> JaxLearner:
    """The learner of ``model``: parameters as the flat dict of its names, ``protocol.model.init_params``
    for init (seeded from the key, so native and browser peers draw the same way), ``jax_layers`` to apply."""

    def init(rng: jax.Array) -> dict[str, jax.Array]:
        return from_tensors(init_params(model, int(jax.random.randint(rng, (), 0, 2**31 - 1))))

    def apply(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        return jax_layers.apply(model, params, x)

    def to_tensors(params: Mapping[str, jax.Array]) -> dict[str, np.ndarray]:
        return {name: np.asarray(params[name], np.float32) for name in model.shapes}

    def from_tensors(tensors: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        model.check(tensors)
        return {name: jnp.asarray(value) for name, value in tensors.items()}

    return JaxLearner(model, init, apply, to_tensors, from_tensors, make_optimizer)


@dataclass(frozen=True)
class BatchLoader:
    """Turns the examples of a lease into shuffled, equal-sized batches (``protocol.batches``). A
    trainer's examples arrive as stored, uint8 features and labels (``TrainEngine`` scales them)."""

    batch_size: int

    def batches(self, x: np.ndarray, y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
        return make_batches(x, y, self.batch_size, seed)


SCAN_LENGTHS = (32, 8, 1)  # the compiled runs of optimizer steps an epoch is made of, longest first


def scan_lengths(steps: int) -> list[int]:
    """``steps`` as runs of ``SCAN_LENGTHS``, as many of the longest as fit, then of the next: three
    lengths are ever compiled, whatever the step counts."""
    runs: list[int] = []
    for length in SCAN_LENGTHS:
        runs += [length] * (steps // length)
        steps %= length
    return runs


class TrainEngine:
    """Compiled training and evaluation for one learner and one optimizer.

    Batches of integer features (a shard's uint8, as stored) are read inside the compiled step as
    float32 times ``feature_scale`` (``protocol.shards.feature_scale`` of the dataset), integer labels
    as int32; float features are trained on as given."""

    def __init__(
        self, learner: JaxLearner, optimizer: optax.GradientTransformation, *, feature_scale: float = 1.0
    ) -> None:
        self.learner = learner
        self.optimizer = optimizer
        scale = np.float32(feature_scale)

        def loss_fn(params: PyTree, x: jax.Array, y: jax.Array) -> jax.Array:
            if jnp.issubdtype(x.dtype, jnp.integer):
                x = x.astype(jnp.float32) * scale
            return learner.loss(learner.apply(params, x), y.astype(jnp.int32))

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
        self.warmed = False  # whether ``warm`` ran
        self.evaluate = Evaluator(learner)

    def init_optimizer(self, params: PyTree) -> PyTree:
        return self.optimizer.init(params)

    def warm(self, params: PyTree, batch_size: int, learning_rate: float) -> None:
        """Compile the epoch for each of ``SCAN_LENGTHS`` on zero batches of ``batch_size`` examples as
        shards store them (uint8 features and labels), from ``params`` and a fresh optimizer state at
        ``learning_rate``; once per engine, and nothing of it is kept. A trainer calls it before it
        holds a lease, so that its first window trains instead of compiling (the compiled programs
        are what ``native_peer.compile_cache`` keeps across processes)."""
        if self.warmed:
            return
        model = self.learner.model
        labels = tuple(model.input_shape) if model.objective == "next-token" else ()
        state = at_learning_rate(self.init_optimizer(params), learning_rate)
        for length in SCAN_LENGTHS:
            xb = jnp.zeros((length, batch_size, *model.input_shape), jnp.uint8)
            jax.block_until_ready(self._epoch(params, state, xb, jnp.zeros((length, batch_size, *labels), jnp.uint8)))
        self.warmed = True

    def train_epoch(
        self, params: PyTree, opt_state: PyTree, xb: np.ndarray, yb: np.ndarray
    ) -> tuple[PyTree, PyTree, float]:
        """One optimizer step per batch of ``xb``, ``yb`` ([steps, batch, ...]); the mean loss. The steps
        run in compiled runs of ``scan_lengths(steps)``: a scan's length is part of what is compiled, and
        leases of many sizes (``protocol.lease_size``) must not each cost a compilation, which stalls
        the trainer's core."""
        total, start = 0.0, 0
        for length in scan_lengths(len(xb)):
            part = slice(start, start + length)
            params, opt_state, loss = self._epoch(params, opt_state, jnp.asarray(xb[part]), jnp.asarray(yb[part]))
            total += float(loss) * length
            start += length
        return params, opt_state, total / max(len(xb), 1)

    def fresh_window(
        self, tensors: Mapping[str, np.ndarray], xb: np.ndarray, yb: np.ndarray, learning_rate: float | None = None
    ) -> dict[str, np.ndarray]:
        """``tensors`` trained on batches ``xb``, ``yb`` from a fresh optimizer state (at ``learning_rate``
        when given, else the optimizer's own): a validator's own update of one window."""
        params = self.learner.from_tensors(tensors)
        opt_state = self.init_optimizer(params)
        if learning_rate is not None:
            opt_state = at_learning_rate(opt_state, learning_rate)
        params, _, _ = self.train_epoch(params, opt_state, xb, yb)
        return self.learner.to_tensors(params)


DEVICE_SPLITS = 4  # evaluation splits an Evaluator keeps on the device


class Evaluator:
    """Compiled ``protocol.model.evaluation_metrics`` of a learner's model over (x, y), in chunks of
    about ``chunk`` predicted positions."""

    def __init__(self, learner: JaxLearner, *, chunk: int = 5000) -> None:
        self.model = learner.model
        positions = math.prod(learner.model.input_shape) if learner.model.objective == "next-token" else 1
        self.chunk = max(1, chunk // positions)

        @jax.jit
        def batch_metrics(params: PyTree, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
            logits = learner.apply(params, x)
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
            return losses.sum(), (losses**2).sum(), (logits.argmax(axis=-1) == y).sum()

        @jax.jit
        def batch_losses(params: PyTree, x: jax.Array, y: jax.Array) -> jax.Array:
            losses = optax.softmax_cross_entropy_with_integer_labels(learner.apply(params, x), y)
            return losses.reshape(losses.shape[0], -1).mean(axis=1)

        self._batch_metrics = batch_metrics
        self._batch_losses = batch_losses
        # (id(x), id(y)) -> the arrays themselves (so that their ids stay theirs) and their device chunks
        self._device: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, list[tuple[jax.Array, jax.Array]]]] = {}

    def __call__(self, params: PyTree, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        total_loss, squared_loss, correct = 0.0, 0.0, 0
        for xc, yc in self._chunks(x, y):
            loss, squared, hits = self._batch_metrics(params, xc, yc)
            total_loss += float(loss)
            squared_loss += float(squared)
            correct += int(hits)
        return evaluation_metrics(self.model, total_loss, correct, int(np.size(y)), squared_loss)

    def losses(self, params: PyTree, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Each example's loss (a sequence's: the mean over its positions), float64, compiled in chunks:
        what ``lease_evidence`` compares."""
        parts = [
            np.asarray(self._batch_losses(params, x[start : start + self.chunk], y[start : start + self.chunk]))
            for start in range(0, len(x), self.chunk)
        ]  # not kept on the device: each candidate's lease examples are its own
        return np.concatenate(parts).astype(np.float64) if parts else np.zeros(0)

    def lease_evidence(
        self,
        before: PyTree,
        after: PyTree,
        lease: tuple[np.ndarray, np.ndarray],
        control: tuple[np.ndarray, np.ndarray],
    ) -> float:
        """``protocol.evidence.lease_evidence_z`` of parameters ``after`` trained from ``before``: each
        example's loss gain (before − after) on the ``lease`` examples against that on the ``control``
        examples (``native_peer.evidence.LeaseEvidence`` measures validators' in stages)."""
        lease_gains = self.losses(before, *lease) - self.losses(after, *lease)
        return lease_evidence_z(lease_gains, self.losses(before, *control) - self.losses(after, *control))

    def _chunks(self, x: np.ndarray, y: np.ndarray) -> list[tuple[jax.Array, jax.Array]]:
        """(x, y) in device chunks, copied once per array pair: a validator evaluates the same splits
        several times a window, and the copy cost more than the evaluation."""
        cached = self._device.get((id(x), id(y)))
        if cached is None or cached[0] is not x or cached[1] is not y:
            chunks = [
                (jnp.asarray(x[start : start + self.chunk]), jnp.asarray(y[start : start + self.chunk]))
                for start in range(0, len(x), self.chunk)
            ]
            cached = (x, y, chunks)
            self._device = {**dict(list(self._device.items())[-(DEVICE_SPLITS - 1) :]), (id(x), id(y)): cached}
        return cached[2]
