"""A small CNN as a Flax NNX module, trained with Adam: a workload of one's own on MNIST."""

import jax
import optax
from flax import nnx

from native_peer.workloads import workload


class CNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.conv = nnx.Conv(1, 8, kernel_size=(5, 5), rngs=rngs)
        self.out = nnx.Linear(14 * 14 * 8, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # a batch [n, 784] -> logits [n, 10]
        h = nnx.max_pool(nnx.relu(self.conv(x.reshape(-1, 28, 28, 1))), (2, 2), strides=(2, 2))
        return self.out(h.reshape(h.shape[0], -1))


learner = workload(lambda key: CNN(nnx.Rngs(key)), input_shape=(784,), optimizer=optax.adam(1e-3))
