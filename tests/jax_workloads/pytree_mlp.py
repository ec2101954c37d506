"""784 -> 32 ReLU -> 10 as a plain pytree (a dict holding a dict and a list), trained with AdamW on a
warmup-cosine schedule: the user's side of a workload in full."""

import jax
import jax.numpy as jnp
import optax

from native_peer.workloads import workload


def init(key: jax.Array) -> dict[str, object]:
    k1, k2 = jax.random.split(key)
    return {
        "hidden": {"w": jax.random.normal(k1, (784, 32)) * (2 / 784) ** 0.5, "b": jnp.zeros(32)},
        "out": [jax.random.normal(k2, (32, 10)) * (2 / 32) ** 0.5, jnp.zeros(10)],
    }


def apply(params: dict, x: jax.Array) -> jax.Array:  # type: ignore[type-arg]
    hidden = jax.nn.relu(x @ params["hidden"]["w"] + params["hidden"]["b"])
    weight, bias = params["out"]
    return hidden @ weight + bias


schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, warmup_steps=10, decay_steps=2000, end_value=3e-4)
learner = workload(init, apply, input_shape=(784,), optimizer=optax.adamw(schedule, weight_decay=1e-4))
