"""``dtn export``: an experiment's best verified head as a checkpoint the user's framework loads.

``best_head`` keeps the heads a quorum of the network's validators vouches for, checked as trainers
check the head they train on (``protocol.window.head_to_train``: the proposer's signature and the
certificate's attestations, ``HeadDescriptor.verify_trusted``), each against the validators of its era
where revisions of the network changed them (``protocol.network_revisions.head_network``: given the
network at each revision, a head from before a change is checked against the validators who made it),
and picks the best of them: the lowest
validation loss (``val_loss``, measured by the validators on data trainers never see), the newest on a
tie. Heads that do not verify are refused, each named with why.

``write_checkpoint`` writes the head's tensors (checked against the model's names, shapes and float32)
with the official ``safetensors`` library as ``model.safetensors`` (tensors under their wire names:
a workload's pytree key paths, ``native_peer.workloads.wire_names``), and ``config.json``: the model as
the network's manifest declares it (``model``, what ``ModelSpec.from_wire`` or ``WorkloadModel.from_wire``
read back), the experiment, the network's id and quorum, and the head with its certificate (so anyone
holding the validator keys can check it again).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from protocol.errors import InvalidMessage, SignatureError
from protocol.ids import ExperimentKey
from protocol.manifests import NetworkManifest
from protocol.messages import HeadDescriptor
from protocol.model import Model
from protocol.network_revisions import head_network

__all__ = ["CHECKPOINT", "CONFIG", "FORMAT", "ExportError", "best_head", "write_checkpoint"]

FORMAT = "dtn-checkpoint/1"
CHECKPOINT = "model.safetensors"
CONFIG = "config.json"


class ExportError(ValueError):
    """No head to export, or one that cannot be written (one line)."""


def best_head(
    heads: Iterable[HeadDescriptor], history: Sequence[NetworkManifest], key: ExperimentKey
) -> tuple[HeadDescriptor, list[str]]:
    """The best head of ``key`` that a quorum of its era's validators vouches for (``history``: the
    network at each revision, in order; one network when it was never revised), and a line for each
    head refused."""
    network = history[-1]
    verified, refused = [], []
    for head in heads:
        if head.experiment != key:
            refused.append(f"head {head.head_id[:19]} (window {head.window}) is of {head.experiment}, not {key}")
            continue
        try:
            head_network(history, key, head.window).verify_head(head)
        except SignatureError as exc:
            refused.append(f"head {head.head_id[:19]} (window {head.window}): {exc}")
            continue
        verified.append(head)
    if not verified:
        why = (
            f"; refused: {refused[0]}" + (f" (and {len(refused) - 1} more)" if len(refused) > 1 else "")
            if refused
            else ""
        )
        raise ExportError(
            f"{key} has no head that {network.quorum} of the network's {len(network.validator_keys)} validators "
            f"vouch for{why}"
        )
    measured = [head for head in verified if "val_loss" in head.metrics] or verified
    return min(measured, key=lambda head: (head.metrics.get("val_loss", 0.0), -head.window)), refused


def write_checkpoint(
    out: Path, network: NetworkManifest, model: Model, head: HeadDescriptor, tensors: Mapping[str, np.ndarray]
) -> tuple[Path, Path]:
    """``out/model.safetensors`` and ``out/config.json`` of ``head`` (``tensors``: its artifact's,
    checked against ``model``); ``ExportError`` when they are not the model's."""
    try:
        model.check(tensors)
    except InvalidMessage as exc:
        raise ExportError(f"head {head.head_id[:19]}: its tensors are not {model.name}'s: {exc}") from None
    out.mkdir(parents=True, exist_ok=True)
    checkpoint, config = out / CHECKPOINT, out / CONFIG
    metadata = {"format": FORMAT, "experiment": str(head.experiment), "head_id": head.head_id, "model": model.name}
    save_file({name: np.ascontiguousarray(tensors[name]) for name in model.shapes}, checkpoint, metadata=metadata)
    document = {
        "format": FORMAT,
        "network_id": network.network_id,
        "quorum": network.quorum,
        "experiment": str(head.experiment),
        "model": model.to_wire(),
        "head": head.to_wire(),
    }
    config.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return checkpoint, config
