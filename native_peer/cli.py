"""``python -m native_peer`` (also ``dtn``): run a native trainer or a validator.

Joining a network from another machine needs only the edge's URL and a validator's key (or its
fingerprint, as ``dtn keys`` prints it) from the network's operator:

    dtn train --edge https://host --validator-key <key or fingerprint>

``--edge`` may be given more than once (or as a comma-separated list): edges of one network, one
following another (``server.follower``); the trainer or validator moves to the next when one is
unreachable (``EdgeClient``).

The trainer fetches the network manifest from the edge (``/v1/network``) and trains only if the
pinned validators are in it and every quorum of its validators includes one of them (so a head can
never be canonical without a pinned validator's signature): an edge cannot swap in validators of
its own. ``--network FILE`` uses a manifest handed over by other means instead (checked against the
pins when both are given).

``dtn dataset shard`` turns a user's own data (an ``.npz`` file, a folder of images with one subfolder
per class, or text files) into a prepared dataset an edge serves and validators judge on
(``datasets.sources``, ``datasets.sharding``); ``dtn dataset check`` verifies one:

    dtn dataset shard --from images ./photos --out var/datasets --dataset-id photos
    dtn dataset check var/datasets/photos

``dtn export`` writes an experiment's best head that the network's quorum vouches for, checked as a
trainer checks heads, as safetensors plus its model config (``native_peer.export``):

    dtn export --experiment study/exp/rev-1 --edge https://host --validator-key <fingerprint> --out ckpt

``dtn control new | sign | submit | show`` issues run-control orders a quorum of validators signs
(``native_peer.control_cli``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, nullcontext
from pathlib import Path
from urllib.parse import urlsplit

from datasets.layout import HELD_OUT_SPLITS, PreparedDataset, check_dataset
from datasets.sharding import DEFAULT_FRACTIONS, ShardingError, shard
from datasets.sources import read_images, read_npz, read_text
from protocol.codec import decode_tensors
from protocol.edge_urls import edge_urls
from protocol.errors import ProtocolError
from protocol.ids import ContentId, DatasetId, ExperimentKey
from protocol.lineage import read_archive
from protocol.manifests import NetworkManifest, SupportedWorkload
from protocol.messages import HeadDescriptor
from protocol.network_pins import NetworkSignature, fingerprint, pin_problem, signed_by
from protocol.network_revisions import head_network
from protocol.signing import b64encode, use_verifier

from .compile_cache import use_compile_cache
from .control_cli import add_control_parser
from .edge_client import EdgeClient, EdgeRequestError
from .export import ExportError, best_head, write_checkpoint
from .identity import NodeIdentity
from .mnist import RELEASE
from .network_chain import NetworkChain
from .storage import StorageConfig
from .trainer import Project
from .validator import Validator
from .workloads import WorkloadError, model_learner, network_learners

__all__ = ["configure_logging", "fingerprint", "main", "pinned_network"]


_EDGES = "edge URL (https://host); again, or a comma-separated list, for edges tried in order when one is unreachable"


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _network(path: Path) -> NetworkManifest:
    return NetworkManifest.from_wire(json.loads(path.read_bytes()))


def pinned_network(
    network: NetworkManifest, pins: list[str], source: str, signatures: list[NetworkSignature] | None = None
) -> NetworkManifest:
    """``network`` if a peer pinning ``pins`` may train for it (or export its heads) as served with
    ``signatures`` (``protocol.network_pins.pin_problem``); ``SystemExit`` saying why not otherwise."""
    problem = pin_problem(network, pins, signed_by(network, signatures or []))
    if problem is not None:
        raise SystemExit(f"{source} serves {problem}; refusing it (check the keys with the network's operator)")
    return network


def _default_storage(edge: str) -> Path:
    """``$XDG_DATA_HOME/dtn/<host>[_<port>]`` (default ``~/.local/share``): one node per edge."""
    data_home = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return data_home / "dtn" / re.sub(r"[^A-Za-z0-9.-]", "_", urlsplit(edge).netloc or "edge")


def _served_network(args: argparse.Namespace, command: str) -> NetworkManifest:
    """The network ``--network`` holds, or the edge serves, checked against the pinned ``--validator-key``s."""
    if args.network is not None:
        network = _network(args.network)
        return pinned_network(network, args.validator_key, str(args.network)) if args.validator_key else network
    if not args.validator_key:
        raise SystemExit(
            f"dtn {command} needs --validator-key <key or fingerprint> (from the network's operator) or --network"
        )
    client = EdgeClient(args.edge, token=args.token)
    try:
        served, signatures = client.network(), client.network_signatures()
    finally:
        client.close()
    network = pinned_network(served, args.validator_key, client.url, signatures)
    logging.getLogger(__name__).info(
        "network %s from %s: validators [%s] (signed by [%s]) include the pinned keys",
        network.network_id,
        client.url,
        ", ".join(fingerprint(key) for key in network.validator_keys),
        ", ".join(fingerprint(key) for key in signed_by(network, signatures)),
    )
    return network


def cmd_train(args: argparse.Namespace) -> None:
    network = _served_network(args, "train")
    args.storage = args.storage or _default_storage(edge_urls(args.edge)[0])
    keys = [ExperimentKey.parse(k) for k in args.experiment] or [s.key for s in network.experiments]
    workloads = {(spec.model, spec.dataset_id) for spec in map(network.experiment, keys)}
    if len(workloads) != 1:
        raise SystemExit(
            f"dtn train: {', '.join(map(str, keys))} train {len(workloads)} model/dataset pairs; one trainer runs "
            "one: pass --experiment for each of one model"
        )
    ((model, dataset_id),) = workloads
    try:
        learner = model_learner(model)  # the model as the network's manifest declares it
    except WorkloadError as exc:
        raise SystemExit(f"dtn train: {exc}") from None
    builder = (
        Project(learner)
        .trainer(RELEASE, SupportedWorkload(f"{model.name}-cpu", model.name, dataset_id))
        .with_network(network)
        .with_storage(StorageConfig(args.storage))
        .with_bootstrap_peer(args.edge)
        .with_continuous_training(not args.idle_between_windows)
    )
    builder = builder.with_admission_token(args.token) if args.token else builder
    trainer = (builder.with_sharded_dataset(args.shards_from) if args.shards_from else builder).spawn()
    experiments = [trainer.experiment(*key.parts) for key in keys]
    try:
        outcomes = trainer.run(experiments, max_windows=args.windows, stop=_stop_on_signals())
    finally:
        trainer.close()
    for outcome in outcomes[-3:]:
        print(f"{outcome.experiment} window {outcome.window}: published {outcome.head_id}")


def cmd_validate(args: argparse.Namespace) -> None:
    network = _network(args.network)
    try:
        learners = network_learners(network)  # each model as the network's manifest declares it
    except WorkloadError as exc:
        raise SystemExit(f"dtn validate: {exc}") from None
    validator = Validator(
        learners,
        network,
        StorageConfig(args.storage),
        args.edge,
        args.datasets,
        admission_token=args.token,
    )
    try:
        validator.run(None, _stop_on_signals())  # every experiment, as revisions add them
    finally:
        validator.close()


def cmd_keys(args: argparse.Namespace) -> None:
    if args.network is not None:
        network = _network(args.network)
    else:
        client = EdgeClient(args.edge, token=args.token)
        try:
            network = client.network()
        finally:
            client.close()
    print(f"network {network.network_id}: {network.quorum} of {len(network.validator_keys)} validators make a head")
    for key in network.validator_keys:
        print(f"validator {b64encode(key)}  fingerprint {fingerprint(key)}")


@contextmanager
def _head_source(
    args: argparse.Namespace, network: NetworkManifest, key: ExperimentKey, client: EdgeClient | None
) -> Iterator[tuple[list[HeadDescriptor], Callable[[HeadDescriptor], bytes]]]:
    """The heads of ``key`` and how to read a head's artifact, checked against its content id: from a
    lineage archive (``--lineage``), else downloaded from the edge through ``client``."""
    if args.lineage is not None:
        model = network.experiment(key).model
        lineage = read_archive(args.lineage.read_bytes(), max_blob_bytes=model.max_artifact_bytes)
        if lineage.network_id != network.network_id or lineage.experiment != key:
            raise ExportError(
                f"{args.lineage} holds {lineage.experiment} of network {lineage.network_id}, not {key} of "
                f"{network.network_id}"
            )
        yield list(lineage.heads), lambda head: lineage.blobs[ContentId(head.head_id)]
        return
    assert client is not None  # --edge, checked by cmd_export
    with tempfile.TemporaryDirectory(prefix="dtn-export-") as downloads:
        yield client.heads(key), lambda head: client.artifact(ContentId(head.head_id), Path(downloads) / "head")


def cmd_export(args: argparse.Namespace) -> None:
    if (args.edge is None) == (args.lineage is None):
        raise SystemExit("dtn export reads heads from an edge (--edge URL) or a lineage archive (--lineage FILE)")
    if args.lineage is not None and args.network is None:
        raise SystemExit("dtn export --lineage needs --network (the manifest whose validators vouch for its heads)")
    chain = NetworkChain(_served_network(args, "export"))
    edge = closing(EdgeClient(args.edge, token=args.token)) if args.edge is not None else nullcontext()
    with edge as client:
        if client is not None:  # the revisions since the manifest given, checked: heads are checked by era
            try:
                chain.read(client)
            except (ProtocolError, EdgeRequestError) as exc:
                raise SystemExit(f"dtn export: {args.edge}: {exc}") from None
        network, history = chain.network, chain.history()
        try:
            key = ExperimentKey.parse(args.experiment)
            model = network.experiment(key).model
        except (ProtocolError, KeyError):
            raise SystemExit(
                f"dtn export: network {network.network_id} has no experiment {args.experiment}; "
                f"experiments: {[str(spec.key) for spec in network.experiments]}"
            ) from None
        try:
            with _head_source(args, network, key, client) as (heads, artifact):
                head, refused = best_head(heads, history, key)
                for line in refused:
                    print(f"dtn export: refused {line}", file=sys.stderr)
                tensors, _ = decode_tensors(artifact(head))
            checkpoint, config = write_checkpoint(args.out, network, model, head, tensors)
        except (ExportError, ProtocolError, EdgeRequestError, OSError) as exc:
            where = args.lineage if args.lineage is not None else args.edge
            raise SystemExit(f"dtn export: {where}: {exc}") from None
    loss, era = head.metrics.get("val_loss"), head_network(history, key, head.window)
    print(
        f"wrote {checkpoint} and {config}: {key} head {head.head_id[:19]} of window {head.window}"
        f"{f' (val_loss {loss:.4f})' if loss is not None else ''}, vouched for by "
        f"{len(head.signers(era.validator_key_set))} of its era's validators (quorum {era.quorum})"
    )


def _summary(prepared: PreparedDataset) -> str:
    manifest = prepared.manifest
    splits = ", ".join(f"{split} {prepared.split_examples[split]:,}" for split in HELD_OUT_SPLITS)
    return (
        f"{manifest.dataset_id}: {len(manifest.shards)} train shards ({prepared.split_examples['train']:,} "
        f"examples); {splits}\n{manifest.features} features {list(manifest.feature_shape)}, "
        f"{manifest.num_classes} classes, in {prepared.root}"
    )


def cmd_dataset_shard(args: argparse.Namespace) -> None:
    fractions = {split: getattr(args, split) for split in HELD_OUT_SPLITS}
    try:
        dataset_id = DatasetId(args.dataset_id)
        if args.kind == "npz":
            source = read_npz(args.path, features=args.features, num_classes=args.num_classes)
        elif args.kind == "images":
            source = read_images(args.path)
        else:
            source = read_text(args.path, context=args.context)
        prepared = shard(
            source, args.out, dataset_id, fractions=fractions, shard_size=args.shard_size, force=args.force
        )
    except (ShardingError, ProtocolError) as exc:
        print(f"dtn dataset shard: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(_summary(prepared))


def cmd_dataset_check(args: argparse.Namespace) -> None:
    try:
        prepared = check_dataset(args.root)
    except (ProtocolError, OSError, ValueError) as exc:
        print(f"dtn dataset check: {args.root}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print(_summary(prepared))
    print("every shard matches the manifest; every split fits it")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m native_peer", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="run a native JAX trainer")
    train.add_argument("--edge", required=True, action="append", help=_EDGES)
    train.add_argument(
        "--validator-key",
        action="append",
        default=[],
        help="a validator's public key (base64) or fingerprint (16+ hex digits, `dtn keys`): the network manifest "
        "is fetched from the edge and used only if it lists this validator (repeatable)",
    )
    train.add_argument("--network", type=Path, default=None, help="network manifest JSON, instead of the edge's")
    train.add_argument(
        "--storage", type=Path, default=None, help="this node's storage directory (default ~/.local/share/dtn/<host>)"
    )
    train.add_argument("--experiment", action="append", default=[], help="study/experiment/revision (repeatable)")
    train.add_argument("--windows", type=int, default=None, help="stop after this many windows")
    train.add_argument(
        "--idle-between-windows",
        action="store_true",
        help="wait for each window to be judged instead of leasing and training the next one at once",
    )
    train.add_argument("--token", default=os.environ.get("DTN_TOKEN"), help="admission token (env DTN_TOKEN)")
    train.add_argument(
        "--shards-from",
        type=Path,
        default=None,
        help="prepared datasets dir (<dir>/<dataset>/train/) to read leased shards from, verified against "
        "the edge's fetch-manifest, instead of downloading them",
    )
    train.set_defaults(run=cmd_train)

    keys = sub.add_parser("keys", help="print a network's validator keys and their fingerprints (what trainers pin)")
    source = keys.add_mutually_exclusive_group(required=True)
    source.add_argument("--network", type=Path, help="network manifest JSON")
    source.add_argument("--edge", help="edge URL: print the manifest it serves")
    keys.add_argument("--token", default=os.environ.get("DTN_TOKEN"), help="admission token (env DTN_TOKEN)")
    keys.set_defaults(run=cmd_keys)

    validate = sub.add_parser("validate", help="run a validator / authority node")
    validate.add_argument("--edge", required=True, action="append", help=_EDGES)
    validate.add_argument("--network", type=Path, required=True)
    validate.add_argument("--storage", type=Path, required=True)
    validate.add_argument("--datasets", type=Path, required=True, help="prepared datasets (validation split)")
    validate.add_argument("--token", default=os.environ.get("DTN_TOKEN"), help="admission token (env DTN_TOKEN)")
    validate.set_defaults(run=cmd_validate)

    dataset = sub.add_parser("dataset", help="prepare your own data as a sharded dataset").add_subparsers(
        dest="action", required=True
    )
    shard_cmd = dataset.add_parser(
        "shard",
        help="write train shards, fetch-manifest and held-out splits (datasets.sources lists the input formats)",
    )
    shard_cmd.add_argument("--from", dest="kind", choices=("npz", "images", "text"), required=True)
    shard_cmd.add_argument("path", type=Path, help=".npz file, folder of class subfolders, or text file/folder")
    shard_cmd.add_argument("--out", type=Path, required=True, help="datasets dir (the edge's --datasets-dir)")
    shard_cmd.add_argument("--dataset-id", required=True, help="the dataset's id, as experiments name it")
    shard_cmd.add_argument("--shard-size", type=int, default=1000, help="examples per train shard")
    for split in HELD_OUT_SPLITS:
        shard_cmd.add_argument(
            f"--{split}", type=float, default=DEFAULT_FRACTIONS[split], help=f"fraction drawn for {split}"
        )
    shard_cmd.add_argument("--features", choices=("pixels", "tokens"), default="pixels", help="npz: feature kind")
    shard_cmd.add_argument("--num-classes", type=int, default=None, help="npz: classes (default: largest label + 1)")
    shard_cmd.add_argument("--context", type=int, default=128, help="text: tokens (bytes) per example")
    shard_cmd.add_argument("--force", action="store_true", help="replace a dataset already at --out/--dataset-id")
    shard_cmd.set_defaults(run=cmd_dataset_shard)
    check = dataset.add_parser("check", help="verify a prepared dataset against its fetch-manifest")
    check.add_argument("root", type=Path, help="the dataset's folder (<datasets dir>/<dataset id>)")
    check.set_defaults(run=cmd_dataset_check)

    export = sub.add_parser(
        "export", help="write an experiment's best verified head as safetensors plus its model config (JSON)"
    )
    export.add_argument("--experiment", required=True, help="study/experiment/revision")
    export.add_argument("--out", type=Path, required=True, help="folder for model.safetensors and config.json")
    export.add_argument("--edge", default=None, help="edge URL to read the heads from")
    export.add_argument("--lineage", type=Path, default=None, help="a lineage archive (dtn lineage export) instead")
    export.add_argument("--network", type=Path, default=None, help="network manifest JSON, instead of the edge's")
    export.add_argument(
        "--validator-key",
        action="append",
        default=[],
        help="a validator's public key or fingerprint the network must hold, as for dtn train (repeatable)",
    )
    export.add_argument("--token", default=os.environ.get("DTN_TOKEN"), help="admission token (env DTN_TOKEN)")
    export.set_defaults(run=cmd_export)

    add_control_parser(sub)

    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    use_compile_cache()  # programs compiled once per machine, not once per process and experiment
    use_verifier(NodeIdentity.verify)  # heads, leases and candidates verified at native speed, not pure Python's
    args.run(args)


def configure_logging(verbose: bool) -> None:
    """Logging for a node's process, configured once at its entry point (HTTP and JAX chatter quiet)."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpcore", "jax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
