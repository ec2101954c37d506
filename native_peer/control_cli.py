"""``dtn control``: run-control orders (``protocol.run_control``, decision 0033) from the command line.

An order is a file. Anyone writes it (``new``); each validator signs it offline with its own key
(``sign``: the file passed along, or each validator signing its own copy); anyone submits the order
with the signatures gathered (``submit``: several copies are merged) to one edge or several, each of
which applies it once a quorum of the network's validators signed it. ``show`` prints what an edge
applied, each order checked against the network's quorum here:

    dtn control new order.json --network network.json --experiment study/exp/rev-1 --action pause --edge URL
    dtn control sign order.json --network network.json --storage /var/lib/dtn/validator-1
    dtn control submit order.json [copy.json ...] --edge URL [--edge URL2]
    dtn control show --network network.json --experiment study/exp/rev-1 --edge URL
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx

from protocol.errors import ProtocolError
from protocol.ids import ExperimentKey
from protocol.manifests import NetworkManifest
from protocol.network_pins import fingerprint
from protocol.run_control import ACTIONS, RunControl, RunState, SignedRunControl
from protocol.signing import canonical_json

from .edge_client import EdgeClient, EdgeRequestError
from .identity import NodeIdentity
from .storage import StorageConfig, write_atomic

__all__ = ["add_control_parser"]

MAX_ORDER_FILE_BYTES = 1 << 20


def _fail(message: str) -> SystemExit:
    return SystemExit(f"dtn control: {message}")


def _network(path: Path) -> NetworkManifest:
    try:
        return NetworkManifest.from_wire(json.loads(path.read_bytes()))
    except (OSError, ValueError, ProtocolError) as exc:
        raise _fail(f"cannot read the network manifest {path}: {exc}") from None


def _experiment(network: NetworkManifest, key: str) -> ExperimentKey:
    try:
        return network.experiment(key).key
    except (KeyError, ProtocolError):
        raise _fail(f"network {network.network_id} has no experiment {key!r}") from None


def _read_order(path: Path) -> SignedRunControl:
    try:
        if path.stat().st_size > MAX_ORDER_FILE_BYTES:
            raise _fail(f"{path} is over {MAX_ORDER_FILE_BYTES} bytes; not an order file")
        return SignedRunControl.from_wire(json.loads(path.read_bytes()))
    except (OSError, ValueError, ProtocolError) as exc:
        raise _fail(f"{path} is not a run-control order file: {exc}") from None


def _write_order(path: Path, signed: SignedRunControl) -> None:
    write_atomic(path, canonical_json(signed.to_wire()) + b"\n")


def _edge_orders(url: str, key: ExperimentKey) -> list[SignedRunControl]:
    client = EdgeClient(url)
    try:
        return client.run_orders(key)
    finally:
        client.close()


def cmd_new(args: argparse.Namespace) -> None:
    network = _network(args.network)
    key = _experiment(network, args.experiment)
    sequence = args.sequence
    if sequence is None:
        if args.edge is None:
            raise _fail("give --sequence, or --edge to take the one after the last order the edge applied")
        try:
            sequence = RunState.of(_edge_orders(args.edge, key), network, key).sequence + 1
        except (httpx.HTTPError, EdgeRequestError, ProtocolError) as exc:
            raise _fail(f"cannot read the orders {args.edge} applied: {exc}") from None
    try:
        order = RunControl(network.network_id, key, args.action, sequence, int(time.time() * 1000), args.target)
    except ProtocolError as exc:
        raise _fail(str(exc)) from None
    _write_order(args.order, SignedRunControl(order, ()))
    print(f"{args.order}: {args.action} {key} as order {sequence} of network {network.network_id}, unsigned")


def cmd_sign(args: argparse.Namespace) -> None:
    network = _network(args.network)
    signed = _read_order(args.order)
    if signed.order.network_id != network.network_id:
        raise _fail(f"the order is for network {signed.order.network_id!r}, not {network.network_id!r}")
    path = StorageConfig(args.storage).identity_path
    if not path.is_file():
        raise _fail(f"no validator key at {path} (give the validator's --storage)")
    identity = NodeIdentity.load_or_create(path)
    if identity.public_key not in network.validator_key_set:
        raise _fail(f"the key at {path} ({fingerprint(identity.public_key)}) is not a validator of this network")
    signed = signed.signed_by(identity)
    _write_order(args.order, signed)
    count = len(signed.signers(network))
    print(f"{args.order}: signed by {fingerprint(identity.public_key)}; {count} of the {network.quorum} needed")


def _submit_to(url: str, signed: SignedRunControl) -> tuple[bool, str]:
    """Whether the edge at ``url`` holds ``signed`` now (it applied it, or had before), and what it said."""
    client = EdgeClient(url, retries=1)
    try:
        answer = client.submit_order(signed)
        return True, f"applied; the experiment is now {json.dumps(answer['state'])}"
    except EdgeRequestError as exc:
        if exc.status == 409 and any(o.order == signed.order for o in client.run_orders(signed.order.experiment)):
            return True, "already applied this order"
        return False, f"refused ({exc.status} {exc.error}): {exc.detail}"
    except httpx.HTTPError as exc:
        return False, f"unreachable: {exc}"
    finally:
        client.close()


def cmd_submit(args: argparse.Namespace) -> None:
    try:
        signed = SignedRunControl.gathered(_read_order(path) for path in args.order)
    except ProtocolError as exc:
        raise _fail(str(exc)) from None
    urls = [url for value in args.edge for url in value.split(",") if url]
    results = [(url, *_submit_to(url, signed)) for url in urls]
    for url, _, said in results:
        print(f"{url}: {said}")
    if not all(held for _, held, _ in results):
        raise _fail("not every edge holds the order (see above)")


def cmd_show(args: argparse.Namespace) -> None:
    network = _network(args.network)
    key = _experiment(network, args.experiment)
    try:
        orders = _edge_orders(args.edge, key)
        state = RunState.of(orders, network, key)
    except (httpx.HTTPError, EdgeRequestError) as exc:
        raise _fail(f"cannot read the orders {args.edge} applied: {exc}") from None
    except ProtocolError as exc:
        raise _fail(f"{args.edge} serves an order that does not check: {exc}") from None
    for signed in orders:
        order = signed.order
        signers = ", ".join(fingerprint(k) for k in sorted(signed.signers(network)))
        target = f" {order.target}" if order.target else ""
        print(f"{order.sequence}: {order.action}{target} issued {order.issued_at_ms} ms, signed by {signers}")
    print(f"{key}: {state.halted or 'running'} (last order {state.sequence})")


def add_control_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``dtn control`` and its commands, on the ``dtn`` parser's subcommands ``sub``."""
    control = sub.add_parser("control", help="run-control orders a quorum of validators signs (pause, resume, ...)")
    commands = control.add_subparsers(dest="action_command", required=True)

    new = commands.add_parser("new", help="write an unsigned order file")
    new.add_argument("order", type=Path, help="the order file to write")
    new.add_argument("--network", type=Path, required=True, help="network manifest JSON")
    new.add_argument("--experiment", required=True, help="study/experiment/revision")
    new.add_argument("--action", required=True, choices=ACTIONS)
    new.add_argument("--target", default=None, help="pardon: the peer id; rollback: the head id")
    new.add_argument("--sequence", type=int, default=None, help="above the last order applied to the experiment")
    new.add_argument("--edge", default=None, help="without --sequence: take the one after the edge's last order")
    new.set_defaults(run=cmd_new)

    sign = commands.add_parser("sign", help="add this validator's signature to an order file (offline)")
    sign.add_argument("order", type=Path, help="the order file, signed in place")
    sign.add_argument("--network", type=Path, required=True, help="network manifest JSON")
    sign.add_argument("--storage", type=Path, required=True, help="the validator's storage (its identity.key)")
    sign.set_defaults(run=cmd_sign)

    submit = commands.add_parser("submit", help="submit an order and its signatures to one or more edges")
    submit.add_argument("order", type=Path, nargs="+", help="order files: copies of one order, signatures merged")
    submit.add_argument("--edge", required=True, action="append", help="edge URL (repeatable, or comma-separated)")
    submit.set_defaults(run=cmd_submit)

    show = commands.add_parser("show", help="print the orders an edge applied to an experiment, checked")
    show.add_argument("--network", type=Path, required=True, help="network manifest JSON")
    show.add_argument("--experiment", required=True, help="study/experiment/revision")
    show.add_argument("--edge", required=True, help="edge URL")
    show.set_defaults(run=cmd_show)
