"""Model specs: parameter names, shapes and init, plus the NumPy reference forward pass.

The MNIST model is an MLP ``784 -> 128 (ReLU) -> 10``. Parameters are stored flat by name
(``dense0.kernel``, ``dense0.bias``, ...), float32, in every artifact; JAX and NumPy trainers map
them to and from their own structures. ``forward`` / ``evaluate`` are the reference numerics the
JAX model is tested against.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .errors import InvalidMessage

__all__ = [
    "MAX_ARTIFACT_METADATA_BYTES",
    "MODELS",
    "ModelSpec",
    "Params",
    "evaluate",
    "forward",
    "init_params",
]

MAX_ARTIFACT_METADATA_BYTES = 16 * 1024  # header room beyond the tensor table: a few metadata strings

Params = dict[str, npt.NDArray[np.float32]]


@dataclass(frozen=True)
class ModelSpec:
    """A fully connected ReLU network with a softmax cross-entropy head."""

    name: str
    layer_sizes: tuple[int, ...]

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        for i, (fan_in, fan_out) in enumerate(zip(self.layer_sizes, self.layer_sizes[1:], strict=False)):
            shapes[f"dense{i}.kernel"] = (fan_in, fan_out)
            shapes[f"dense{i}.bias"] = (fan_out,)
        return shapes

    @property
    def num_layers(self) -> int:
        return len(self.layer_sizes) - 1

    @property
    def num_params(self) -> int:
        return sum(int(np.prod(s)) for s in self.shapes.values())

    def check(self, params: Mapping[str, np.ndarray]) -> None:
        """Raise ``InvalidMessage`` unless ``params`` has exactly this spec's names, shapes, float32."""
        if set(params) != set(self.shapes):
            raise InvalidMessage(f"parameter names {sorted(params)} do not match {self.name}")
        for name, shape in self.shapes.items():
            array = params[name]
            if array.shape != shape or array.dtype != np.float32:
                raise InvalidMessage(f"{name}: expected float32{list(shape)}, got {array.dtype}{list(array.shape)}")

    @property
    def max_artifact_bytes(self) -> int:
        """The largest artifact that can hold this model: float32 tensors plus a small header."""
        return 8 + MAX_ARTIFACT_METADATA_BYTES + 4 * self.num_params


MODELS: dict[str, ModelSpec] = {"mnist-mlp": ModelSpec("mnist-mlp", (784, 128, 10))}


def init_params(spec: ModelSpec, seed: int) -> Params:
    """He-normal kernels, zero biases, from a seeded generator (same seed, same bytes)."""
    rng = np.random.default_rng(seed)
    params: Params = {}
    for name, shape in spec.shapes.items():
        if name.endswith(".kernel"):
            params[name] = (rng.standard_normal(shape) * np.sqrt(2.0 / shape[0])).astype(np.float32)
        else:
            params[name] = np.zeros(shape, np.float32)
    return params


def forward(spec: ModelSpec, params: Mapping[str, np.ndarray], x: np.ndarray) -> npt.NDArray[np.float32]:
    """Logits for a batch ``x`` of shape ``[n, layer_sizes[0]]``."""
    h = np.asarray(x, np.float32)
    for i in range(spec.num_layers):
        h = h @ params[f"dense{i}.kernel"] + params[f"dense{i}.bias"]
        if i < spec.num_layers - 1:
            h = np.maximum(h, 0.0)
    return h


def evaluate(
    spec: ModelSpec, params: Mapping[str, np.ndarray], x: np.ndarray, y: np.ndarray, *, batch_size: int = 2048
) -> dict[str, float]:
    """Mean cross-entropy (accumulated in float64) and accuracy over ``(x, y)``."""
    total_loss = 0.0
    correct = 0
    for start in range(0, len(x), batch_size):
        logits = forward(spec, params, x[start : start + batch_size]).astype(np.float64)
        labels = np.asarray(y[start : start + batch_size], np.int64)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        total_loss += float(-log_probs[np.arange(len(labels)), labels].sum())
        correct += int((logits.argmax(axis=1) == labels).sum())
    n = max(len(x), 1)
    return {"loss": total_loss / n, "accuracy": correct / n}
