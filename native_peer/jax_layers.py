"""The JAX side of ``protocol.layers``: every layer of a model spec as a pure function of flat parameters.

Parameters are the flat dict of a spec's names (``dense0.kernel``), the pytree ``spec_learner``
trains. Each layer computes what its NumPy twin computes (``tests/test_layer_gradients.py`` holds
forward and gradients together); JAX's autodiff gives the backward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from protocol.layers import (
    GELU,
    CausalSelfAttention,
    Conv2D,
    Dense,
    Embedding,
    Flatten,
    Layer,
    LayerNorm,
    MaxPool2D,
    ReLU,
    Reshape,
    Residual,
)
from protocol.model import ModelSpec

__all__ = ["apply", "apply_chain", "apply_layer"]

Params = Mapping[str, jax.Array]


def apply(spec: ModelSpec, params: Params, x: jax.Array) -> jax.Array:
    """The model's logits for a batch ``x`` of shape ``[n, *spec.input_shape]``."""
    return apply_chain(spec.layers, params, "", x)


def apply_chain(layers: Sequence[Layer], params: Params, prefix: str, x: jax.Array) -> jax.Array:
    for layer in layers:
        x = apply_layer(layer, params, f"{prefix}{layer.name}.", x)
    return x


def apply_layer(layer: Layer, params: Params, prefix: str, x: jax.Array) -> jax.Array:
    """``layer`` on a batch ``x``; its leaves are ``params[prefix + leaf]``."""

    def p(leaf: str) -> jax.Array:
        return params[prefix + leaf]

    match layer:
        case Dense():
            return x @ p("kernel") + p("bias")
        case Conv2D(padding=padding):
            y = lax.conv_general_dilated(
                x, p("kernel"), (1, 1), padding.upper(), dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
            return y + p("bias")
        case MaxPool2D(window=s):
            return lax.reduce_window(x, -jnp.inf, lax.max, (1, s, s, 1), (1, s, s, 1), "VALID")
        case ReLU():
            return jax.nn.relu(x)
        case GELU():
            return jax.nn.gelu(x, approximate=True)
        case Reshape() | Flatten():
            return x.reshape(x.shape[0], *layer.output_shape(x.shape[1:]))
        case LayerNorm(eps=eps):
            centered = x - x.mean(axis=-1, keepdims=True)
            rstd = lax.rsqrt((centered * centered).mean(axis=-1, keepdims=True) + eps)
            return centered * rstd * p("scale") + p("bias")
        case Embedding():
            return p("tokens")[x.astype(jnp.int32)] + p("positions")[: x.shape[1]]
        case CausalSelfAttention(heads=heads):
            n, length, width = x.shape
            qkv = (x @ p("qkv.kernel") + p("qkv.bias")).reshape(n, length, 3, heads, width // heads)
            q, k, v = qkv.transpose(2, 0, 3, 1, 4)  # each [n, heads, T, width / heads]
            scores = (q @ k.transpose(0, 1, 3, 2)) * np.float32(1.0 / np.sqrt(width // heads))
            scores = jnp.where(jnp.tri(length, dtype=bool), scores, -jnp.inf)
            merged = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(n, length, width)
            return merged @ p("out.kernel") + p("out.bias")
        case Residual(layers=layers):
            return x + apply_chain(layers, params, prefix, x)
    raise TypeError(f"no JAX implementation of layer type {layer.kind!r}")
