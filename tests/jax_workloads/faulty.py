"""Workloads with the faults ``dtn workload check`` finds (``tests/test_workload_check.py``): a tiny
4 -> 3 linear classifier whose apply draws from the host's RNG as it is traced (each compilation
trains another model), one whose logits are not finite, and attributes that are not workloads."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from native_peer.workloads import workload


def init(key):
    return {"w": jax.random.normal(key, (4, 3)) * 0.5, "b": jnp.zeros(3)}


def noisy_apply(params, x):  # a host draw at trace time: a constant of each compilation, not of the model
    return (x @ params["w"] + params["b"]) * (1.0 + np.random.default_rng().random())


def nan_apply(params, x):
    return jnp.log(x @ params["w"] + params["b"] - 1e6)  # the log of a negative number: NaN logits


host_noise = workload(init, noisy_apply, input_shape=(4,), optimizer=optax.sgd(0.1))
nan_logits = workload(init, nan_apply, input_shape=(4,), optimizer=optax.sgd(0.1))


def not_a_workload():
    return 3


def broken_factory():
    raise RuntimeError("the factory's own bug")
