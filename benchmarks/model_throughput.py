"""Native baselines per model for the browser benchmark: the browser's NumPy trainer under CPython and
the native JAX trainer (``spec_learner``, jit-compiled epochs), on the same synthetic batches.

Prints one JSON object ``{model: {"numpy": samples/s, "jax": samples/s, "batch_size", "spec"}}`` for each
built-in model (``networks/models.toml``; ``spec``: its wire form as JSON); ``benchmarks/browser.spec.ts``
runs it in the same run as the browser (Pyodide) measurement of each model and prints the ratios.

    python -m benchmarks.model_throughput [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from browser_peer.numpy_trainer import fastest_backend
from browser_peer.throughput import samples_per_s, synthetic_batch
from native_peer.learner import TrainEngine, spec_learner
from native_peer.models import builtin_model
from protocol.manifests import ExperimentSpec

BATCH = {"mnist-mlp": 64, "mnist-cnn": 64, "char-lm": 32}  # the experiments' batch sizes


def jax_samples_per_s(name: str, batch_size: int, steps: int) -> float:
    model = builtin_model(name)
    learner = spec_learner(model)
    spec = ExperimentSpec.from_wire({"key": "b/e/r", "dataset_id": "d", "model": model.to_wire(), "learning_rate": 1e-3,
                                     "batch_size": batch_size, "local_epochs": 1, "shards_per_lease": 1,
                                     "min_candidates": 1, "window_timeout_s": 60.0, "screening": "minimal"})  # fmt: skip
    engine = TrainEngine(learner, learner.make_optimizer(spec))
    x, y = synthetic_batch(model, batch_size)
    xb, yb = np.repeat(x[None], steps, axis=0), np.repeat(y[None], steps, axis=0)
    params = learner.init(jax.random.PRNGKey(0))
    state = engine.init_optimizer(params)
    params, state, _ = engine.train_epoch(params, state, xb, yb)  # compiles
    started = time.perf_counter()
    engine.train_epoch(params, state, xb, yb)
    return batch_size * steps / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    backend = fastest_backend()
    results = {
        name: {
            "numpy": samples_per_s(builtin_model(name), batch, args.steps, backend),
            "jax": jax_samples_per_s(name, batch, args.steps),
            "batch_size": batch,
            "spec": json.dumps(builtin_model(name).to_wire()),
        }
        for name, batch in BATCH.items()
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
