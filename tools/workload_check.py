"""``dtn workload check``: what a network relies on of a model, checked on one machine before it trains.

    dtn workload check mypkg.models:learner              # a workload, by import path
    dtn workload check --config network.toml [--experiment KEY]   # a config's experiment: spec or workload

``check_learner`` runs each check on a learner (a workload's, ``native_peer.workloads``, or a spec
model's, ``spec_learner``) with examples drawn here as a lease's are stored (uint8 pixels or token ids):

- ``wire mapping``: the parameters go to the wire under the model's names and shapes, float32, and come
  back from it as the same pytree, bit for bit;
- ``determinism``: the same head and the same lease's batches give the same update bit for bit, twice
  (two engines, each compiled anew: what a trainer and a validator each compute);
- ``evaluation``: a validator's evaluation (``Evaluator``) of the head and of the update is finite;
- ``browser parity`` (spec models only): the browser's NumPy twin agrees with JAX within the tolerances
  of ``tools.parity``, with every matrix product the browser may use.

A check that fails says so in ``Outcome.problem``, one line naming what differed; an exception the
model's code raises fails its check the same way. ``main`` prints a line per check and exits 1 when
one failed, 2 (one line on stderr) on a model it cannot build.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from browser_peer.numpy_trainer import fastest_matmul
from native_peer.learner import BatchLoader, Evaluator, JaxLearner, TrainEngine
from native_peer.workloads import WorkloadError, describe, load, model_learner, one_line
from protocol.errors import InvalidMessage, ProtocolError
from protocol.ids import DatasetId, ExperimentKey
from protocol.manifests import ExperimentSpec
from protocol.model import ModelSpec
from protocol.shards import PIXEL_SCALE

from .networks import NetworkConfigError, read_experiments
from .parity import spec_differences

__all__ = ["Outcome", "check_learner", "lease_examples", "main"]

Tensors = dict[str, np.ndarray]


@dataclass(frozen=True)
class Outcome:
    """One check: its name, what it did, and ``problem`` (``None`` when it passed)."""

    check: str
    detail: str
    problem: str | None = None


def lease_examples(spec: ExperimentSpec, examples: int, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """``examples`` random examples for ``spec``'s model as a shard stores them (uint8 features and
    labels; a next-token model's labels are its inputs shifted by one) and the features' scale."""
    model, rng = spec.model, np.random.default_rng(seed)
    vocab = min(model.classes, 256)
    if model.objective == "next-token":
        tokens = rng.integers(0, vocab, (examples, model.input_shape[0] + 1), dtype=np.uint8)
        return tokens[:, :-1], tokens[:, 1:], 1.0
    features = rng.integers(0, vocab if model.reads_tokens else 256, (examples, *model.input_shape), dtype=np.uint8)
    labels = rng.integers(0, model.classes, examples).astype(np.uint8)
    return features, labels, 1.0 if model.reads_tokens else PIXEL_SCALE


def check_learner(learner: JaxLearner, spec: ExperimentSpec, *, steps: int = 4, seed: int = 0) -> list[Outcome]:
    """Every check of ``learner`` as ``spec``'s model, trained ``steps`` batches of ``spec.batch_size``."""
    x, y, scale = lease_examples(spec, steps * spec.batch_size, seed)
    xb, yb = BatchLoader(spec.batch_size).batches(x, y, seed)
    head = jax.random.PRNGKey(seed)
    checks: list[tuple[str, Callable[[], tuple[str, str | None]]]] = [
        ("wire mapping", lambda: _wire(learner, head)),
        ("determinism", lambda: _determinism(learner, spec, head, xb, yb, scale)),
        ("evaluation", lambda: _evaluation(learner, spec, head, xb, yb, scale)),
    ]
    if isinstance(learner.model, ModelSpec):
        checks.append(("browser parity", lambda: _parity(learner, spec, head, xb, yb, scale)))
    outcomes = []
    for name, check in checks:
        try:
            detail, problem = check()
        except Exception as exc:  # the model's own code: whatever it raises fails this check, in one line
            detail, problem = "", f"raised {one_line(exc)}"
        outcomes.append(Outcome(name, detail, problem))
    return outcomes


def _first_difference(first: Tensors, second: Tensors, what: str) -> str | None:
    for name in first:
        if first[name].tobytes() != second[name].tobytes():
            gap = np.nanmax(np.abs(first[name].astype(np.float64) - second[name].astype(np.float64)), initial=0.0)
            return f"{name} differs between {what} (max |difference| {gap:.3g})"
    return None


def _wire(learner: JaxLearner, key: jax.Array) -> tuple[str, str | None]:
    params = learner.init(key)
    tensors = learner.to_tensors(params)
    try:
        learner.model.check(tensors)
    except InvalidMessage as exc:
        return "", f"to the wire: {exc}"
    back = learner.from_tensors(tensors)
    if jax.tree_util.tree_structure(back) != jax.tree_util.tree_structure(params):
        return "", "from the wire: the pytree's structure is not the model's"
    for (path, sent), came in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves(back), strict=True
    ):
        sent, came = np.asarray(sent), np.asarray(came)
        if sent.dtype != came.dtype or sent.tobytes() != came.tobytes():
            where = jax.tree_util.keystr(path, simple=True, separator=".")
            return "", f"from the wire: leaf {where} is not the one sent ({came.dtype}, was {sent.dtype})"
    again = _first_difference(tensors, learner.to_tensors(back), "the wire and a round trip through the pytree")
    detail = f"{len(tensors)} tensors as {', '.join(list(tensors)[:4])}{', …' if len(tensors) > 4 else ''}"
    return detail, again


def _determinism(
    learner: JaxLearner, spec: ExperimentSpec, key: jax.Array, xb: np.ndarray, yb: np.ndarray, scale: float
) -> tuple[str, str | None]:
    head = learner.to_tensors(learner.init(key))
    rate = spec.learning_rate_at(1)
    first, second = (
        TrainEngine(learner, learner.make_optimizer(spec), feature_scale=scale).fresh_window(head, xb, yb, rate)
        for _ in range(2)
    )
    detail = f"{len(xb)} steps of {xb.shape[1]} examples from one head, twice"
    if _first_difference(head, first, "the head and its update") is None:
        return detail, "the update is the head itself: training changed no parameter"
    return detail, _first_difference(first, second, "two updates from the same head and batches")


def _evaluation(
    learner: JaxLearner, spec: ExperimentSpec, key: jax.Array, xb: np.ndarray, yb: np.ndarray, scale: float
) -> tuple[str, str | None]:
    params = learner.init(key)
    x, y = xb.reshape(-1, *xb.shape[2:]).astype(np.float32) * np.float32(scale), yb.reshape(-1, *yb.shape[2:])
    engine = TrainEngine(learner, learner.make_optimizer(spec), feature_scale=scale)
    trained = learner.from_tensors(engine.fresh_window(learner.to_tensors(params), xb, yb, spec.learning_rate_at(1)))
    evaluate = Evaluator(learner)
    measured = {"head": evaluate(params, x, y), "update": evaluate(trained, x, y)}
    for which, metrics in measured.items():
        if not (np.isfinite(metrics["loss"]) and 0.0 <= metrics["accuracy"] <= 1.0):
            return "", f"the {which}'s loss {metrics['loss']} or accuracy {metrics['accuracy']} is not a finite measure"
    losses = evaluate.losses(params, x, y)  # each example's, as lease evidence compares them
    if losses.shape != (len(x),) or not np.isfinite(losses).all():
        return (
            "",
            f"the head's per-example losses are {losses.shape} with {int((~np.isfinite(losses)).sum())} not finite",
        )
    head, update = measured["head"], measured["update"]
    return (
        f"loss {head['loss']:.4f} -> {update['loss']:.4f}, accuracy {head['accuracy']:.3f} -> {update['accuracy']:.3f}",
        None,
    )


def _parity(
    learner: JaxLearner, spec: ExperimentSpec, key: jax.Array, xb: np.ndarray, yb: np.ndarray, scale: float
) -> tuple[str, str | None]:
    params = learner.to_tensors(learner.init(key))
    features = xb.astype(np.float32) * np.float32(scale)
    matmuls = {"numpy": np.matmul}
    matmul, backend = fastest_matmul()
    matmuls[backend] = matmul
    for backend, product in matmuls.items():
        found = spec_differences(learner, params, features[0], yb[0].astype(np.int32), product)
        if found:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            return "", f"with {backend} products: {found[0]}{more}"
    return f"logits, loss and gradients agree with {' and '.join(matmuls)} products", None


def _checked_learner(args: argparse.Namespace) -> tuple[ExperimentSpec, JaxLearner]:
    """The experiment and learner ``dtn workload check`` checks: a config's experiment, or a workload's
    import path as a default experiment of ``--batch-size`` at ``--learning-rate``."""
    if args.config is not None:
        try:
            experiments = read_experiments(args.config)
        except NetworkConfigError as exc:
            raise WorkloadError(str(exc)) from None
        keys = [str(spec.key) for spec in experiments]
        if args.experiment is None and len(keys) > 1:
            raise WorkloadError(f"{args.config} has experiments {keys}: pass --experiment")
        chosen = [spec for spec in experiments if args.experiment in (None, str(spec.key))]
        if not chosen:
            raise WorkloadError(f"{args.config} has no experiment {args.experiment}; experiments: {keys}")
        return chosen[0], model_learner(chosen[0].model)
    if args.target is None:
        raise WorkloadError("name a workload by import path (module:attribute) or pass --config")
    model = describe(args.target, args.name)
    spec = ExperimentSpec(
        key=ExperimentKey.parse("check/workload/rev-1"),
        dataset_id=DatasetId("check"),
        model=model,
        learning_rate=args.learning_rate,
        batch_size=args.batch_size,
        local_epochs=1,
        shards_per_lease=1,
    )
    return spec, load(model)


def _run(args: argparse.Namespace) -> None:
    try:
        spec, learner = _checked_learner(args)
    except (WorkloadError, ProtocolError) as exc:
        print(f"dtn workload check: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    outcomes = check_learner(learner, spec, steps=args.steps, seed=args.seed)
    for outcome in outcomes:
        status, said = ("ok", outcome.detail) if outcome.problem is None else ("FAIL", outcome.problem)
        print(f"{status:<4}  {outcome.check}: {said}")
    failed = [outcome.check for outcome in outcomes if outcome.problem is not None]
    if failed:
        print(f"{spec.model.name}: {len(failed)} of {len(outcomes)} checks failed: {', '.join(failed)}")
        raise SystemExit(1)
    print(f"{spec.model.name}: every check passed ({len(outcomes)})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="dtn workload", description=__doc__)
    workload = parser.add_subparsers(dest="action", required=True)
    check_model = workload.add_parser(
        "check",
        help="check the wire mapping, determinism, evaluation and (spec models) browser parity",
    )
    check_model.add_argument("target", nargs="?", default=None, help="a workload's import path, module:attribute")
    check_model.add_argument("--config", type=Path, default=None, help="a network config (TOML): check its experiment")
    check_model.add_argument("--experiment", default=None, help="--config: the experiment, when it has several")
    check_model.add_argument("--name", default="workload", help="import path: the model's name")
    check_model.add_argument("--batch-size", type=int, default=16, help="import path: examples per batch")
    check_model.add_argument("--learning-rate", type=float, default=1e-3, help="import path: the experiment's rate")
    check_model.add_argument("--steps", type=int, default=4, help="batches trained from the head")
    check_model.add_argument("--seed", type=int, default=0, help="draws the head and the examples")
    _run(parser.parse_args(argv))
