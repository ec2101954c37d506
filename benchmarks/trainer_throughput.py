"""Trainer benchmark: samples/s of a native trainer inside the network vs. a plain optax loop.

Both train the MNIST MLP with Adam on the same leased examples (4 shards, batch 64) in this
process. The plain loop is the textbook ``jax.jit`` step called per batch; the trainer runs whole
windows through a real edge and validator (lease, verified downloads, ``lax.scan`` epoch, signing,
upload). Reported: the trainer's training-phase rate, its end-to-end window rate, and each as a
ratio to the plain loop.

    python -m benchmarks.trainer_throughput [--windows 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import optax

from lab.stack import prepare_network
from native_peer import Project, StorageConfig
from native_peer.mnist import RELEASE, WORKLOAD, mlp_learner
from protocol.batches import make_batches
from protocol.shards import decode_shard
from server.serve import BackgroundEdge

from . import BENCH_EXPERIMENT, bench_network


def plain_optax_rate(x: np.ndarray, y: np.ndarray, repeats: int) -> float:
    learner = mlp_learner()
    params = learner.init(jax.random.PRNGKey(0))
    optimizer = optax.adam(1e-3)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, xb, yb):  # type: ignore[no-untyped-def]
        loss, grads = jax.value_and_grad(lambda p: learner.loss(learner.apply(p, xb), yb))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    xb, yb = make_batches(x, y, 64, 0)
    params, opt_state, loss = step(params, opt_state, xb[0], yb[0])  # compile
    loss.block_until_ready()
    started = time.perf_counter()
    for _ in range(repeats):
        for i in range(len(xb)):
            params, opt_state, loss = step(params, opt_state, xb[i], yb[i])
    loss.block_until_ready()
    return repeats * xb.shape[0] * xb.shape[1] / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=8)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dtn-bench-"))
    local = prepare_network(root, network=lambda key: bench_network(key, 4))
    network, datasets = local.network, local.datasets
    with BackgroundEdge(local.edge_settings()) as edge:
        validator = local.validator(edge.url)
        spec = network.experiment(BENCH_EXPERIMENT)
        validator.ensure_genesis(spec)
        trainer = (
            Project(mlp_learner()).trainer(RELEASE, WORKLOAD).with_network(network)
            .with_storage(StorageConfig(root / "trainer")).with_bootstrap_peer(edge.url).spawn()
        )  # fmt: skip
        experiment = trainer.experiment(*BENCH_EXPERIMENT.parts)
        outcomes = []
        for _ in range(args.windows + 1):  # the first window includes compilation; dropped below
            outcomes.append(trainer.train_window_once(experiment))
            validator.poll(spec)
        trainer.close()
        validator.close()
        measured = outcomes[1:]
        train_rate = statistics.median(o.samples_per_s for o in measured)
        window_rate = statistics.median(o.examples / o.seconds for o in measured)
        parts = [
            decode_shard((datasets / "mnist/train/shards" / f"{s}.safetensors").read_bytes())
            for s in outcomes[-1].shard_ids
        ]
        x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        baseline = plain_optax_rate(x, y, repeats=args.windows)
    print(f"{len(measured)} windows of {measured[0].examples} examples (batch 64, Adam), MNIST MLP, CPU")
    print(f"  plain optax loop (jit step per batch):    {baseline:10,.0f} samples/s")
    print(
        f"  trainer, training phase (lax.scan epoch): {train_rate:10,.0f} samples/s  ratio {train_rate / baseline:.2f}"
    )
    print(
        f"  trainer, whole window (lease, fetch, train, sign, upload): {window_rate:,.0f} samples/s  ratio {window_rate / baseline:.2f}"
    )
    print(json.dumps({"plain": baseline, "train_phase": train_rate, "window": window_rate}))


if __name__ == "__main__":
    main()
