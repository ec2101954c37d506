"""``dtn control``: run-control orders (``protocol.run_control``, decision 0033) and revisions of the
network's terms (``protocol.network_revisions``, decision 0049) from the command line.

An order or a revision is a file. Anyone writes it (``new``, ``revise``); each validator signs it
offline with its own key (``sign``: the file passed along, or each validator signing its own copy);
anyone submits it with the signatures gathered (``submit``: several copies are merged) to one edge or
several, each of which applies it once a quorum of the validators signed it (for a revision: of the
terms it revises). ``show`` prints the orders an edge applied to an experiment, ``revisions`` the
revisions of the network, each checked here:

    dtn control new order.json --network network.json --experiment study/exp/rev-1 --action pause --edge URL
    dtn control revise revision.json --network network.json --edge URL --add-experiment spec.json
    dtn control revise revision.json --network network.json --edge URL --add-validator KEY --remove-validator PIN
    dtn control sign order.json --network network.json --storage /var/lib/dtn/validator-1
    dtn control submit order.json [copy.json ...] --edge URL [--edge URL2]
    dtn control show --network network.json --experiment study/exp/rev-1 --edge URL
    dtn control revisions --network network.json --edge URL

A revision that changes the validators hands over at each experiment's current head, which ``revise``
reads from the edge: pause the experiments first, so that no head moves before it is submitted.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

from protocol.errors import InvalidMessage, ProtocolError
from protocol.ids import ExperimentKey
from protocol.manifests import ExperimentSpec, NetworkManifest
from protocol.network_pins import fingerprint, pin_matches
from protocol.network_revisions import NetworkRevision, SignedNetworkRevision, follow, order_network, terms_digest
from protocol.run_control import ACTIONS, RunControl, RunState, SignedRunControl
from protocol.signing import b64decode, canonical_json

from .edge_client import EdgeClient, EdgeRequestError
from .identity import NodeIdentity
from .network_chain import NetworkChain
from .storage import StorageConfig, write_atomic

__all__ = ["add_control_parser"]

MAX_FILE_BYTES = 1 << 20
Signed = SignedRunControl | SignedNetworkRevision
T = TypeVar("T")


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


def _read_signed(path: Path) -> Signed:
    """An order file or a revision file (``{"order": ...}`` or ``{"revision": ...}``)."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise _fail(f"{path} is over {MAX_FILE_BYTES} bytes; not an order or revision file")
        wire = json.loads(path.read_bytes())
        if isinstance(wire, dict) and "revision" in wire:
            return SignedNetworkRevision.from_wire(wire)
        return SignedRunControl.from_wire(wire)
    except (OSError, ValueError, ProtocolError) as exc:
        raise _fail(f"{path} is not a run-control order or network revision file: {exc}") from None


def _write_signed(path: Path, signed: Signed) -> None:
    write_atomic(path, canonical_json(signed.to_wire()) + b"\n")


def _with_client(url: str, read: Callable[[EdgeClient], T]) -> T:
    """``read(client)`` of a client of the edge at ``url``, closed after."""
    client = EdgeClient(url)
    try:
        return read(client)
    finally:
        client.close()


def _served(network: NetworkManifest, url: str) -> NetworkChain:
    """``network`` followed to the terms the edge at ``url`` serves now, through the revisions its
    validators signed."""
    chain = NetworkChain(network)
    try:
        _with_client(url, chain.read)
    except (httpx.HTTPError, EdgeRequestError, ProtocolError) as exc:
        raise _fail(
            f"cannot read the network {url} serves, checked from {network.network_id}'s manifest: {exc}"
        ) from None
    return chain


def cmd_new(args: argparse.Namespace) -> None:
    chain = NetworkChain(_network(args.network)) if args.edge is None else _served(_network(args.network), args.edge)
    network = chain.network
    key = _experiment(network, args.experiment)
    sequence = args.sequence
    if sequence is None:
        if args.edge is None:
            raise _fail("give --sequence, or --edge to take the one after the last order the edge applied")
        try:
            orders = _with_client(args.edge, lambda c: c.run_orders(key))
            sequence = RunState.of(orders, chain.history(), key).sequence + 1
        except (httpx.HTTPError, EdgeRequestError, ProtocolError) as exc:
            raise _fail(f"cannot read the orders {args.edge} applied: {exc}") from None
    try:
        order = RunControl(network.network_id, key, args.action, sequence, int(time.time() * 1000), args.target)
    except ProtocolError as exc:
        raise _fail(str(exc)) from None
    _write_signed(args.order, SignedRunControl(order, ()))
    print(f"{args.order}: {args.action} {key} as order {sequence} of network {network.network_id}, unsigned")


def _validator_key(value: str) -> bytes:
    """A validator's public key: base64, or the storage folder of a validator (its ``identity.key``)."""
    if Path(value).is_dir():
        path = StorageConfig(Path(value)).identity_path
        if not path.is_file():
            raise _fail(f"no validator key at {path}")
        return NodeIdentity.load_or_create(path).public_key
    try:
        return b64decode(value, size=32)
    except ProtocolError:
        raise _fail(f"{value!r} is neither a validator's storage folder nor a base64 public key") from None


def _experiments(paths: list[Path]) -> list[ExperimentSpec]:
    specs = []
    for path in paths:
        try:
            wire = json.loads(path.read_bytes())
            specs += [ExperimentSpec.from_wire(w) for w in (wire if isinstance(wire, list) else [wire])]
        except (OSError, ValueError, ProtocolError) as exc:
            raise _fail(f"{path} is not an experiment spec (or a list of them): {exc}") from None
    return specs


def cmd_revise(args: argparse.Namespace) -> None:
    network = _served(_network(args.network), args.edge).network
    keys = [k for k in network.validator_keys if not any(pin_matches(pin, k) for pin in args.remove_validator)]
    if len(keys) != len(network.validator_keys) - len(args.remove_validator):
        raise _fail("each --remove-validator must name one validator of the network")
    keys += [key for key in map(_validator_key, args.add_validator) if key not in keys]
    try:
        current = _with_client(
            args.edge,
            lambda c: {spec.key: (c.current_head(spec.key), c.run_orders(spec.key)) for spec in network.experiments},
        )
        heads = {key: head for key, (head, _) in current.items() if head is not None}
        orders = {key: max((o.order.sequence for o in held), default=0) for key, (_, held) in current.items()}
        revision = NetworkRevision.of(
            network,
            int(time.time() * 1000),
            validator_keys=keys,
            quorum=args.quorum,
            experiments=_experiments(args.add_experiment),
            heads=heads,
            orders=orders,
        )
        revision.apply(network)  # refuses one that changes nothing or does not fit
    except (httpx.HTTPError, EdgeRequestError) as exc:
        raise _fail(f"cannot read the heads {args.edge} serves: {exc}") from None
    except ProtocolError as exc:
        raise _fail(str(exc)) from None
    _write_signed(args.order, SignedNetworkRevision(revision, ()))
    added = ", ".join(str(spec.key) for spec in revision.experiments) or "none"
    print(
        f"{args.order}: revision {revision.number} of network {network.network_id}, unsigned: experiments added "
        f"{added}; {revision.quorum} of {len(keys)} validators"
        + (f", handed over where {len(revision.handover)} experiments stand" if revision.handover else "")
    )


def _signing_terms(args: argparse.Namespace, signed: Signed) -> NetworkManifest:
    """The network whose validators sign ``signed``: the terms as the validator's storage holds them
    (the revisions it followed), or as an edge serves them (``--edge``); for a revision, the terms it
    revises."""
    try:
        chain = NetworkChain.load(_network(args.network), StorageConfig(args.storage).network_revisions_path)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    network = chain.network if args.edge is None else _served(chain.network, args.edge).network
    if isinstance(signed, SignedRunControl):
        return network
    if network.revision != signed.revision.number - 1 or terms_digest(network) != signed.revision.previous:
        raise _fail(
            f"revision {signed.revision.number} revises other terms than revision {network.revision} of the network "
            "held here; give --edge to read the revisions since"
        )
    return network


def cmd_sign(args: argparse.Namespace) -> None:
    signed = _read_signed(args.order)
    network = _signing_terms(args, signed)
    if signed.statement.network_id != network.network_id:
        raise _fail(f"the file is for network {signed.statement.network_id!r}, not {network.network_id!r}")
    path = StorageConfig(args.storage).identity_path
    if not path.is_file():
        raise _fail(f"no validator key at {path} (give the validator's --storage)")
    identity = NodeIdentity.load_or_create(path)
    if identity.public_key not in network.validator_key_set:
        raise _fail(f"the key at {path} ({fingerprint(identity.public_key)}) is not a validator of this network")
    signed = signed.signed_by(identity)
    _write_signed(args.order, signed)
    count = len(signed.signers(network))
    print(f"{args.order}: signed by {fingerprint(identity.public_key)}; {count} of the {network.quorum} needed")


def _submit_to(url: str, signed: Signed) -> tuple[bool, str]:
    """Whether the edge at ``url`` holds ``signed`` now (it applied it, or had before), and what it said."""
    client = EdgeClient(url, retries=1)
    try:
        if isinstance(signed, SignedNetworkRevision):
            client.submit_revision(signed)
            return True, f"applied; the network is at revision {signed.revision.number}"
        answer = client.submit_order(signed)
        return True, f"applied; the experiment is now {json.dumps(answer['state'])}"
    except EdgeRequestError as exc:
        if exc.status == 409 and _holds(client, signed):
            return True, "already applied this one"
        return False, f"refused ({exc.status} {exc.error}): {exc.detail}"
    except httpx.HTTPError as exc:
        return False, f"unreachable: {exc}"
    finally:
        client.close()


def _holds(client: EdgeClient, signed: Signed) -> bool:
    if isinstance(signed, SignedNetworkRevision):
        return any(held.revision == signed.revision for held in client.network_revisions())
    return any(o.order == signed.order for o in client.run_orders(signed.order.experiment))


def cmd_submit(args: argparse.Namespace) -> None:
    copies = [_read_signed(path) for path in args.order]
    if len({type(copy) for copy in copies}) != 1:
        raise _fail("these files hold an order and a revision; submit the copies of one")
    try:
        signed = type(copies[0]).gathered(copies)  # type: ignore[arg-type]
    except ProtocolError as exc:
        raise _fail(str(exc)) from None
    urls = [url for value in args.edge for url in value.split(",") if url]
    results = [(url, *_submit_to(url, signed)) for url in urls]
    for url, _, said in results:
        print(f"{url}: {said}")
    if not all(held for _, held, _ in results):
        raise _fail("not every edge holds it (see above)")


def cmd_show(args: argparse.Namespace) -> None:
    chain = _served(_network(args.network), args.edge)
    key = _experiment(chain.network, args.experiment)
    history = chain.history()
    try:
        orders = _with_client(args.edge, lambda c: c.run_orders(key))
        state = RunState.of(orders, history, key)
    except (httpx.HTTPError, EdgeRequestError) as exc:
        raise _fail(f"cannot read the orders {args.edge} applied: {exc}") from None
    except ProtocolError as exc:
        raise _fail(f"{args.edge} serves an order that does not check: {exc}") from None
    for signed in orders:
        order = signed.order
        signers = signed.signers(order_network(history, key, order.sequence))
        target = f" {order.target}" if order.target else ""
        print(
            f"{order.sequence}: {order.action}{target} issued {order.issued_at_ms} ms, signed by "
            + ", ".join(fingerprint(k) for k in sorted(signers))
        )
    print(f"{key}: {state.halted or 'running'} (last order {state.sequence})")


def cmd_revisions(args: argparse.Namespace) -> None:
    network = _network(args.network)
    try:
        chain = _with_client(args.edge, lambda c: c.network_revisions())
    except (httpx.HTTPError, EdgeRequestError, InvalidMessage) as exc:
        raise _fail(f"cannot read the revisions {args.edge} applied: {exc}") from None
    for signed in sorted(chain, key=lambda s: s.revision.number):
        revision = signed.revision
        try:
            revised = follow(network, [signed])
        except ProtocolError as exc:
            raise _fail(f"{args.edge} serves a revision that does not check: {exc}") from None
        signers = ", ".join(fingerprint(k) for k in sorted(signed.signers(network)))
        added = ", ".join(str(spec.key) for spec in revision.experiments) or "none"
        validators = ", ".join(fingerprint(k) for k in revision.validator_keys)
        print(
            f"{revision.number}: experiments added {added}; validators [{validators}], quorum {revision.quorum}; "
            f"signed by {signers}"
        )
        network = revised
    print(f"network {network.network_id}: revision {network.revision}, checked from {args.network}")


def add_control_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``dtn control`` and its commands, on the ``dtn`` parser's subcommands ``sub``."""
    control = sub.add_parser(
        "control", help="run-control orders and network revisions a quorum of validators signs (pause, ...)"
    )
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

    revise = commands.add_parser("revise", help="write an unsigned revision of the network's terms")
    revise.add_argument("order", type=Path, help="the revision file to write")
    revise.add_argument("--network", type=Path, required=True, help="network manifest JSON (its first terms)")
    revise.add_argument("--edge", required=True, help="edge URL: the revision and heads it serves now")
    revise.add_argument(
        "--add-experiment", type=Path, action="append", default=[], help="JSON of an experiment spec (or a list)"
    )
    revise.add_argument(
        "--add-validator", action="append", default=[], help="a base64 public key, or a validator's storage folder"
    )
    revise.add_argument("--remove-validator", action="append", default=[], help="a validator's fingerprint or key")
    revise.add_argument("--quorum", type=int, default=None, help="validators that make a head from then on")
    revise.set_defaults(run=cmd_revise)

    sign = commands.add_parser("sign", help="add this validator's signature to an order or revision file (offline)")
    sign.add_argument("order", type=Path, help="the order or revision file, signed in place")
    sign.add_argument("--network", type=Path, required=True, help="network manifest JSON")
    sign.add_argument("--storage", type=Path, required=True, help="the validator's storage (its identity.key)")
    sign.add_argument("--edge", default=None, help="read the revisions of the network since from this edge")
    sign.set_defaults(run=cmd_sign)

    submit = commands.add_parser("submit", help="submit an order or revision and its signatures to edges")
    submit.add_argument("order", type=Path, nargs="+", help="copies of one order or revision, signatures merged")
    submit.add_argument("--edge", required=True, action="append", help="edge URL (repeatable, or comma-separated)")
    submit.set_defaults(run=cmd_submit)

    show = commands.add_parser("show", help="print the orders an edge applied to an experiment, checked")
    show.add_argument("--network", type=Path, required=True, help="network manifest JSON")
    show.add_argument("--experiment", required=True, help="study/experiment/revision")
    show.add_argument("--edge", required=True, help="edge URL")
    show.set_defaults(run=cmd_show)

    revisions = commands.add_parser("revisions", help="print the revisions of the network an edge applied, checked")
    revisions.add_argument("--network", type=Path, required=True, help="network manifest JSON (its first terms)")
    revisions.add_argument("--edge", required=True, help="edge URL")
    revisions.set_defaults(run=cmd_revisions)
