"""Layers of the shared model spec: shapes, init, wire form, and the NumPy forward / backward.

A layer is a frozen dataclass with a name unique among its siblings; its parameters are named
``<layer name>.<leaf>`` (a ``Residual``'s sub-layers nest: ``block0.attn.qkv.kernel``). Shapes
are per example (no batch axis); arrays carry a leading batch axis. ``forward`` returns the
output and what ``backward`` needs; ``backward`` returns the input gradient (``None`` unless
``input_grad``) and the gradient of every leaf. Everything is float32. Matrix products go through
the ``matmul`` passed in (BLAS ``sgemm`` in the browser); the small batched products of attention
go through NumPy. ``native_peer.jax_layers`` is the JAX side of every layer; the gradient tests
hold the two together.

    Dense  Conv2D  MaxPool2D  ReLU  GELU  Reshape  Flatten  LayerNorm  Embedding
    CausalSelfAttention  Residual (sub-layers whose output is added to their input; no nesting)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from .errors import InvalidMessage
from .fields import read_float, read_int, read_list, read_object, read_str

__all__ = [
    "F32",
    "GELU",
    "LAYER_TYPES",
    "MAX_ACTIVATION",
    "CausalSelfAttention",
    "Conv2D",
    "Dense",
    "Embedding",
    "Flatten",
    "Layer",
    "LayerNorm",
    "Matmul",
    "MaxPool2D",
    "Params",
    "ReLU",
    "Reshape",
    "Residual",
    "Shape",
    "activation_shapes",
    "backward_chain",
    "chain_param_shapes",
    "check_chain",
    "forward_chain",
    "init_chain",
    "layer_from_wire",
    "read_layers",
]

F32 = npt.NDArray[np.float32]
Params = dict[str, F32]
Shape = tuple[int, ...]
Matmul = Callable[[F32, F32], F32]
Cache = Any  # what a layer's forward keeps for its backward

MAX_DIM = 65536  # any size a layer names (units, filters, vocabulary, context, ...)
MAX_RANK = 4  # dimensions of a per-example shape
MAX_LAYERS = 64  # layers in one chain (the model's, or a residual block's)
MAX_ACTIVATION = 2**24  # elements one example may hold in any layer (output, im2col rows, attention scores)
_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
_GELU_C = np.float32(np.sqrt(2.0 / np.pi))
_GELU_A = np.float32(0.044715)


def _normal(rng: np.random.Generator, shape: Shape, std: float) -> F32:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _rank(layer: Layer, input_shape: Shape, *ranks: int) -> None:
    if len(input_shape) not in ranks:
        raise InvalidMessage(f"layer {layer.name!r} ({layer.kind}) cannot take input of shape {list(input_shape)}")


def _bounded(layer: Layer, what: str, elements: int) -> None:
    if elements > MAX_ACTIVATION:
        raise InvalidMessage(f"layer {layer.name!r}: {what} of {elements} elements per example exceed {MAX_ACTIVATION}")


@dataclass(frozen=True)
class Layer:
    """A named layer; by default without parameters and keeping its input's shape."""

    kind: ClassVar[str]
    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise InvalidMessage(f"layer name {self.name!r} must match {_NAME.pattern}")

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        """Shape of every leaf for one example of ``input_shape``; raises ``InvalidMessage`` if it does not fit."""
        self.output_shape(input_shape)
        return {}

    def output_shape(self, input_shape: Shape) -> Shape:
        return input_shape

    def init(self, input_shape: Shape, rng: np.random.Generator) -> Params:
        return {}

    def forward(self, params: Mapping[str, F32], x: F32, matmul: Matmul) -> tuple[F32, Cache]:
        raise NotImplementedError

    def backward(
        self, params: Mapping[str, F32], cache: Cache, dy: F32, matmul: Matmul, *, input_grad: bool = True
    ) -> tuple[F32 | None, Params]:
        raise NotImplementedError

    def to_wire(self) -> dict[str, object]:
        wire: dict[str, object] = {"type": self.kind}
        for f in fields(self):
            value = getattr(self, f.name)
            wire[f.name] = (
                [v.to_wire() if isinstance(v, Layer) else v for v in value] if isinstance(value, tuple) else value
            )
        return wire


@dataclass(frozen=True)
class Dense(Layer):
    """``x @ kernel + bias`` over the last axis (so ``[n, d]`` and ``[n, T, d]`` alike); He-normal kernel."""

    kind: ClassVar[str] = "dense"
    units: int

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        _rank(self, input_shape, 1, 2, 3)
        return {"kernel": (input_shape[-1], self.units), "bias": (self.units,)}

    def output_shape(self, input_shape: Shape) -> Shape:
        return (*input_shape[:-1], self.units)

    def init(self, input_shape: Shape, rng: np.random.Generator) -> Params:
        fan_in = input_shape[-1]
        return {
            "kernel": _normal(rng, (fan_in, self.units), np.sqrt(2.0 / fan_in)),
            "bias": np.zeros(self.units, np.float32),
        }

    def forward(self, params: Mapping[str, F32], x: F32, matmul: Matmul) -> tuple[F32, Cache]:
        rows = x.reshape(-1, x.shape[-1])
        y = matmul(rows, params["kernel"]) + params["bias"]
        return y.reshape(*x.shape[:-1], self.units), rows

    def backward(
        self, params: Mapping[str, F32], cache: Cache, dy: F32, matmul: Matmul, *, input_grad: bool = True
    ) -> tuple[F32 | None, Params]:
        rows: F32 = cache
        dy_rows = dy.reshape(-1, self.units)
        grads = {"kernel": matmul(rows.T, dy_rows), "bias": dy_rows.sum(axis=0)}
        if not input_grad:
            return None, grads
        dx = matmul(dy_rows, params["kernel"].T)
        return dx.reshape(*dy.shape[:-1], rows.shape[-1]), grads


@dataclass(frozen=True)
class Conv2D(Layer):
    """A 2-D convolution over NHWC input, stride 1, kernel ``[k, k, C, filters]`` (HWIO), He-normal.

    By im2col: ``sliding_window_view`` gathers every window into a row, then one ``matmul``.
    ``same`` pads ``(k - 1) // 2`` before and the rest after, as XLA does."""

    kind: ClassVar[str] = "conv2d"
    filters: int
    kernel_size: int
    padding: str = "same"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.padding not in ("same", "valid"):
            raise InvalidMessage(f"layer {self.name!r}: padding must be 'same' or 'valid', not {self.padding!r}")

    def _pads(self) -> tuple[int, int]:
        low = (self.kernel_size - 1) // 2 if self.padding == "same" else 0
        return low, (self.kernel_size - 1 - low if self.padding == "same" else 0)

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        self.output_shape(input_shape)
        k = self.kernel_size
        return {"kernel": (k, k, input_shape[-1], self.filters), "bias": (self.filters,)}

    def output_shape(self, input_shape: Shape) -> Shape:
        _rank(self, input_shape, 3)
        height, width, _ = input_shape
        low, high = self._pads()
        out = (height + low + high - self.kernel_size + 1, width + low + high - self.kernel_size + 1)
        if min(out) < 1:
            raise InvalidMessage(
                f"layer {self.name!r}: a {self.kernel_size}x{self.kernel_size} kernel exceeds {list(input_shape)}"
            )
        _bounded(self, "im2col rows", out[0] * out[1] * self.kernel_size**2 * input_shape[-1])
        return (*out, self.filters)

    def init(self, input_shape: Shape, rng: np.random.Generator) -> Params:
        shapes = self.param_shapes(input_shape)
        fan_in = self.kernel_size * self.kernel_size * input_shape[-1]
        return {
            "kernel": _normal(rng, shapes["kernel"], np.sqrt(2.0 / fan_in)),
            "bias": np.zeros(self.filters, np.float32),
        }

    def _matrix(self, kernel: F32) -> F32:
        """The kernel as a ``[C·k·k, filters]`` matrix, rows in the order of ``sliding_window_view``."""
        return kernel.transpose(2, 0, 1, 3).reshape(-1, self.filters)

    def forward(self, params: Mapping[str, F32], x: F32, matmul: Matmul) -> tuple[F32, Cache]:
        low, high = self._pads()
        padded = np.pad(x, ((0, 0), (low, high), (low, high), (0, 0))) if self.padding == "same" else x
        windows = sliding_window_view(padded, (self.kernel_size, self.kernel_size), axis=(1, 2))
        n, out_h, out_w = windows.shape[:3]
        cols = windows.reshape(n * out_h * out_w, -1)  # [positions, C·k·k], a copy
        y = matmul(cols, self._matrix(params["kernel"])) + params["bias"]
        return y.reshape(n, out_h, out_w, self.filters), (cols, x.shape)

    def backward(
        self, params: Mapping[str, F32], cache: Cache, dy: F32, matmul: Matmul, *, input_grad: bool = True
    ) -> tuple[F32 | None, Params]:
        cols, x_shape = cache
        n, out_h, out_w, _ = dy.shape
        k, channels = self.kernel_size, x_shape[-1]
        dy_rows = dy.reshape(-1, self.filters)
        dkernel = matmul(cols.T, dy_rows).reshape(channels, k, k, self.filters).transpose(1, 2, 0, 3)
        grads = {"kernel": np.ascontiguousarray(dkernel), "bias": dy_rows.sum(axis=0)}
        if not input_grad:
            return None, grads
        dcols = matmul(dy_rows, self._matrix(params["kernel"]).T).reshape(n, out_h, out_w, channels, k, k)
        dpadded = np.zeros((n, out_h + k - 1, out_w + k - 1, channels), np.float32)
        for i in range(k):
            for j in range(k):
                dpadded[:, i : i + out_h, j : j + out_w] += dcols[..., i, j]
        low = self._pads()[0]
        return dpadded[:, low : low + x_shape[1], low : low + x_shape[2]], grads


@dataclass(frozen=True)
class MaxPool2D(Layer):
    """Max over ``window x window`` tiles of NHWC input (stride = window; a remainder is dropped).
    The gradient goes to the first maximum of each tile, as XLA's ``reduce_window`` does."""

    kind: ClassVar[str] = "maxpool2d"
    window: int = 2

    def output_shape(self, input_shape: Shape) -> Shape:
        _rank(self, input_shape, 3)
        height, width, channels = input_shape
        if min(height, width) < self.window:
            raise InvalidMessage(
                f"layer {self.name!r}: a {self.window}x{self.window} window exceeds {list(input_shape)}"
            )
        return height // self.window, width // self.window, channels

    def forward(self, params: Mapping[str, F32], x: F32, matmul: Matmul) -> tuple[F32, Cache]:
        n, height, width, channels = x.shape
        s = self.window
        out_h, out_w = height // s, width // s
        tiles = x[:, : out_h * s, : out_w * s].reshape(n, out_h, s, out_w, s, channels)
        tiles = tiles.transpose(0, 1, 3, 5, 2, 4).reshape(n, out_h, out_w, channels, s * s)
        first = tiles.argmax(axis=-1)[..., None]
        return np.take_along_axis(tiles, first, axis=-1)[..., 0], (first, x.shape)

    def backward(
        self, params: Mapping[str, F32], cache: Cache, dy: F32, matmul: Matmul, *, input_grad: bool = True
    ) -> tuple[F32 | None, Params]:
        if not input_grad:
            return None, {}
        first, (n, height, width, channels) = cache
        s = self.window
        out_h, out_w = dy.shape[1:3]
        dtiles = np.zeros((n, out_h, out_w, channels, s * s), np.float32)
        np.put_along_axis(dtiles, first, dy[..., None], axis=-1)
        dx = np.zeros((n, height, width, channels), np.float32)
        dx[:, : out_h * s, : out_w * s] = (
            dtiles.reshape(n, out_h, out_w, channels, s, s)
            .transpose(0, 1, 4, 2, 5, 3)
            .reshape(n, out_h * s, out_w * s, channels)
        )
        return dx, {}


@dataclass(frozen=True)
class ReLU(Layer):
    kind: ClassVar[str] = "relu"

    def forward(self, params: Mapping[str, F32], x: F32, matmul: Matmul) -> tuple[F32, Cache]:
        y = np.maximum(x, 0.0)
        return y, y

    def backward(
        self, params: Mapping[str, F32], cache: Cache, dy: F32, matmul: Matmul, *, input_grad: bool = True
    ) -> tuple[F32 | None, Params]:
        return (dy * (cache > 0) if input_grad else None), {}


@dataclass(frozen=True)
class GELU(Layer):
    """GELU, tanh approximation (``jax.nn.gelu(approximate=True)``)."""

    kind: ClassVar[str] = "gelu"

    def forward(self, params: Mapping[str, F32], x: F32, matmul: Matmul) -> tuple[F32, Cache]:
        tanh = np.tanh(_GELU_C * (x + _GELU_A * (x * x * x)))
        return x * (np.float32(0.5) * (np.float32(1.0) + tanh)), (x, tanh)

    def backward(
        self, params: Mapping[str, F32], cache: Cache, dy: F32, matmul: Matmul, *, input_grad: bool = True
    ) -> tuple[F32 | None, Params]:
        if not input_grad:
            return None, {}
        x, tanh = cache
        half = np.float32(0.5)
        slope = half * (1 + tanh) + half * x * (1 - tanh * tanh) * _GELU_C * (1 + 3 * _GELU_A * x * x)
        return dy * slope, {}


@dataclass(frozen=True)
class _Reshaping(Layer):
    """Each example reshaped to ``output_shape``."""

    def forward(self, params: Mapping[str, F32], x: F32, matmul: Matmul) -> tuple[F32, Cache]:
        return x.reshape(len(x), *self.output_shape(x.shape[1:])), x.shape

    def backward(
        self, params: Mapping[str, F32], cache: Cache, dy: F32, matmul: Matmul, *, input_grad: bool = True
    ) -> tuple[F32 | None, Params]:
        return (dy.reshape(cache) if input_grad else None), {}


@dataclass(frozen=True)
class Reshape(_Reshaping):
    """Each example reshaped to ``shape`` (``784 -> 28x28x1``)."""

    kind: ClassVar[str] = "reshape"
    shape: tuple[int, ...]

    def output_shape(self, input_shape: Shape) -> Shape:
        if not 1 <= len(self.shape) <= MAX_RANK or int(np.prod(self.shape)) != int(np.prod(input_shape)):
            raise InvalidMessage(f"layer {self.name!r}: cannot reshape {list(input_shape)} to {list(self.shape)}")
        return tuple(self.shape)


@dataclass(frozen=True)
class Flatten(_Reshaping):
    """Each example flattened to one axis."""

    kind: ClassVar[str] = "flatten"

    def output_shape(self, input_shape: Shape) -> Shape:
        return (int(np.prod(input_shape)),)


@dataclass(frozen=True)
class LayerNorm(Layer):
    """Normalization over the last axis, then ``scale`` (ones) and ``bias`` (zeros)."""

    kind: ClassVar[str] = "layernorm"
    eps: float = 1e-5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.eps <= 0.1:
            raise InvalidMessage(f"layer {self.name!r}: eps {self.eps} is not in (0, 0.1]")

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        _rank(self, input_shape, 1, 2, 3)
        return {"scale": input_shape[-1:], "bias": input_shape[-1:]}

    def init(self, input_shape: Shape, rng: np.random.Generator) -> Params:
        return {"scale": np.ones(input_shape[-1], np.float32), "bias": np.zeros(input_shape[-1], np.float32)}

    def forward(self, params: Mapping[str, F32], x: F32, matmul: Matmul) -> tuple[F32, Cache]:
        centered = x - x.mean(axis=-1, keepdims=True)
        rstd = 1 / np.sqrt((centered * centered).mean(axis=-1, keepdims=True) + np.float32(self.eps))
        normed = centered * rstd
        return normed * params["scale"] + params["bias"], (normed, rstd)

    def backward(
        self, params: Mapping[str, F32], cache: Cache, dy: F32, matmul: Matmul, *, input_grad: bool = True
    ) -> tuple[F32 | None, Params]:
        normed, rstd = cache
        width = dy.shape[-1]
        grads = {"scale": (dy * normed).reshape(-1, width).sum(axis=0), "bias": dy.reshape(-1, width).sum(axis=0)}
        if not input_grad:
            return None, grads
        g = dy * params["scale"]
        dx = rstd * (g - g.mean(axis=-1, keepdims=True) - normed * (g * normed).mean(axis=-1, keepdims=True))
        return dx, grads


@dataclass(frozen=True)
class Embedding(Layer):
    """Token ids ``[T]`` (float32 holding integers in ``[0, vocab)``) to ``tokens[id] + positions[t]``.

    Only the first layer of a model takes ids; both tables start normal with std 0.02."""

    kind: ClassVar[str] = "embedding"
    vocab: int
    dim: int
    max_len: int

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        self.output_shape(input_shape)
        return {"tokens": (self.vocab, self.dim), "positions": (self.max_len, self.dim)}

    def output_shape(self, input_shape: Shape) -> Shape:
        _rank(self, input_shape, 1)
        if input_shape[0] > self.max_len:
            raise InvalidMessage(f"layer {self.name!r}: {input_shape[0]} tokens exceed max_len {self.max_len}")
        return input_shape[0], self.dim

    def init(self, input_shape: Shape, rng: np.random.Generator) -> Params:
        return {name: _normal(rng, shape, 0.02) for name, shape in self.param_shapes(input_shape).items()}

    def forward(self, params: Mapping[str, F32], x: F32, matmul: Matmul) -> tuple[F32, Cache]:
        ids = x.astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab or not np.array_equal(ids, x)):
            raise ValueError(f"layer {self.name!r}: token ids must be integers in [0, {self.vocab})")
        return params["tokens"][ids] + params["positions"][: x.shape[1]], ids

    def backward(
        self, params: Mapping[str, F32], cache: Cache, dy: F32, matmul: Matmul, *, input_grad: bool = True
    ) -> tuple[F32 | None, Params]:
        ids: npt.NDArray[np.int64] = cache
        tokens = np.zeros((self.vocab, self.dim), np.float32)
        np.add.at(tokens, ids.ravel(), dy.reshape(-1, self.dim))
        positions = np.zeros((self.max_len, self.dim), np.float32)
        positions[: ids.shape[1]] = dy.sum(axis=0)
        return (np.zeros(ids.shape, np.float32) if input_grad else None), {"tokens": tokens, "positions": positions}


@dataclass(frozen=True)
class CausalSelfAttention(Layer):
    """Multi-head self-attention over ``[T, d]`` where position ``t`` sees positions ``<= t``.

    Fused projections ``qkv`` (``[d, 3d]``: queries, keys, values, heads side by side) and ``out``
    (``[d, d]``), Glorot-normal kernels, zero biases; softmax in float32."""

    kind: ClassVar[str] = "attention"
    heads: int

    def _projections(self, width: int) -> tuple[Dense, Dense]:
        return Dense("qkv", 3 * width), Dense("out", width)

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        _rank(self, input_shape, 2)
        if input_shape[-1] % self.heads:
            raise InvalidMessage(
                f"layer {self.name!r}: width {input_shape[-1]} is not a multiple of {self.heads} heads"
            )
        _bounded(self, "attention scores", self.heads * input_shape[0] ** 2)
        return {
            f"{p.name}.{leaf}": s
            for p in self._projections(input_shape[-1])
            for leaf, s in p.param_shapes(input_shape).items()
        }

    def init(self, input_shape: Shape, rng: np.random.Generator) -> Params:
        std = np.sqrt(1.0 / input_shape[-1])  # Glorot normal of each d x d block
        return {
            leaf: _normal(rng, shape, std) if leaf.endswith("kernel") else np.zeros(shape, np.float32)
            for leaf, shape in self.param_shapes(input_shape).items()
        }

    def forward(self, params: Mapping[str, F32], x: F32, matmul: Matmul) -> tuple[F32, Cache]:
        n, length, width = x.shape
        qkv_layer, out_layer = self._projections(width)
        groups = _by_layer(params)
        qkv, qkv_cache = qkv_layer.forward(groups["qkv"], x, matmul)
        q, k, v = qkv.reshape(n, length, 3, self.heads, -1).transpose(2, 0, 3, 1, 4)  # each [n, heads, T, d/heads]
        scale = np.float32(1.0 / np.sqrt(q.shape[-1]))
        scores = np.where(np.tri(length, dtype=bool), np.matmul(q, k.transpose(0, 1, 3, 2)) * scale, -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        merged = np.matmul(probs, v).transpose(0, 2, 1, 3).reshape(n, length, width)
        y, out_cache = out_layer.forward(groups["out"], merged, matmul)
        return y, (qkv_cache, q, k, v, scale, probs, out_cache)

    def backward(
        self, params: Mapping[str, F32], cache: Cache, dy: F32, matmul: Matmul, *, input_grad: bool = True
    ) -> tuple[F32 | None, Params]:
        qkv_cache, q, k, v, scale, probs, out_cache = cache
        n, heads, length, head_width = q.shape
        qkv_layer, out_layer = self._projections(heads * head_width)
        groups = _by_layer(params)
        dmerged, out_grads = out_layer.backward(groups["out"], out_cache, dy, matmul)
        assert dmerged is not None
        dattended = dmerged.reshape(n, length, heads, head_width).transpose(0, 2, 1, 3)
        dprobs = np.matmul(dattended, v.transpose(0, 1, 3, 2))
        dv = np.matmul(probs.transpose(0, 1, 3, 2), dattended)
        dscores = probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True)) * scale
        dq = np.matmul(dscores, k)
        dk = np.matmul(dscores.transpose(0, 1, 3, 2), q)
        dqkv = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(n, length, 3 * heads * head_width)
        dx, qkv_grads = qkv_layer.backward(groups["qkv"], qkv_cache, dqkv, matmul, input_grad=input_grad)
        return dx, _prefixed("qkv", qkv_grads) | _prefixed("out", out_grads)


@dataclass(frozen=True)
class Residual(Layer):
    """``x + layers(x)``: a block of sub-layers whose output has the shape of its input."""

    kind: ClassVar[str] = "residual"
    layers: tuple[Layer, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        check_chain(self.layers)
        if any(isinstance(layer, Residual) for layer in self.layers):
            raise InvalidMessage(f"layer {self.name!r}: residual blocks do not nest")

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        self.output_shape(input_shape)
        return chain_param_shapes(self.layers, input_shape)

    def output_shape(self, input_shape: Shape) -> Shape:
        output = activation_shapes(self.layers, input_shape)[-1]
        if output != input_shape:
            raise InvalidMessage(f"layer {self.name!r}: its layers map {list(input_shape)} to {list(output)}")
        return input_shape

    def init(self, input_shape: Shape, rng: np.random.Generator) -> Params:
        self.output_shape(input_shape)
        return init_chain(self.layers, input_shape, rng)

    def forward(self, params: Mapping[str, F32], x: F32, matmul: Matmul) -> tuple[F32, Cache]:
        y, tape = forward_chain(self.layers, params, x, matmul)
        return x + y, tape

    def backward(
        self, params: Mapping[str, F32], cache: Cache, dy: F32, matmul: Matmul, *, input_grad: bool = True
    ) -> tuple[F32 | None, Params]:
        dx, grads = backward_chain(self.layers, cache, dy, matmul, input_grad=input_grad)
        return (None if dx is None else dy + dx), grads


LAYER_TYPES: dict[str, type[Layer]] = {
    cls.kind: cls
    for cls in (
        Dense,
        Conv2D,
        MaxPool2D,
        ReLU,
        GELU,
        Reshape,
        Flatten,
        LayerNorm,
        Embedding,
        CausalSelfAttention,
        Residual,
    )
}


# -- chains: a model's layers, or a residual block's ------------------------------------------
def check_chain(layers: Sequence[Layer]) -> None:
    """Raise ``InvalidMessage`` unless ``layers`` is 1 to ``MAX_LAYERS`` layers with distinct names."""
    if not 1 <= len(layers) <= MAX_LAYERS or not all(isinstance(layer, Layer) for layer in layers):
        raise InvalidMessage(f"a chain holds 1 to {MAX_LAYERS} layers")
    names = [layer.name for layer in layers]
    if len(set(names)) != len(names):
        raise InvalidMessage(f"layer names repeat in {names}")


def activation_shapes(layers: Sequence[Layer], input_shape: Shape) -> list[Shape]:
    """The shape each layer takes, then the chain's output shape (per example)."""
    shapes = [input_shape]
    for layer in layers:
        shapes.append(layer.output_shape(shapes[-1]))
    return shapes


def chain_param_shapes(layers: Sequence[Layer], input_shape: Shape) -> dict[str, Shape]:
    """Every parameter's shape by flat name, in order."""
    return {
        f"{layer.name}.{leaf}": shape
        for layer, taken in zip(layers, activation_shapes(layers, input_shape), strict=False)
        for leaf, shape in layer.param_shapes(taken).items()
    }


def init_chain(layers: Sequence[Layer], input_shape: Shape, rng: np.random.Generator) -> Params:
    """Every parameter's initial value by flat name, drawn from ``rng`` layer by layer, in order."""
    params: Params = {}
    for layer, taken in zip(layers, activation_shapes(layers, input_shape), strict=False):
        params.update(_prefixed(layer.name, layer.init(taken, rng)))
    return params


def _by_layer(params: Mapping[str, F32]) -> dict[str, dict[str, F32]]:
    """Flat names grouped by their first component: ``{"dense0": {"kernel": ..., "bias": ...}}``."""
    groups: dict[str, dict[str, F32]] = {}
    for name, value in params.items():
        layer, _, leaf = name.partition(".")
        groups.setdefault(layer, {})[leaf] = value
    return groups


def _prefixed(prefix: str, params: Mapping[str, F32]) -> Params:
    return {f"{prefix}.{leaf}": value for leaf, value in params.items()}


def forward_chain(
    layers: Sequence[Layer], params: Mapping[str, F32], x: F32, matmul: Matmul
) -> tuple[F32, list[tuple[dict[str, F32], Cache]]]:
    """The chain's output for a batch ``x``, and its tape: each layer's parameters and cache."""
    groups = _by_layer(params)
    tape = []
    for layer in layers:
        leaves = groups.get(layer.name, {})
        x, cache = layer.forward(leaves, x, matmul)
        tape.append((leaves, cache))
    return x, tape


def backward_chain(
    layers: Sequence[Layer],
    tape: Sequence[tuple[dict[str, F32], Cache]],
    dy: F32,
    matmul: Matmul,
    *,
    input_grad: bool = True,
) -> tuple[F32 | None, Params]:
    """From ``forward_chain``'s tape, the gradient of the chain's input (``None`` unless
    ``input_grad``) and of every parameter."""
    grads: Params = {}
    dx: F32 | None = dy
    for index in reversed(range(len(layers))):
        layer, (leaves, cache) = layers[index], tape[index]
        assert dx is not None  # only the first layer may skip its input gradient
        dx, leaf_grads = layer.backward(leaves, cache, dx, matmul, input_grad=input_grad or index > 0)
        grads.update(_prefixed(layer.name, leaf_grads))
    return dx, grads


# -- wire --------------------------------------------------------------------------------------
def _dim(value: object) -> int:
    if type(value) is not int or not 1 <= value <= MAX_DIM:
        raise InvalidMessage(f"expected an integer in [1, {MAX_DIM}]")
    return value


def layer_from_wire(value: object, *, nested: bool = False) -> Layer:
    """A layer from its wire form ``{"type": ..., "name": ..., <fields>}``; raises ``InvalidMessage``.

    Sizes are integers in ``[1, MAX_DIM]``, a chain holds at most ``MAX_LAYERS`` layers, a residual
    block's layers are not residual blocks, and no other field may appear."""
    d = read_object(value, "layer")
    kind = read_str(d, "type", max_len=32)
    if kind not in LAYER_TYPES:
        raise InvalidMessage(f"unknown layer type {kind!r}; types: {sorted(LAYER_TYPES)}")
    cls = LAYER_TYPES[kind]
    unknown = set(d) - {"type"} - {f.name for f in fields(cls)}
    if unknown:
        raise InvalidMessage(f"layer type {kind!r} has no fields {sorted(unknown)}")
    if cls is Residual and nested:
        raise InvalidMessage("residual blocks do not nest")
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in d and f.default is not MISSING:  # a field with a default may be left out
            continue
        if f.type == "int":
            values[f.name] = read_int(d, f.name, low=1, high=MAX_DIM)
        elif f.type == "float":
            values[f.name] = read_float(d, f.name)
        elif f.type == "str":
            values[f.name] = read_str(d, f.name, max_len=32)
        elif f.type == "tuple[int, ...]":
            values[f.name] = tuple(read_list(d, f.name, _dim, max_len=MAX_RANK))
        else:  # tuple[Layer, ...]
            values[f.name] = read_layers(d, f.name, nested=True)
    return cls(**values)


def read_layers(data: Mapping[str, object], key: str, *, nested: bool = False) -> tuple[Layer, ...]:
    """The chain of layers in field ``key`` of ``data`` (at most ``MAX_LAYERS``); a layer that does not
    read is an ``InvalidMessage`` naming its place (``layers[2]: unknown layer type 'dens'``)."""
    items = read_list(data, key, lambda value: value, max_len=MAX_LAYERS)
    layers = []
    for index, item in enumerate(items):
        try:
            layers.append(layer_from_wire(item, nested=nested))
        except InvalidMessage as exc:
            raise InvalidMessage(f"{key}[{index}]: {exc}") from None
    return tuple(layers)
