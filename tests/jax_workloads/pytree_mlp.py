"""784 -> 32 ReLU -> 10 as a plain pytree (a dict holding a dict and a list), trained with AdamW on a
warmup-cosine schedule: the user's side of a workload, as docs/workloads-of-your-own.md shows it."""

import jax
import jax.numpy as jnp
import optax

from native_peer.workloads import workload


def init(key):
    k1, k2 = jax.random.split(key)
    return {
        "hidden": {"w": jax.random.normal(k1, (784, 32)) * 0.05, "b": jnp.zeros(32)},
        "out": [jax.random.normal(k2, (32, 10)) * 0.25, jnp.zeros(10)],
    }


def apply(params, x):  # a batch [n, 784] -> logits [n, 10]
    h = jax.nn.relu(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return h @ params["out"][0] + params["out"][1]


schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, 10, 2000, 3e-4)
learner = workload(init, apply, input_shape=(784,), optimizer=optax.adamw(schedule))
