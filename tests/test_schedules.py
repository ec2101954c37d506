"""The inner learning-rate schedule: one pure function of the head's window (``ExperimentSpec``), which
native trainers (optax state), validators' reference updates and browser peers (NumPy Adam) follow."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from native_peer.learner import (
    SCAN_LENGTHS,
    BatchLoader,
    TrainEngine,
    adam,
    at_learning_rate,
    scan_lengths,
    spec_learner,
)
from native_peer.models import builtin_model
from protocol.errors import InvalidMessage
from protocol.manifests import ExperimentSpec
from protocol.shards import PIXEL_SCALE, decode_shard_stored

from .support import experiment_spec


def test_a_cosine_schedule_falls_from_the_rate_to_its_floor_and_stays_there() -> None:
    spec = replace(experiment_spec(), learning_rate=1e-3, lr_schedule="cosine", lr_decay_windows=10, lr_min_factor=0.1)
    rates = [spec.learning_rate_at(w) for w in range(14)]
    assert rates[0] == pytest.approx(1e-3) and rates[5] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert rates[10] == rates[13] == pytest.approx(1e-4)
    assert all(a > b for a, b in itertools.pairwise(rates[:11]))  # falling, window by window
    assert rates[3] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.3))))
    constant = experiment_spec()
    assert {constant.learning_rate_at(w) for w in (0, 7, 1000)} == {constant.learning_rate}


def test_schedules_travel_on_the_wire_and_bad_ones_are_refused() -> None:
    spec = replace(experiment_spec(), lr_schedule="cosine", lr_decay_windows=40, lr_min_factor=0.05)
    assert ExperimentSpec.from_wire(spec.to_wire()) == spec
    old = {k: v for k, v in experiment_spec().to_wire().items() if not k.startswith("lr_")}
    assert ExperimentSpec.from_wire(old).lr_schedule == "constant"  # a manifest from before schedules
    for bad in ({"lr_schedule": "step"}, {"lr_schedule": "cosine", "lr_decay_windows": 0}, {"lr_min_factor": 1.5}):
        with pytest.raises(InvalidMessage):
            ExperimentSpec.from_wire({**spec.to_wire(), **bad})


def test_the_default_native_optimizer_follows_the_schedule_and_is_adam_at_that_rate() -> None:
    model = builtin_model("mnist-mlp")
    spec = replace(experiment_spec(), learning_rate=1e-3)
    learner = spec_learner(model)
    params = learner.init(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    xb = rng.random((2, 16, 784), dtype=np.float32)
    yb = rng.integers(0, 10, (2, 16)).astype(np.int32)
    scheduled = TrainEngine(learner, adam(spec))
    state = at_learning_rate(scheduled.init_optimizer(params), 2.5e-4)
    ours, _, _ = scheduled.train_epoch(params, state, xb, yb)
    plain = TrainEngine(learner, optax.adam(2.5e-4))
    theirs, _, _ = plain.train_epoch(params, plain.init_optimizer(params), xb, yb)
    for name in ours:
        np.testing.assert_allclose(np.asarray(ours[name]), np.asarray(theirs[name]), rtol=1e-5, atol=1e-7)  # float32
    custom = optax.sgd(0.1).init(params)  # a user's own optax chain keeps its own schedule
    assert at_learning_rate(custom, 1.0) is custom


def test_an_epoch_runs_in_three_compiled_lengths_and_trains_as_one_scan() -> None:
    """Leases of any size cost three compiled scan lengths, and the runs give the bytes one scan over
    every step gives (validators of a quorum must agree on their reference update)."""
    assert scan_lengths(77) == [32, 32, 8, 1, 1, 1, 1, 1] and scan_lengths(64) == [32, 32] and scan_lengths(0) == []
    assert {n for steps in range(1, 500) for n in scan_lengths(steps)} == {32, 8, 1}
    assert all(sum(scan_lengths(steps)) == steps for steps in range(500))
    learner = spec_learner(builtin_model("mnist-mlp"))
    engine = TrainEngine(learner, adam(experiment_spec()))
    params = learner.init(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    xb, yb = rng.random((37, 8, 784), dtype=np.float32), rng.integers(0, 10, (37, 8)).astype(np.int32)
    runs, _, loss = engine.train_epoch(params, engine.init_optimizer(params), xb, yb)
    whole, _, whole_loss = engine._epoch(params, engine.init_optimizer(params), xb, yb)
    assert all(np.array_equal(np.asarray(runs[k]), np.asarray(whole[k])) for k in runs)
    assert loss == pytest.approx(float(whole_loss), rel=1e-6)


def test_a_warmed_engine_trains_a_leases_stored_examples_without_compiling_again(dataset_root: Path) -> None:
    """A trainer warms its engine before it leases (``TrainEngine.warm``): its first window, on a real
    shard's uint8 examples from a head's tensors at a later window's rate, then runs the programs compiled."""
    spec = experiment_spec()
    learner = spec_learner(builtin_model("mnist-mlp"))
    engine = TrainEngine(learner, adam(spec), feature_scale=PIXEL_SCALE)
    head = learner.to_tensors(learner.init(jax.random.PRNGKey(0)))  # a head's tensors, as a trainer gets them
    engine.warm(learner.from_tensors(head), spec.batch_size, spec.learning_rate_at(0))
    assert engine._epoch._cache_size() == len(SCAN_LENGTHS)
    shards = [dataset_root / f"mnist/train/shards/train-0000{i}.safetensors" for i in range(3)]  # a 3-shard lease
    x, y = (
        np.concatenate(arrays)
        for arrays in zip(*(decode_shard_stored(p.read_bytes())[:2] for p in shards), strict=True)
    )
    xb, yb = BatchLoader(spec.batch_size).batches(x, y, 7)
    assert len(xb) % 8 and len(xb) > 32  # every scan length runs
    params = learner.from_tensors(head)
    engine.train_epoch(params, at_learning_rate(engine.init_optimizer(params), 3e-4), xb, yb)
    assert engine._epoch._cache_size() == len(SCAN_LENGTHS)
