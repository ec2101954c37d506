"""``python -m tools``: set-up commands for operators (``--help`` on each lists its options)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from server.admission import ROLES, issue_token
from server.store import Store

from .networks import write_network
from .pyodide_runtime import PYODIDE_VERSION, prepare_runtime

__all__ = ["main"]


def cmd_pyodide_runtime(args: argparse.Namespace) -> None:
    prepare_runtime(args.out, args.node_modules, args.wheels)
    print(f"Pyodide {PYODIDE_VERSION} runtime ready in {args.out}")


def cmd_token_issue(args: argparse.Namespace) -> None:
    store = Store(args.data_dir / "edge.sqlite3")
    try:
        print(issue_token(store, args.role, args.label, args.ttl_days * 86400))
    finally:
        store.close()


def cmd_init_network(args: argparse.Namespace) -> None:
    network = write_network(args.validator_storage, args.out, args.network_id)
    print(f"wrote {args.out}: experiments {[s.key for s in network.experiments]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    runtime = sub.add_parser("pyodide-runtime", help="assemble the self-hosted Pyodide runtime (registries only)")
    runtime.add_argument("--out", type=Path, default=Path("var/pyodide"))
    runtime.add_argument("--node-modules", type=Path, default=Path("node_modules"))
    runtime.add_argument("--wheels", type=Path, default=None, help="folder with a fallback copy of the wheels")
    runtime.set_defaults(run=cmd_pyodide_runtime)

    token = sub.add_parser("token", help="admission tokens").add_subparsers(dest="action", required=True)
    issue = token.add_parser("issue", help="issue a bearer token with a role")
    issue.add_argument("--data-dir", type=Path, default=Path("var/edge"), help="the edge's data dir")
    issue.add_argument("--role", choices=sorted(ROLES), required=True)
    issue.add_argument("--label", default="")
    issue.add_argument("--ttl-days", type=float, default=30.0)
    issue.set_defaults(run=cmd_token_issue)

    init = sub.add_parser("init-network", help="create a validator identity and the MNIST network manifest")
    init.add_argument("--validator-storage", type=Path, required=True)
    init.add_argument("--out", type=Path, required=True)
    init.add_argument("--network-id", default="demo")
    init.set_defaults(run=cmd_init_network)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args.run(args)
