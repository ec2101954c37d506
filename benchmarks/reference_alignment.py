"""How well the validator's trust anchor still points the way honest trainers go, head by head of a
finished run (``python -m lab workloads``, or any run directory with an edge store and datasets).

At each chosen head of the experiment: ``--honest`` honest-like updates (``--examples`` fresh training
examples each, the experiment's batch size, one window of Adam steps at the head's scheduled rate), the
validator's anchor computed by the validator's own ``native_peer.anchor.Anchor`` (its ``reference``
split, ``REFERENCE_BATCH_FACTOR`` × the batch, as many steps as the honest updates), and, as the baseline of
the same run, the same procedure on fresh training examples the head never saw. Prints the mean cosine
of the honest updates to one another and to each, and their norms (the anchored screen bounds an
update's norm by a multiple of the anchor's). An anchor that falls towards or below zero while the
baseline stays with the honest updates no longer measures direction, and one whose norm falls below
theirs no longer measures size: its examples have been fitted by the heads (as when the validator's
own updates took part in every anchored merge; they no longer do).

First, from the run's own signed verdicts, per ten windows: the mean (min, max) cosine of the
candidates to the reference the validator used, and how much each screened-in candidate alone moved
the validator's holdout accuracy from its base head's.

    python -m benchmarks.reference_alignment [--run var/workloads] [--experiment study/mnist-cnn/rev-1]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np

from datasets.layout import load_split, load_train
from native_peer.anchor import Anchor
from native_peer.learner import TrainEngine
from native_peer.workloads import network_learners
from protocol.aggregation import flatten
from protocol.codec import decode_tensors
from protocol.ids import ContentId, ExperimentKey
from protocol.judging import REFERENCE_BATCH_FACTOR
from protocol.manifests import NetworkManifest
from protocol.messages import HeadDescriptor
from server.blobs import BlobStore
from server.store import Store


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _update(engine: TrainEngine, tensors: dict[str, np.ndarray], rate: float, x: Any, y: Any) -> np.ndarray:
    """θ − base after one window of Adam steps from a fresh state on batches ``x``, ``y``, as the
    validator trains its own (``TrainEngine.fresh_window``)."""
    model = engine.learner.model
    return flatten(model, engine.fresh_window(tensors, x, y, rate)) - flatten(model, tensors)


def _verdicts_by_decade(store: Store, key: ExperimentKey, heads: dict[str, HeadDescriptor]) -> None:
    """The run's verdicts per ten windows of their base head: cosines to the validator's reference and
    the holdout accuracy of each measured candidate alone minus its base head's."""
    cosines: dict[int, list[float]] = {}
    gains: dict[int, list[float]] = {}
    for _, verdict, _ in store.verdicts_after(key, 0, limit=10**6):
        base = heads.get(verdict.base_head)
        if base is None:
            continue
        decade = base.window // 10 * 10
        if "reference_cosine" in verdict.metrics:
            cosines.setdefault(decade, []).append(verdict.metrics["reference_cosine"])
        if "val_accuracy" in verdict.metrics:
            gains.setdefault(decade, []).append(verdict.metrics["val_accuracy"] - base.metrics["val_accuracy"])
    print("windows  cos to reference: mean (min, max)  candidate alone - base, holdout accuracy: mean (min, max)")
    for decade in sorted(cosines):
        c, g = np.array(cosines[decade]), np.array(gains.get(decade, [np.nan]))
        print(
            f"{decade:3d}-{decade + 9:<3d}  {c.mean():+.3f} ({c.min():+.3f}, {c.max():+.3f})"
            f"{'':13s}{g.mean():+.4f} ({g.min():+.4f}, {g.max():+.4f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, default=Path("var/workloads"))
    parser.add_argument("--experiment", default="study/mnist-cnn/rev-1")
    parser.add_argument("--heads", type=int, default=4, help="heads to look at, spread over the run")
    parser.add_argument("--honest", type=int, default=3)
    parser.add_argument("--examples", type=int, default=4000, help="training examples per honest update")
    args = parser.parse_args()

    network = NetworkManifest.from_wire(json.loads((args.run / "network.json").read_bytes()))
    spec = network.experiment(ExperimentKey.parse(args.experiment))
    learner = network_learners(network)[spec.model.name]
    engine = TrainEngine(learner, learner.make_optimizer(spec))
    dataset = args.run / "datasets" / spec.dataset_id
    train_x, train_y = load_train(dataset)
    ref_x, ref_y = load_split(dataset, "reference")
    store, blobs = Store(args.run / "edge" / "edge.sqlite3"), BlobStore(args.run / "edge" / "blobs")
    heads = store.heads(spec.key)
    _verdicts_by_decade(store, spec.key, {h.head_id: h for h in heads})
    steps = args.examples // spec.batch_size
    anchor = Anchor(engine, ref_x, ref_y, steps, REFERENCE_BATCH_FACTOR * spec.batch_size)
    rng = np.random.default_rng(0)
    print(f"{spec.key}: {len(heads)} heads; {steps} Adam steps per update, batch {spec.batch_size}")
    print("window  rate     cosines: honest-honest  to the anchor  to the baseline   norms: honest  anchor  baseline")
    for head in [heads[i] for i in np.linspace(1, len(heads) - 1, args.heads).astype(int)]:
        tensors, _ = decode_tensors(blobs.path(ContentId(head.head_id)).read_bytes())
        rate = spec.learning_rate_at(head.window)
        honest = []
        for _ in range(args.honest):
            index = rng.choice(len(train_x), (steps, spec.batch_size), replace=False)
            honest.append(_update(engine, tensors, rate, train_x[index], train_y[index]))
        delta = anchor.prepare(head.head_id, lambda: tensors, rate)  # noqa: B023 - called here, not kept
        reference = flatten(engine.learner.model, delta)
        index = rng.choice(len(train_x), (steps, REFERENCE_BATCH_FACTOR * spec.batch_size), replace=False)
        baseline = _update(engine, tensors, rate, train_x[index], train_y[index])
        among = np.mean([_cosine(a, b) for a, b in itertools.combinations(honest, 2)])
        to_ref = np.mean([_cosine(u, reference) for u in honest])
        to_base = np.mean([_cosine(u, baseline) for u in honest])
        norm = float(np.mean([np.linalg.norm(u) for u in honest]))
        print(
            f"{head.window:6d}  {rate:.1e}  {among:+22.3f}  {to_ref:+13.3f}  {to_base:+15.3f}"
            f"  {norm:13.3f}  {np.linalg.norm(reference):6.3f}  {np.linalg.norm(baseline):8.3f}",
            flush=True,
        )
    store.close()


if __name__ == "__main__":
    main()
