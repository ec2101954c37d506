"""784 -> 32 ReLU -> 10 as a Flax NNX module, with SGD and momentum."""

import jax
import optax
from flax import nnx

from native_peer.workloads import workload


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(784, 32, rngs=rngs)
        self.out = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(nnx.relu(self.hidden(x)))


learner = workload(lambda key: MLP(nnx.Rngs(key)), input_shape=(784,), optimizer=optax.sgd(0.05, momentum=0.9))
