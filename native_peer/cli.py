"""``python -m native_peer``: train, validate, create a network manifest, or run the demo."""

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

from .identity import NodeIdentity
from .mnist import mlp_learner
from .networks import RELEASE, WORKLOAD, demo_network
from .storage import StorageConfig
from .trainer import NodeBuilder
from .validator import Validator

__all__ = ["main"]


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _network(path: Path) -> NetworkManifest:
    return NetworkManifest.from_wire(json.loads(path.read_bytes()))


def cmd_init_network(args: argparse.Namespace) -> None:
    identity = NodeIdentity.load_or_create(StorageConfig(args.validator_storage).identity_path)
    network = demo_network(identity.public_key, args.network_id)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(network.to_wire(), indent=1))
    print(f"wrote {args.out}: validator {identity.peer_id}, experiments {[s.key for s in network.experiments]}")


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


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo

    run_demo(args.out, max_minutes=args.max_minutes, browser=not args.no_browser, target_accuracy=args.target_accuracy)


def cmd_attack_suite(args: argparse.Namespace) -> None:
    from .attacks import ATTACKS, run_suite, scorecard_table, write_scorecard

    scorecard = run_suite(
        args.datasets,
        presets=tuple(args.presets),
        attacks=tuple(args.attacks or ATTACKS),
        windows=args.windows,
        peers=args.peers,
    )
    write_scorecard(args.out, scorecard)
    print(scorecard_table(scorecard))
    print(f"scorecard written to {args.out / 'scorecard.json'} and {args.out / 'scorecard.md'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m native_peer", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    init = sub.add_parser("init-network", help="create a validator identity and the demo network manifest")
    init.add_argument("--validator-storage", type=Path, required=True)
    init.add_argument("--out", type=Path, required=True)
    init.add_argument("--network-id", default="demo")
    init.set_defaults(run=cmd_init_network)

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

    demo = sub.add_parser("demo", help="single-machine mixed-fleet MNIST sanity run")
    demo.add_argument("--out", type=Path, default=Path("var/demo"))
    demo.add_argument("--max-minutes", type=float, default=20.0)
    demo.add_argument("--target-accuracy", type=float, default=0.95)
    demo.add_argument("--no-browser", action="store_true", help="skip the headless-browser trainer")
    demo.set_defaults(run=cmd_demo)

    suite = sub.add_parser("attack-suite", help="score the screening presets against attacks on real MNIST updates")
    suite.add_argument("--out", type=Path, default=Path("var/attack-suite"))
    suite.add_argument("--datasets", type=Path, default=Path("var/datasets"))
    suite.add_argument("--presets", nargs="+", default=["minimal", "balanced", "strict"])
    suite.add_argument("--attacks", nargs="*", default=None, help="default: all")
    suite.add_argument("--windows", type=int, default=4)
    suite.add_argument("--peers", type=int, default=10)
    suite.set_defaults(run=cmd_attack_suite)

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpcore", "jax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args.run(args)
