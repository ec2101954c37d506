"""NumPy (browser) and JAX (native) trainers agree from the same head, batch and steps.

Tolerance: after 1 Adam step parameters agree to 2e-6 absolute; after 20 steps to 2e-4 absolute
(float32 summation order differs between XLA and NumPy; Adam divides by sqrt(v) which amplifies
differences in tiny gradients, so the bound grows with steps: a parameter whose gradient stays near
Adam's eps can move by up to the learning rate per step on a rounding difference).
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from browser_peer.numpy_trainer import Adam, gradients, train_epoch
from datasets.layout import load_split
from native_peer.learner import BatchLoader, TrainEngine
from native_peer.mnist import mlp_learner
from native_peer.models import builtin_model

SPEC = builtin_model("mnist-mlp")


@pytest.fixture(scope="module")
def batches(dataset_root: Path) -> tuple[np.ndarray, np.ndarray]:
    # the public validation split: the same examples in every preparation (train shards are drawn anew)
    x, y = load_split(dataset_root / "mnist", "validation")
    return BatchLoader(64).batches(x[:1000], y[:1000], seed=3)


def _head() -> dict[str, np.ndarray]:
    learner = mlp_learner()
    return learner.to_tensors(learner.init(jax.random.PRNGKey(11)))


@pytest.mark.parametrize(("steps", "atol"), [(1, 2e-6), (20, 2e-4)])
def test_numpy_and_jax_adam_agree(batches: tuple[np.ndarray, np.ndarray], steps: int, atol: float) -> None:
    xb, yb = batches[0][:steps], batches[1][:steps]
    learner = mlp_learner()
    engine = TrainEngine(learner, optax.adam(1e-3))
    head = _head()
    params = learner.from_tensors(head)
    jax_params, _, jax_loss = engine.train_epoch(params, engine.init_optimizer(params), xb, yb)
    np_params, np_loss = train_epoch(SPEC, dict(head), Adam(1e-3), xb, yb)
    jax_tensors = learner.to_tensors(jax_params)
    assert abs(jax_loss - np_loss) < 1e-5
    for name in SPEC.shapes:
        np.testing.assert_allclose(np_params[name], jax_tensors[name], atol=atol, rtol=0)
        assert not np.array_equal(np_params[name], head[name]), "the step must change every parameter"


def test_numpy_gradients_match_jax_autodiff(batches: tuple[np.ndarray, np.ndarray]) -> None:
    learner = mlp_learner()
    head = _head()
    x, y = batches[0][0], batches[1][0]
    loss, grads = gradients(SPEC, head, x, y)
    jax_loss, jax_grads = jax.value_and_grad(lambda p: learner.loss(learner.apply(p, x), y))(learner.from_tensors(head))
    assert abs(float(jax_loss) - loss) < 1e-5
    for name, value in learner.to_tensors(jax_grads).items():
        np.testing.assert_allclose(grads[name], value, atol=1e-6, rtol=1e-4)


def test_blas_matmul_path_matches_numpy(batches: tuple[np.ndarray, np.ndarray]) -> None:
    from browser_peer.numpy_trainer import fastest_matmul

    matmul, backend = fastest_matmul()
    assert backend == "blas"  # scipy is installed natively (a JAX dependency)
    head = _head()
    x, y = batches[0][0], batches[1][0]
    loss, grads = gradients(SPEC, head, x, y)
    blas_loss, blas_grads = gradients(SPEC, head, x, y, matmul)
    assert abs(loss - blas_loss) < 1e-6
    for name, value in grads.items():
        np.testing.assert_allclose(blas_grads[name], value, atol=1e-6, rtol=1e-5)
        assert blas_grads[name].flags.c_contiguous or blas_grads[name].ndim == 1


def test_numpy_reference_evaluation_matches_jax(dataset_root: Path) -> None:
    from datasets.layout import load_split
    from native_peer.learner import Evaluator
    from protocol.model import evaluate

    learner = mlp_learner()
    head = _head()
    x, y = load_split(dataset_root / "mnist", "validation")
    reference = evaluate(SPEC, head, x, y)
    measured = Evaluator(learner)(learner.from_tensors(head), x, y)
    assert abs(reference["loss"] - measured["loss"]) < 1e-5
    assert reference["accuracy"] == measured["accuracy"]
