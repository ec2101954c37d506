"""Model specs: the layers of a model, its parameters' names, shapes and init, and its objective.

``Model`` is what the protocol needs of any model (name, input shape, objective, parameter shapes,
classes); ``ModelSpec`` is the model every peer builds from its layers, ``protocol.workload`` the
other kind (JAX code of the network's own, pinned by hash, native peers only).

A ``ModelSpec`` is an input shape (one example), a chain of ``protocol.layers`` and an objective:
``classify`` (labels ``[n]``, logits ``[n, C]``) or ``next-token`` (labels ``[n, T]``, logits
``[n, T, V]``; the loss is the mean over every position). Parameters are stored flat by name
(``dense0.kernel``, ``conv0.bias``, ``attn0.self.qkv.kernel``), float32, in every artifact; JAX and
NumPy trainers map them to and from their own structures. ``forward`` / ``evaluate`` are the
reference numerics the JAX models are tested against; ``softmax_cross_entropy`` is the one loss the
NumPy trainer and evaluation share. Specs travel as plain JSON (``to_wire`` / ``from_wire``) in the
network manifest, each experiment with its model, so every peer builds the model the network declares;
models are written in network config files (``networks/models.toml`` holds the built-in ones).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from .errors import InvalidMessage
from .fields import read_list, read_object, read_str
from .layers import (
    MAX_ACTIVATION,
    MAX_DIM,
    MAX_RANK,
    Dense,
    Embedding,
    Layer,
    Matmul,
    Params,
    ReLU,
    Residual,
    Shape,
    activation_shapes,
    chain_param_shapes,
    check_chain,
    forward_chain,
    init_chain,
    read_layers,
)

__all__ = [
    "MAX_ARTIFACT_METADATA_BYTES",
    "MAX_PARAMS",
    "MODEL_NAME",
    "OBJECTIVES",
    "Model",
    "ModelSpec",
    "Params",
    "check_input_shape",
    "evaluate",
    "evaluation_metrics",
    "forward",
    "init_params",
    "mlp",
    "read_input_shape",
    "softmax_cross_entropy",
]

MAX_ARTIFACT_METADATA_BYTES = 16 * 1024  # header room beyond the tensor table: a few metadata strings
MAX_PARAMS = 2**27  # 512 MiB of float32
OBJECTIVES = ("classify", "next-token")
MODEL_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


class Model:
    """What every peer and the edge know of an experiment's model: its name, one example's input
    shape, its objective, its parameters' names and shapes, and the classes (a next-token model's
    vocabulary) it predicts among. ``ModelSpec`` (layers every peer builds) and
    ``protocol.workload.WorkloadModel`` (JAX code of the network's own, native peers only) are the two kinds."""

    name: str
    input_shape: Shape
    objective: str
    native_only: ClassVar[bool] = False  # only native peers can build it (browser peers do not lease for it)

    @property
    def shapes(self) -> dict[str, Shape]:
        """Every parameter's shape by flat name, in the model's order."""
        raise NotImplementedError

    @property
    def classes(self) -> int:
        """The classes a classifier tells apart, or a next-token model's vocabulary (its output's last axis)."""
        raise NotImplementedError

    @property
    def reads_tokens(self) -> bool:
        """Whether the model takes token ids rather than pixels."""
        raise NotImplementedError

    def to_wire(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def num_params(self) -> int:
        return sum(math.prod(s) for s in self.shapes.values())

    def check(self, params: Mapping[str, np.ndarray]) -> None:
        """Raise ``InvalidMessage`` unless ``params`` has exactly this model's names, shapes, float32."""
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

    def check_output(self, output: Shape) -> None:
        """Raise ``InvalidMessage`` unless ``output`` (one example's logits) fits the objective:
        ``[classes >= 2]`` for a classifier, ``[T, vocab >= 2]`` from ``[T]`` for a next-token model."""
        if self.objective not in OBJECTIVES:
            raise InvalidMessage(f"unknown objective {self.objective!r}; objectives: {OBJECTIVES}")
        if self.objective == "classify" and not (len(output) == 1 and output[0] >= 2):
            raise InvalidMessage(f"a classifier's output must be [classes >= 2], not {list(output)}")
        if self.objective == "next-token" and not (
            len(self.input_shape) == 1 and len(output) == 2 and output[0] == self.input_shape[0] and output[1] >= 2
        ):
            raise InvalidMessage(
                f"a next-token model maps [T] to [T, vocab], not {list(self.input_shape)} to {list(output)}"
            )


def check_input_shape(shape: object) -> None:
    """Raise ``InvalidMessage`` unless ``shape`` is one example's shape: 1 to ``MAX_RANK`` sizes in [1, ``MAX_DIM``]."""
    if (
        not isinstance(shape, tuple)
        or not 1 <= len(shape) <= MAX_RANK
        or not all(type(d) is int and 1 <= d <= MAX_DIM for d in shape)
    ):
        raise InvalidMessage(f"input shape {shape!r}: 1 to {MAX_RANK} sizes in [1, {MAX_DIM}]")


@dataclass(frozen=True)
class ModelSpec(Model):
    """A model: the shape of one input example, its layers in order, and its objective.

    Construction checks the whole spec (names, shapes, sizes) and raises ``InvalidMessage``."""

    name: str
    input_shape: Shape
    layers: tuple[Layer, ...]
    objective: str = "classify"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not MODEL_NAME.fullmatch(self.name):
            raise InvalidMessage(f"model name {self.name!r} must match {MODEL_NAME.pattern}")
        check_input_shape(self.input_shape)
        if not isinstance(self.layers, tuple):
            raise InvalidMessage("layers must be a tuple")
        check_chain(self.layers)
        nested = [sub for layer in self.layers if isinstance(layer, Residual) for sub in layer.layers]
        if any(isinstance(layer, Embedding) for layer in [*self.layers[1:], *nested]):
            raise InvalidMessage("only a model's first layer may be an embedding (it takes token ids)")
        shapes = activation_shapes(self.layers, self.input_shape)
        if max(math.prod(shape) for shape in shapes) > MAX_ACTIVATION:
            raise InvalidMessage(f"an activation of {self.name} exceeds {MAX_ACTIVATION} elements per example")
        self.check_output(shapes[-1])
        if self.num_params > MAX_PARAMS:
            raise InvalidMessage(f"{self.name} has {self.num_params} parameters, more than {MAX_PARAMS}")

    @property
    def shapes(self) -> dict[str, Shape]:
        return chain_param_shapes(self.layers, self.input_shape)

    @property
    def classes(self) -> int:
        return activation_shapes(self.layers, self.input_shape)[-1][-1]

    @property
    def reads_tokens(self) -> bool:
        """Whether the model's first layer is an embedding (it takes token ids)."""
        return isinstance(self.layers[0], Embedding)

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "input_shape": list(self.input_shape),
            "layers": [layer.to_wire() for layer in self.layers],
            "objective": self.objective,
        }

    @classmethod
    def from_wire(cls, value: object) -> ModelSpec:
        d = read_object(value, "model")
        unknown = set(d) - {"name", "input_shape", "layers", "objective"}
        if unknown:
            raise InvalidMessage(f"a model has no fields {sorted(unknown)}")
        return cls(
            name=read_str(d, "name", max_len=64),
            input_shape=read_input_shape(d),
            layers=read_layers(d, "layers"),
            objective=read_str(d, "objective", max_len=16),
        )


def read_input_shape(d: Mapping[str, object]) -> Shape:
    """Field ``input_shape`` of ``d``: a list of up to ``MAX_RANK`` integers (checked further by the model)."""
    return tuple(read_list(d, "input_shape", _size, max_len=MAX_RANK))


def _size(value: object) -> int:
    if type(value) is not int:
        raise InvalidMessage("field 'input_shape' must be a list of integers")
    return value


def mlp(name: str, layer_sizes: Sequence[int]) -> ModelSpec:
    """A fully connected ReLU classifier ``layer_sizes[0] -> ... -> layer_sizes[-1]`` (``dense0``, ``relu0``, ``dense1``, ...)."""
    layers: list[Layer] = []
    for i, units in enumerate(layer_sizes[1:]):
        layers += [ReLU(f"relu{i - 1}")] if i else []
        layers.append(Dense(f"dense{i}", units))
    return ModelSpec(name, (layer_sizes[0],), tuple(layers))


def init_params(spec: ModelSpec, seed: int) -> Params:
    """Each layer's init (He-normal dense and conv kernels, zero biases, ...) from one seeded
    generator, layer by layer (same seed, same bytes)."""
    return init_chain(spec.layers, spec.input_shape, np.random.default_rng(seed))


def forward(
    spec: ModelSpec, params: Mapping[str, np.ndarray], x: np.ndarray, matmul: Matmul = np.matmul
) -> npt.NDArray[np.float32]:
    """Logits for a batch ``x`` of shape ``[n, *input_shape]``."""
    logits, _ = forward_chain(spec.layers, params, np.asarray(x, np.float32), matmul)
    return logits


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cross-entropy at every position of ``logits [..., V]`` against integer ``labels [...]``, and the
    softmax, flattened to ``[positions]`` and ``[positions, V]``, in the logits' dtype."""
    flat = logits.reshape(-1, logits.shape[-1])
    shifted = flat - flat.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    total = exp.sum(axis=1, keepdims=True)
    index = np.asarray(labels).reshape(-1)
    return np.log(total[:, 0]) - shifted[np.arange(len(index)), index], exp / total


def evaluation_metrics(
    spec: ModelSpec, total_loss: float, correct: int, positions: int, squared_loss: float | None = None
) -> dict[str, float]:
    """Mean loss and accuracy per predicted position; ``loss_se``, the standard error of the mean loss,
    when the sum of squared losses is given; ``bits_per_char`` too for a next-token model."""
    n = max(positions, 1)
    metrics = {"loss": total_loss / n, "accuracy": correct / n}
    if squared_loss is not None:
        variance = max(squared_loss / n - metrics["loss"] ** 2, 0.0)
        metrics["loss_se"] = math.sqrt(variance / n)
    if spec.objective == "next-token":
        metrics["bits_per_char"] = metrics["loss"] / math.log(2)
    return metrics


def evaluate(
    spec: ModelSpec, params: Mapping[str, np.ndarray], x: np.ndarray, y: np.ndarray, *, batch_size: int = 256
) -> dict[str, float]:
    """``evaluation_metrics`` over ``(x, y)``, the loss accumulated in float64."""
    total_loss, squared_loss, correct, positions = 0.0, 0.0, 0, 0
    for start in range(0, len(x), batch_size):
        logits = forward(spec, params, x[start : start + batch_size]).astype(np.float64)
        labels = np.asarray(y[start : start + batch_size], np.int64)
        losses, _ = softmax_cross_entropy(logits, labels)
        total_loss += float(losses.sum())
        squared_loss += float((losses**2).sum())
        correct += int((logits.argmax(axis=-1) == labels).sum())
        positions += labels.size
    return evaluation_metrics(spec, total_loss, correct, positions, squared_loss)
