"""The MNIST MLP as a ``JaxLearner`` (784 → 128 ReLU → 10), with Adam and an optional schedule, and the
release / workload a trainer of it declares (``RELEASE``, ``WORKLOAD``)."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from protocol.ids import DatasetId
from protocol.manifests import ExperimentSpec, ReleaseManifest, SupportedWorkload
from protocol.model import MODELS

from .learner import JaxLearner

__all__ = ["RELEASE", "WORKLOAD", "mlp_learner"]

SPEC = MODELS["mnist-mlp"]
RELEASE = ReleaseManifest("dtn-0.1.0")
WORKLOAD = SupportedWorkload("mnist-mlp-cpu", "mnist-mlp", DatasetId("mnist"))


def _init(rng: jax.Array) -> dict[str, dict[str, jax.Array]]:
    params = {}
    keys = jax.random.split(rng, SPEC.num_layers)
    for i, (fan_in, fan_out) in enumerate(zip(SPEC.layer_sizes, SPEC.layer_sizes[1:], strict=False)):
        params[f"dense{i}"] = {
            "kernel": jax.random.normal(keys[i], (fan_in, fan_out), jnp.float32) * jnp.sqrt(2.0 / fan_in),
            "bias": jnp.zeros((fan_out,), jnp.float32),
        }
    return params


def _apply(params: dict[str, dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    h = x
    for i in range(SPEC.num_layers):
        h = h @ params[f"dense{i}"]["kernel"] + params[f"dense{i}"]["bias"]
        if i < SPEC.num_layers - 1:
            h = jax.nn.relu(h)
    return h


def _to_tensors(params: dict[str, dict[str, jax.Array]]) -> dict[str, np.ndarray]:
    return {
        f"{layer}.{name}": np.asarray(value, np.float32)
        for layer, leaves in params.items()
        for name, value in leaves.items()
    }


def _from_tensors(tensors: Mapping[str, np.ndarray]) -> dict[str, dict[str, jax.Array]]:
    SPEC.check(tensors)
    params: dict[str, dict[str, jax.Array]] = {}
    for name, value in tensors.items():
        layer, leaf = name.split(".")
        params.setdefault(layer, {})[leaf] = jnp.asarray(value)
    return params


def adam(spec: ExperimentSpec) -> optax.GradientTransformation:
    """Adam at the experiment's learning rate (the default optimizer)."""
    return optax.adam(spec.learning_rate)


def mlp_learner(make_optimizer=adam) -> JaxLearner:  # type: ignore[no-untyped-def]
    """The MNIST MLP learner; pass ``make_optimizer`` to bring your own optax chain or schedule."""
    return JaxLearner(SPEC, _init, _apply, _to_tensors, _from_tensors, make_optimizer)
