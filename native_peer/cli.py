"""``python -m native_peer`` (also ``dtn``): run a native trainer or a validator."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
from pathlib import Path

from protocol.ids import ExperimentKey
from protocol.manifests import NetworkManifest

from .mnist import RELEASE, WORKLOAD, mlp_learner
from .storage import StorageConfig
from .trainer import NodeBuilder
from .validator import Validator

__all__ = ["configure_logging", "main"]


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _network(path: Path) -> NetworkManifest:
    return NetworkManifest.from_wire(json.loads(path.read_bytes()))


def cmd_train(args: argparse.Namespace) -> None:
    network = _network(args.network)
    builder = (
        NodeBuilder(mlp_learner())
        .trainer(RELEASE, WORKLOAD)
        .with_network(network)
        .with_storage(StorageConfig(args.storage))
        .with_bootstrap_peer(args.edge)
    )
    trainer = (builder.with_admission_token(args.token) if args.token else builder).spawn()
    keys = [ExperimentKey.parse(k) for k in args.experiment] or [s.key for s in network.experiments]
    experiments = [trainer.experiment(*key.parts) for key in keys]
    try:
        outcomes = trainer.run(experiments, max_windows=args.windows, stop=_stop_on_signals())
    finally:
        trainer.close()
    for outcome in outcomes[-3:]:
        print(f"{outcome.experiment} window {outcome.window}: published {outcome.head_id}")


def cmd_validate(args: argparse.Namespace) -> None:
    network = _network(args.network)
    validator = Validator(
        mlp_learner(), network, StorageConfig(args.storage), args.edge, args.datasets, admission_token=args.token
    )
    try:
        validator.run(network.experiments, _stop_on_signals())
    finally:
        validator.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m native_peer", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="run a native JAX trainer")
    train.add_argument("--edge", required=True, help="bootstrap edge URL")
    train.add_argument("--network", type=Path, required=True, help="network manifest JSON")
    train.add_argument("--storage", type=Path, required=True, help="this node's storage directory")
    train.add_argument("--experiment", action="append", default=[], help="study/experiment/revision (repeatable)")
    train.add_argument("--windows", type=int, default=None, help="stop after this many windows")
    train.add_argument("--token", default=os.environ.get("DTN_TOKEN"), help="admission token (env DTN_TOKEN)")
    train.set_defaults(run=cmd_train)

    validate = sub.add_parser("validate", help="run a validator / authority node")
    validate.add_argument("--edge", required=True)
    validate.add_argument("--network", type=Path, required=True)
    validate.add_argument("--storage", type=Path, required=True)
    validate.add_argument("--datasets", type=Path, required=True, help="prepared datasets (validation split)")
    validate.add_argument("--token", default=os.environ.get("DTN_TOKEN"), help="admission token (env DTN_TOKEN)")
    validate.set_defaults(run=cmd_validate)

    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    args.run(args)


def configure_logging(verbose: bool) -> None:
    """Logging for a node's process, configured once at its entry point (HTTP and JAX chatter quiet)."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpcore", "jax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
