"""784 -> 64 ReLU -> 10 as an Equinox module, trained with AdamW: a workload of one's own on MNIST."""

import equinox as eqx
import jax
import optax

from native_peer.workloads import workload


class MLP(eqx.Module):
    hidden: eqx.nn.Linear
    out: eqx.nn.Linear

    def __init__(self, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.hidden, self.out = eqx.nn.Linear(784, 64, key=k1), eqx.nn.Linear(64, 10, key=k2)

    def __call__(self, x: jax.Array) -> jax.Array:  # a batch: Equinox layers take one example
        return jax.vmap(lambda row: self.out(jax.nn.relu(self.hidden(row))))(x)


learner = workload(MLP, input_shape=(784,), optimizer=optax.adamw(1e-3))
