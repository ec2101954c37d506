"""The NumPy layers (what the browser trains with) agree with their JAX twins, layer by layer and model by model.

Per layer, on random float32 inputs and parameters: the NumPy forward matches the JAX apply, and
the NumPy backward matches ``jax.vjp`` for the input and every parameter, to 1e-5 absolute plus
1e-4 relative. Per model (MLP, CNN, char-LM, one declared in a config), from the same parameters and
batch: logits, loss and every gradient to the tolerances of ``tools.parity`` (what ``dtn
workload check`` holds any spec to), and evaluation metrics to 1e-5. Model specs survive their JSON
wire form; hostile forms are rejected.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest

from browser_peer.numpy_trainer import fastest_matmul, gradients
from native_peer.jax_layers import apply_layer
from native_peer.learner import Evaluator, spec_learner
from native_peer.models import builtin_model, builtin_models, read_models
from protocol.errors import InvalidMessage
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
from protocol.model import ModelSpec, evaluate, forward, init_params, mlp
from tools.parity import GRADIENTS, LOGITS, LOSS, spec_differences

BATCH = 3
LAYERS: list[tuple[Layer, tuple[int, ...]]] = [
    (Dense("dense", 5), (7,)),
    (Dense("dense", 5), (4, 7)),
    (Conv2D("conv", 3, 3), (6, 5, 2)),
    (Conv2D("conv", 3, 4), (5, 6, 2)),
    (Conv2D("conv", 4, 3, "valid"), (6, 5, 2)),
    (MaxPool2D("pool"), (5, 6, 3)),
    (ReLU("relu"), (4, 6)),
    (GELU("gelu"), (4, 6)),
    (Reshape("reshape", (3, 4, 1)), (12,)),
    (Flatten("flatten"), (2, 3, 2)),
    (LayerNorm("norm"), (4, 8)),
    (Embedding("embed", 11, 6, 9), (7,)),
    (CausalSelfAttention("attn", 2), (5, 8)),
    (Residual("block", (LayerNorm("norm"), Dense("fc", 12), GELU("gelu"), Dense("proj", 8))), (5, 8)),
    (Residual("block", (LayerNorm("norm"), CausalSelfAttention("self", 4))), (5, 8)),
]


def _close(actual: Any, expected: Any, atol: float, rtol: float) -> None:
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), atol=atol, rtol=rtol)


@pytest.mark.parametrize(("layer", "shape"), LAYERS, ids=lambda v: getattr(v, "kind", str(v)))
def test_layer_backward_matches_jax_vjp(layer: Layer, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    params = {leaf: rng.normal(0, 0.5, s).astype(np.float32) for leaf, s in layer.param_shapes(shape).items()}
    if isinstance(layer, Embedding):
        x = rng.integers(0, layer.vocab, (BATCH, *shape)).astype(np.float32)
    else:
        x = rng.normal(0, 1, (BATCH, *shape)).astype(np.float32)
    y, cache = layer.forward(params, x, np.matmul)
    assert y.shape == (BATCH, *layer.output_shape(shape)) and y.dtype == np.float32
    dy = rng.normal(0, 1, y.shape).astype(np.float32)
    dx, grads = layer.backward(params, cache, dy, np.matmul)

    jax_y, vjp = jax.vjp(lambda p, v: apply_layer(layer, p, "", v), params, x)
    jax_grads, jax_dx = vjp(dy)
    _close(y, jax_y, 1e-5, 1e-4)
    assert dx is not None and dx.shape == x.shape and dx.dtype == np.float32
    _close(dx, jax_dx, 1e-5, 1e-4)
    assert set(grads) == set(params)
    for leaf, grad in grads.items():
        assert grad.shape == params[leaf].shape and grad.dtype == np.float32, leaf
        _close(grad, jax_grads[leaf], 1e-5, 1e-4)
    assert not np.allclose(dx, 0) or isinstance(layer, Embedding), "the test must exercise the input gradient"


def test_first_layer_skips_its_input_gradient() -> None:
    layer = Conv2D("conv", 2, 3)
    params = layer.init((4, 4, 1), np.random.default_rng(0))
    _, cache = layer.forward(params, np.ones((2, 4, 4, 1), np.float32), np.matmul)
    dx, grads = layer.backward(params, cache, np.ones((2, 4, 4, 2), np.float32), np.matmul, input_grad=False)
    assert dx is None and set(grads) == {"kernel", "bias"}


def test_maxpool_sends_a_tie_to_the_first_maximum_like_xla() -> None:
    layer = MaxPool2D("pool")
    x = np.zeros((1, 2, 2, 1), np.float32)
    dy = np.ones((1, 1, 1, 1), np.float32)
    dx, _ = layer.backward({}, layer.forward({}, x, np.matmul)[1], dy, np.matmul)
    _, vjp = jax.vjp(lambda v: apply_layer(layer, {}, "", v), x)
    np.testing.assert_array_equal(dx, vjp(dy)[0])
    assert dx is not None and dx.sum() == 1.0


def test_embedding_rejects_ids_out_of_its_vocabulary() -> None:
    layer = Embedding("embed", 4, 2, 3)
    params = layer.init((3,), np.random.default_rng(0))
    for bad in ([[0.0, 1.0, 4.0]], [[-1.0, 0.0, 1.0]], [[0.5, 1.0, 2.0]]):
        with pytest.raises(ValueError, match="token ids"):
            layer.forward(params, np.asarray(bad, np.float32), np.matmul)


def _batch(spec: ModelSpec, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if spec.objective == "next-token":
        tokens = rng.integers(0, 256, (n, spec.input_shape[0] + 1))
        return tokens[:, :-1].astype(np.float32), tokens[:, 1:].astype(np.int32)
    return rng.random((n, *spec.input_shape), np.float32), rng.integers(0, spec.classes, n).astype(np.int32)


MATMULS: dict[str, Callable[..., Any]] = {"numpy": np.matmul, "blas": fastest_matmul()[0]}
# the built-in models, and one a network config declares: layers chained as no built-in chains them
MODELS = {
    **builtin_models(),
    **read_models(
        tomllib.loads("""
[models.digits-cnn]
input_shape = [64]
layers = [
  { type = "reshape", name = "image", shape = [8, 8, 1] },
  { type = "conv2d", name = "conv0", filters = 4, kernel_size = 3, padding = "valid" },
  { type = "gelu", name = "gelu0" },
  { type = "maxpool2d", name = "pool0", window = 3 },
  { type = "flatten", name = "flatten" },
  { type = "layernorm", name = "norm" },
  { type = "residual", name = "block", layers = [{ type = "dense", name = "fc", units = 16 }, { type = "relu", name = "relu" }] },
  { type = "dense", name = "head", units = 7 },
]
""")["models"]
    ),
}


def _heavy(model: str, matmul: str) -> bool:
    """Parities that take seconds of compute, run in the slow tier: the language model's, and the
    convolutional models' through SciPy's BLAS (their NumPy product runs in the fast tier)."""
    return model == "char-lm" or (matmul == "blas" and "cnn" in model)


@pytest.mark.parametrize(
    ("model", "matmul"),
    [
        pytest.param(model, matmul, marks=[pytest.mark.slow] if _heavy(model, matmul) else [])
        for model in sorted(MODELS)
        for matmul in sorted(MATMULS)
    ],
)
def test_model_loss_and_gradients_match_jax(model: str, matmul: str) -> None:
    spec = MODELS[model]
    learner = spec_learner(spec)
    params = init_params(spec, 3)
    x, y = _batch(spec, 8, 4)
    loss, grads = gradients(spec, params, x, y, MATMULS[matmul])
    jax_loss, jax_grads = jax.value_and_grad(lambda p: learner.loss(learner.apply(p, x), y))(
        learner.from_tensors(params)
    )
    assert LOSS.difference("loss", loss, jax_loss) is None
    assert set(grads) == set(spec.shapes)
    for name, value in learner.to_tensors(jax_grads).items():
        assert grads[name].shape == spec.shapes[name] and grads[name].dtype == np.float32, name
        _close(grads[name], value, GRADIENTS.atol, GRADIENTS.rtol)
        assert np.abs(value).max() > 0, f"{name} must take part in the loss"
    assert spec_differences(learner, params, x, y, MATMULS[matmul]) == []  # what `dtn workload check` runs


@pytest.mark.parametrize("model", sorted(MODELS))
def test_model_forward_and_evaluation_match_jax(model: str) -> None:
    spec = MODELS[model]
    learner = spec_learner(spec)
    params = init_params(spec, 5)
    x, y = _batch(spec, 40, 6)
    _close(forward(spec, params, x), learner.apply(learner.from_tensors(params), x), LOGITS.atol, LOGITS.rtol)
    reference = evaluate(spec, params, x, y, batch_size=16)
    measured = Evaluator(learner, chunk=1000)(learner.from_tensors(params), x, y)
    assert reference.keys() == measured.keys()
    assert ("bits_per_char" in reference) == (spec.objective == "next-token")
    for metric, value in reference.items():
        assert abs(value - measured[metric]) < 1e-5, metric


def test_mlp_init_is_he_normal_drawn_kernel_by_kernel() -> None:
    """The bytes every existing MLP artifact was drawn with: kernels He-normal in order, biases zero."""
    rng = np.random.default_rng(7)
    expected = {
        "dense0.kernel": (rng.standard_normal((784, 128)) * np.sqrt(2.0 / 784)).astype(np.float32),
        "dense0.bias": np.zeros(128, np.float32),
        "dense1.kernel": (rng.standard_normal((128, 10)) * np.sqrt(2.0 / 128)).astype(np.float32),
        "dense1.bias": np.zeros(10, np.float32),
    }
    params = init_params(builtin_model("mnist-mlp"), 7)
    assert list(params) == list(expected) == list(builtin_model("mnist-mlp").shapes)
    for name, value in expected.items():
        assert params[name].tobytes() == value.tobytes(), name


def test_spec_learner_init_is_the_shared_init() -> None:
    spec = builtin_model("mnist-cnn")
    learner = spec_learner(spec)
    first = learner.to_tensors(learner.init(jax.random.PRNGKey(1)))
    again = learner.to_tensors(learner.init(jax.random.PRNGKey(1)))
    other = learner.to_tensors(learner.init(jax.random.PRNGKey(2)))
    spec.check(first)
    assert all(np.array_equal(first[name], again[name]) for name in spec.shapes)
    assert not np.array_equal(first["conv0.kernel"], other["conv0.kernel"])


@pytest.mark.parametrize("model", sorted(MODELS))
def test_model_specs_survive_their_wire_form(model: str) -> None:
    spec = MODELS[model]
    assert ModelSpec.from_wire(json.loads(json.dumps(spec.to_wire()))) == spec


def _wire(**changes: Any) -> dict[str, Any]:
    return {**builtin_model("mnist-cnn").to_wire(), **changes}


def _classifier(*layers: dict[str, Any], input_shape: list[int] | None = None) -> dict[str, Any]:
    return {"name": "m", "input_shape": input_shape or [8], "layers": list(layers), "objective": "classify"}


DENSE = {"type": "dense", "name": "out", "units": 4}
HOSTILE: dict[str, object] = {
    "not an object": [1, 2],
    "unknown layer type": _classifier({"type": "lambda", "name": "x", "code": "import os"}, DENSE),
    "unknown field": _classifier({**DENSE, "activation": "relu"}),
    "units beyond the bound": _classifier({**DENSE, "units": 65537}),
    "units as a boolean": _classifier({**DENSE, "units": True}),
    "units as a string": _classifier({**DENSE, "units": "4"}),
    "too many parameters": _classifier(
        {"type": "dense", "name": "a", "units": 65536}, {"type": "dense", "name": "b", "units": 65536}, DENSE
    ),
    "huge activation": _classifier({"type": "flatten", "name": "f"}, DENSE, input_shape=[65536, 512]),
    "im2col beyond the bound": _classifier(
        {"type": "reshape", "name": "r", "shape": [64, 64, 2]},
        {"type": "conv2d", "name": "c", "filters": 1, "kernel_size": 51},
        {"type": "flatten", "name": "f"},
        DENSE,
        input_shape=[8192],
    ),
    "attention scores beyond the bound": {
        "name": "m",
        "input_shape": [4096],
        "layers": [
            {"type": "embedding", "name": "e", "vocab": 256, "dim": 8, "max_len": 4096},
            {"type": "attention", "name": "a", "heads": 2},
            {"type": "dense", "name": "h", "units": 256},
        ],
        "objective": "next-token",
    },
    "residual in a residual": _classifier(
        {"type": "residual", "name": "a", "layers": [{"type": "residual", "name": "b", "layers": [DENSE]}]}, DENSE
    ),
    "residual that changes the shape": _classifier({"type": "residual", "name": "a", "layers": [DENSE]}, DENSE),
    "layers not a list": _classifier() | {"layers": {"0": DENSE}},
    "no layers": _classifier(),
    "too many layers": _classifier(*[{"type": "relu", "name": f"r{i}"} for i in range(64)], DENSE),
    "a dot in a name": _classifier({**DENSE, "name": "a.b"}),
    "repeated names": _classifier({**DENSE, "name": "x"}, {**DENSE, "name": "x"}),
    "embedding after the first layer": {
        "name": "m",
        "input_shape": [4],
        "layers": [
            {"type": "relu", "name": "r"},
            {"type": "embedding", "name": "e", "vocab": 4, "dim": 2, "max_len": 4},
        ],
        "objective": "next-token",
    },
    "classifier with a sequence output": _classifier({"type": "reshape", "name": "r", "shape": [2, 4]}),
    "unknown objective": _wire(objective="regress"),
    "input of rank 5": _wire(input_shape=[1, 1, 1, 1, 784]),
    "input of size 0": _wire(input_shape=[0]),
    "conv on a flat input": _classifier({"type": "conv2d", "name": "c", "filters": 2, "kernel_size": 3}, DENSE),
    "kernel larger than the image": _classifier(
        {"type": "reshape", "name": "r", "shape": [2, 4, 1]},
        {"type": "conv2d", "name": "c", "filters": 2, "kernel_size": 3, "padding": "valid"},
        {"type": "flatten", "name": "f"},
        DENSE,
    ),
    "unknown padding": _classifier(
        {"type": "reshape", "name": "r", "shape": [2, 4, 1]},
        {"type": "conv2d", "name": "c", "filters": 2, "kernel_size": 1, "padding": "circular"},
    ),
    "heads that do not divide the width": {
        **builtin_model("char-lm").to_wire(),
        "layers": [
            {"type": "embedding", "name": "e", "vocab": 256, "dim": 6, "max_len": 64},
            {"type": "attention", "name": "a", "heads": 4},
            {"type": "dense", "name": "h", "units": 256},
        ],
    },
    "context beyond the embedding": {**builtin_model("char-lm").to_wire(), "input_shape": [65]},
    "eps out of range": _classifier({"type": "layernorm", "name": "n", "eps": 1.0}, DENSE),
    "unknown model field": _wire(code="print(1)"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_model_specs_are_rejected(case: str) -> None:
    with pytest.raises(InvalidMessage):
        ModelSpec.from_wire(HOSTILE[case])


def test_a_small_valid_spec_is_accepted() -> None:
    spec = ModelSpec.from_wire(_classifier({"type": "relu", "name": "r"}, DENSE))
    assert spec == ModelSpec("m", (8,), (ReLU("r"), Dense("out", 4))) and spec.num_params == 36
    assert mlp("m", (8, 4)).shapes == {"dense0.kernel": (8, 4), "dense0.bias": (4,)}
