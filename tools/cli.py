"""``python -m tools``: set-up commands for operators (``--help`` on each lists its options)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from protocol.errors import ProtocolError
from protocol.ids import ExperimentKey
from protocol.lineage import archive_id, read_archive, write_archive
from protocol.manifests import NetworkManifest
from server.admission import ROLES, TOKEN_ID_LENGTH, issue_token, revoke_token
from server.backup import restore_backup, take_backup
from server.errors import Conflict
from server.lineage import export_lineage, import_lineage
from server.settings import Settings
from server.signatures import install_native_verifier
from server.state import open_blobs, revised_history
from server.store import EdgeStore, open_store

from .networks import DATASETS, MNIST_NETWORK, NetworkConfigError, write_network
from .pyodide_runtime import CORE_SOURCES, PYODIDE_VERSION, copy_runtime, prepare_runtime

__all__ = ["main"]


def cmd_pyodide_runtime(args: argparse.Namespace) -> None:
    if args.source is not None:
        copy_runtime(args.source, args.out)
    else:
        prepare_runtime(args.out, args.node_modules, args.wheels, core=args.core, package_lock=args.package_lock)
    print(f"Pyodide {PYODIDE_VERSION} runtime ready in {args.out}")


@contextmanager
def _edge_store(args: argparse.Namespace) -> Iterator[EdgeStore]:
    """The edge's store: PostgreSQL at ``--store-url`` (several edges), else SQLite in ``--data-dir``."""
    store = open_store(args.store_url, args.data_dir)
    try:
        yield store
    finally:
        store.close()


def cmd_token_issue(args: argparse.Namespace) -> None:
    with _edge_store(args) as store:
        print(issue_token(store, args.role, args.label, args.ttl_days * 86400, max_keys=args.max_keys))


def cmd_token_list(args: argparse.Namespace) -> None:
    with _edge_store(args) as store:
        print(f"{'id':<{TOKEN_ID_LENGTH}}  {'role':<9}  {'expires (UTC)':<16}  label")
        for row in store.tokens():
            expires = time.strftime("%Y-%m-%d %H:%M", time.gmtime(int(row["expires_at_ms"]) / 1000))  # type: ignore[call-overload]
            print(f"{str(row['digest'])[:TOKEN_ID_LENGTH]}  {row['role']!s:<9}  {expires:<16}  {row['label']}")


def cmd_token_revoke(args: argparse.Namespace) -> None:
    with _edge_store(args) as store:
        if revoke_token(store, args.token) == 0:
            raise SystemExit(f"no token {args.token!r} (give the token itself or its id from `token list`)")
    print(f"revoked {args.token}; a running edge refuses it from its next request on")


def _lineage_parts(args: argparse.Namespace) -> tuple[Settings, NetworkManifest]:
    settings = Settings(
        data_dir=args.data_dir,
        store_url=args.store_url,
        blobs_dir=args.blobs_dir,
        blobs_url=args.blobs_url,
        network=args.network,
    )
    install_native_verifier()  # every signature of a lineage is checked: at native speed
    return settings, NetworkManifest.from_wire(json.loads(args.network.read_bytes()))


def cmd_lineage_export(args: argparse.Namespace) -> None:
    settings, network = _lineage_parts(args)
    with _edge_store(args) as store:
        try:
            lineage = export_lineage(store, open_blobs(settings), network, ExperimentKey.parse(args.experiment))
        except ProtocolError as exc:
            raise SystemExit(f"lineage export: {exc}") from None
    data = write_archive(lineage)
    args.out.write_bytes(data)
    print(
        f"wrote {args.out} ({archive_id(data)}): {len(lineage.heads)} heads of {lineage.experiment} "
        f"(windows 0..{lineage.heads[-1].window}), {len(lineage.candidates)} candidates, {len(lineage.verdicts)} verdicts"
    )


def cmd_lineage_import(args: argparse.Namespace) -> None:
    settings, network = _lineage_parts(args)
    data = args.archive.read_bytes()
    with _edge_store(args) as store:
        try:
            lineage = read_archive(data, max_blob_bytes=settings.max_artifact_bytes)
            networks = list(revised_history(network, store).values())  # the revisions the store holds, applied
            report = import_lineage(store, open_blobs(settings), networks, lineage, int(time.time() * 1000))
        except (ProtocolError, Conflict) as exc:
            raise SystemExit(f"lineage import refused {args.archive} ({archive_id(data)}): {exc}") from None
    print(
        f"imported {args.archive} ({archive_id(data)}): {report.heads} heads of {lineage.experiment} from window "
        f"{report.first_window} on, {report.candidates} candidates, {report.verdicts} verdicts; every signature, "
        "quorum and parent checked"
    )


def cmd_backup(args: argparse.Namespace) -> None:
    if args.store_url:
        raise SystemExit(
            "backup copies the embedded SQLite store; back a PostgreSQL store up with pg_dump (deploy/README.md)"
        )
    blobs_root = Path(args.blobs_dir) if args.blobs_dir else args.data_dir / "blobs"
    try:
        report = take_backup(args.data_dir, blobs_root, args.out)
    except (OSError, sqlite3.Error) as exc:
        raise SystemExit(f"backup: {exc}") from None
    print(f"backed up {args.data_dir} to {args.out}: store {report.store_bytes} bytes, {report.blobs} artifacts")


def cmd_restore(args: argparse.Namespace) -> None:
    blobs_root = Path(args.blobs_dir) if args.blobs_dir else args.data_dir / "blobs"
    try:
        report = restore_backup(args.backup, args.data_dir, blobs_root)
    except (OSError, RuntimeError, sqlite3.Error, ProtocolError) as exc:
        raise SystemExit(f"restore refused {args.backup}: {exc}") from None
    print(
        f"restored {args.backup} into {args.data_dir}: store {report.store_bytes} bytes, {report.blobs} artifacts checked"
    )


def cmd_init_network(args: argparse.Namespace) -> None:
    try:
        network = write_network(
            args.validator_storage, args.out, args.network_id, args.quorum, args.config, args.datasets
        )
    except NetworkConfigError as exc:
        raise SystemExit(str(exc)) from None
    print(f"wrote {args.out}: experiments {[s.key for s in network.experiments]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    runtime = sub.add_parser("pyodide-runtime", help="assemble the self-hosted Pyodide runtime (registries only)")
    runtime.add_argument("--out", type=Path, default=Path("var/pyodide"))
    runtime.add_argument("--node-modules", type=Path, default=Path("node_modules"))
    runtime.add_argument("--wheels", type=Path, default=None, help="folder with a fallback copy of the wheels")
    runtime.add_argument(
        "--core",
        choices=CORE_SOURCES,
        default="auto",
        help="where the core comes from: node_modules (npm ci), npm-registry (Python alone: the locked "
        "tarball from the npm registry, no Node needed) or auto (node_modules when it has pyodide)",
    )
    runtime.add_argument("--package-lock", type=Path, default=Path("package-lock.json"), help="holds the integrity")
    runtime.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=None,
        help="install a runtime assembled elsewhere (a build artifact), every file checked, instead",
    )
    runtime.set_defaults(run=cmd_pyodide_runtime)

    edge_dir = argparse.ArgumentParser(add_help=False)
    edge_dir.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("DTN_DATA_DIR", "var/edge")),
        help="the edge's data dir (env DTN_DATA_DIR)",
    )
    edge_dir.add_argument(
        "--store-url",
        default=os.environ.get("DTN_STORE_URL", ""),
        help="the edges' PostgreSQL store (env DTN_STORE_URL), instead of SQLite in --data-dir",
    )
    token = sub.add_parser("token", help="admission tokens").add_subparsers(dest="action", required=True)
    issue = token.add_parser("issue", parents=[edge_dir], help="issue a bearer token with a role")
    issue.add_argument("--role", choices=sorted(ROLES), required=True)
    issue.add_argument("--label", default="")
    issue.add_argument("--ttl-days", type=float, default=30.0)
    issue.add_argument(
        "--max-keys", type=int, default=1, help="peer keys the token admits (bound on first use; default 1)"
    )
    issue.set_defaults(run=cmd_token_issue)
    listing = token.add_parser(
        "list", parents=[edge_dir], help="list tokens (id, role, expiry, label; never the token)"
    )
    listing.set_defaults(run=cmd_token_list)
    revoke = token.add_parser("revoke", parents=[edge_dir], help="revoke a token, given as itself or as its id")
    revoke.add_argument("token", help="the token, or its id from `token list`")
    revoke.set_defaults(run=cmd_token_revoke)

    lineage = sub.add_parser(
        "lineage", help="an experiment's lineage as one verifiable archive (protocol.lineage)"
    ).add_subparsers(dest="action", required=True)
    lineage_edge = argparse.ArgumentParser(add_help=False, parents=[edge_dir])
    lineage_edge.add_argument(
        "--blobs-dir", default=os.environ.get("DTN_BLOBS_DIR", ""), help="the edge's artifacts (default data-dir/blobs)"
    )
    lineage_edge.add_argument(
        "--blobs-url", default=os.environ.get("DTN_BLOBS_URL", ""), help="the edges' S3 bucket (s3://bucket/prefix)"
    )
    lineage_edge.add_argument(
        "--network", type=Path, default=Path(os.environ.get("DTN_NETWORK", "var/network.json")), help="network manifest"
    )
    export = lineage.add_parser(
        "export", parents=[lineage_edge], help="write an experiment's lineage from the edge's store"
    )
    export.add_argument("--experiment", required=True, help="study/experiment/revision")
    export.add_argument("--out", type=Path, required=True, help="the archive to write (a plain tar)")
    export.set_defaults(run=cmd_lineage_export)
    take = lineage.add_parser(
        "import", parents=[lineage_edge], help="verify an archive whole, then take it into the edge's store"
    )
    take.add_argument("archive", type=Path)
    take.set_defaults(run=cmd_lineage_import)

    backup = sub.add_parser(
        "backup", parents=[edge_dir], help="copy the edge's SQLite store and artifacts while it serves (server.backup)"
    )
    backup.add_argument("--blobs-dir", default=os.environ.get("DTN_BLOBS_DIR", ""), help="default data-dir/blobs")
    backup.add_argument("--out", type=Path, required=True, help="a new directory")
    backup.set_defaults(run=cmd_backup)
    restore = sub.add_parser("restore", parents=[edge_dir], help="put a backup in place for an edge without a store")
    restore.add_argument("--blobs-dir", default=os.environ.get("DTN_BLOBS_DIR", ""), help="default data-dir/blobs")
    restore.add_argument("backup", type=Path, help="a directory `backup` wrote")
    restore.set_defaults(run=cmd_restore)

    init = sub.add_parser("init-network", help="create validator identities and a network manifest from a config file")
    init.add_argument(
        "--validator-storage",
        type=Path,
        action="append",
        required=True,
        help="a validator's storage dir (its identity is created there); repeat for several validators",
    )
    init.add_argument("--quorum", type=int, default=1, help="validators that must vouch for a head (k of n)")
    init.add_argument("--out", type=Path, required=True)
    init.add_argument("--network-id", default="demo")
    init.add_argument(
        "--config",
        type=Path,
        default=MNIST_NETWORK,
        help="the network's experiments and models, TOML or .json (tools/networks.py describes the fields, "
        "docs/models.md the models; default: the demo's, networks/mnist.toml)",
    )
    init.add_argument(
        "--datasets",
        type=Path,
        default=DATASETS,
        help="the prepared datasets each experiment's model is checked against (shapes, classes)",
    )
    init.set_defaults(run=cmd_init_network)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args.run(args)
