"""How fast this runtime trains a model: Adam steps on synthetic batches of the model's input, timed.

The same function measures the browser (Pyodide in a worker, ``js_bridge.benchmark``) and native NumPy
(``benchmarks/model_throughput.py``), so the two numbers compare one code path on two runtimes.
"""

from __future__ import annotations

import time

import numpy as np

from protocol.layers import Embedding
from protocol.model import ModelSpec, forward, init_params

from .numpy_trainer import Adam, Backend, gradients

__all__ = ["samples_per_s", "synthetic_batch"]


def synthetic_batch(model: ModelSpec, batch_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random inputs of the model's shape and random labels for its objective."""
    rng = np.random.default_rng(seed)
    params = init_params(model, seed)
    first = model.layers[0]
    if isinstance(first, Embedding):
        x = rng.integers(0, first.vocab, (batch_size, *model.input_shape)).astype(np.float32)
    else:
        x = rng.random((batch_size, *model.input_shape), dtype=np.float32)
    logits = forward(model, params, x[:1])
    labels_shape = (batch_size,) if model.objective == "classify" else (batch_size, *logits.shape[1:-1])
    return x, rng.integers(0, logits.shape[-1], labels_shape).astype(np.int32)


def samples_per_s(model: ModelSpec, batch_size: int, steps: int, backend: Backend) -> float:
    """Examples per second over ``steps`` Adam steps (after one warm-up step)."""
    params, optimizer = init_params(model, 0), Adam(1e-3)
    x, y = synthetic_batch(model, batch_size)
    _, grads = gradients(model, params, x, y, backend.matmul)
    params = optimizer.step(params, grads, backend.adam)
    started = time.perf_counter()
    for _ in range(steps):
        _, grads = gradients(model, params, x, y, backend.matmul)
        params = optimizer.step(params, grads, backend.adam)
    return batch_size * steps / (time.perf_counter() - started)
