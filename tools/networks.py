"""Networks from config files: ``read_experiments`` (a file's experiments, each with its model),
``mnist_network`` (the demo's network, ``networks/mnist.toml``) and ``write_network`` (validator identities
plus the manifest file, once every experiment's model fits its prepared dataset).

A config file (TOML, or JSON when it ends in ``.json``) holds ``experiments``: a list of tables, each one
``ExperimentSpec`` by its field names (``protocol.manifests``: key, dataset_id, model, learning_rate,
batch_size, local_epochs, codec, outer_optimizer, outer_learning_rate, outer_momentum, shards_per_lease,
max_shards_per_lease, min_candidates, window_timeout_s, screening, lr_schedule, ...), and optionally
``models``: one table per model of the network's own (``[models.<name>]``: input_shape, layers,
objective; ``native_peer.models``). An experiment's ``model`` names one of those or a built-in model
(``networks/models.toml``); the manifest carries the model's whole spec. An experiment with a
``workload`` (an import path, ``mypkg.models:learner``) trains that JAX code of the operator's own,
on native peers only, as the model its ``model`` names (``native_peer.workloads``): the manifest
carries its shapes and its pin (the hash of its files, the versions of jax and optax it was checked
with). Fields with a default may be left out; anything else wrong (an unknown field, a value out of
range, an unknown model, layer or screening preset, layers whose shapes do not chain, a workload that
cannot be imported, a key twice) is a ``NetworkConfigError`` naming the file, the experiment or
model, and the field. Config files live in ``networks/`` at the top of the
repository, next to ``deploy/``: they are what an operator copies and edits, not code.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from datasets.layout import dataset_manifest, manifest_path
from native_peer.identity import NodeIdentity
from native_peer.models import BUILTIN_MODELS, builtin_models, read_models
from native_peer.storage import StorageConfig
from protocol.errors import InvalidMessage
from protocol.ids import ExperimentKey
from protocol.manifests import ExperimentSpec, NetworkManifest
from protocol.model import Model, ModelSpec
from protocol.screening import PRESETS

__all__ = [
    "BASELINE",
    "DATASETS",
    "LOW_LR",
    "MNIST_NETWORK",
    "NetworkConfigError",
    "check_datasets",
    "mnist_network",
    "read_experiments",
    "write_network",
]

MNIST_NETWORK = Path(__file__).resolve().parent.parent / "networks" / "mnist.toml"
DATASETS = Path("var/datasets")  # where `python -m datasets.*` and `dtn dataset shard` prepare them by default
BASELINE = ExperimentKey.parse("study/mnist/rev-1")  # the experiments of MNIST_NETWORK
LOW_LR = ExperimentKey.parse("study/mnist-low-lr/rev-1")

_FIELDS = {f.name for f in fields(ExperimentSpec)}
_CONFIG_FIELDS = _FIELDS | {"workload"}  # an experiment's table: its spec's fields, and where its workload is
_DEFAULTS = {f.name: f.default for f in fields(ExperimentSpec) if f.default is not MISSING}


class NetworkConfigError(ValueError):
    """A network config file that cannot be read or does not describe valid experiments."""


def read_experiments(path: Path) -> tuple[ExperimentSpec, ...]:
    """The experiments of the network config file at ``path``, each checked as peers check them."""
    try:
        text = path.read_text()
        config = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise NetworkConfigError(f"{path}: {exc}") from None
    if not isinstance(config, dict) or "experiments" not in config or set(config) - {"experiments", "models"}:
        found = sorted(config) if isinstance(config, dict) else type(config).__name__
        raise NetworkConfigError(f"{path}: expected `experiments` and, optionally, `models`; found {found}")
    entries = config["experiments"]
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise NetworkConfigError(f"{path}: `experiments` must be a non-empty list of tables")
    models = _models(config.get("models", {}), path)
    specs: dict[str, ExperimentSpec] = {}
    for number, entry in enumerate(entries, 1):
        spec = _experiment(entry, models, f"{path}: experiment {entry.get('key', f'#{number}')!s}")
        if spec.key in specs:
            raise NetworkConfigError(f"{path}: experiment {spec.key} is listed twice")
        specs[spec.key] = spec
    return tuple(specs.values())


def _models(tables: object, path: Path) -> dict[str, ModelSpec]:
    """The built-in models and the file's own (which may not take a built-in one's name)."""
    try:
        own = read_models(tables)
    except InvalidMessage as exc:
        raise NetworkConfigError(f"{path}: {exc}") from None
    builtin = builtin_models()
    for name in own:
        if name in builtin:
            raise NetworkConfigError(f"{path}: model {name}: a built-in model ({BUILTIN_MODELS}) has this name")
    return {**builtin, **own}


def _experiment(entry: dict[str, Any], models: dict[str, ModelSpec], where: str) -> ExperimentSpec:
    unknown = sorted(set(entry) - _CONFIG_FIELDS)
    if unknown:
        raise NetworkConfigError(f"{where}: unknown field(s) {unknown}; fields: {sorted(_CONFIG_FIELDS)}")
    entry = dict(entry)
    path, name = entry.pop("workload", None), entry.get("model")
    if not isinstance(name, str):
        raise NetworkConfigError(f"{where}: field 'model' must name a model (built-in or a [models.<name>] table)")
    if path is not None:
        model = _workload(path, name, models, where)
    elif name in models:
        model = models[name]
    else:
        raise NetworkConfigError(f"{where}: field 'model': unknown model {name!r}; models: {sorted(models)}")
    try:
        spec = ExperimentSpec.from_wire(_DEFAULTS | entry | {"model": model.to_wire()})
    except InvalidMessage as exc:
        raise NetworkConfigError(f"{where}: {exc}") from None
    if spec.screening not in PRESETS:
        raise NetworkConfigError(
            f"{where}: field 'screening': unknown preset {spec.screening!r}; presets: {sorted(PRESETS)}"
        )
    return spec


def _workload(path: object, name: str, models: dict[str, ModelSpec], where: str) -> Model:
    """The workload at import ``path`` as model ``name`` (``native_peer.workloads.describe``: the
    operator's own code, imported here)."""
    if name in models:
        raise NetworkConfigError(
            f"{where}: field 'model': {name} is a declared or built-in model; a workload's needs a name of its own"
        )
    if not isinstance(path, str):
        raise NetworkConfigError(f"{where}: field 'workload' must be an import path module:attribute")
    from native_peer.workloads import WorkloadError, describe  # JAX, imported only for a workload

    try:
        return describe(path, name)
    except WorkloadError as exc:
        raise NetworkConfigError(f"{where}: {exc}") from None


def check_datasets(experiments: Sequence[ExperimentSpec], datasets: Path, config: Path) -> None:
    """Raise ``NetworkConfigError`` naming the first experiment (of ``config``) whose dataset is not
    prepared under ``datasets`` or whose model does not fit it (``ExperimentSpec.check_dataset``)."""
    for spec in experiments:
        where = f"{config}: experiment {spec.key}"
        root = datasets / spec.dataset_id
        try:
            dataset = dataset_manifest(root)
        except FileNotFoundError:
            raise NetworkConfigError(
                f"{where}: dataset {spec.dataset_id} is not prepared under {datasets} (no {manifest_path(root)}); "
                "prepare it first (docs/datasets.md) or pass --datasets"
            ) from None
        except (OSError, ValueError, InvalidMessage) as exc:
            raise NetworkConfigError(f"{where}: {manifest_path(root)}: {exc}") from None
        try:
            spec.check_dataset(dataset)
        except InvalidMessage as exc:
            raise NetworkConfigError(f"{where}: {exc}") from None


def mnist_network(validator_key: bytes, network_id: str = "demo") -> NetworkManifest:
    """The demo's network (``MNIST_NETWORK``: ``BASELINE`` and ``LOW_LR``) with one validator."""
    return NetworkManifest(network_id, (validator_key,), read_experiments(MNIST_NETWORK))


def write_network(
    validator_storages: Sequence[Path],
    out: Path,
    network_id: str = "demo",
    quorum: int = 1,
    config: Path = MNIST_NETWORK,
    datasets: Path = DATASETS,
) -> NetworkManifest:
    """Create (or reuse) a validator identity under each of ``validator_storages`` and write their
    network running ``config``'s experiments to ``out``: a head is canonical once ``quorum`` of them
    vouch for it. Nothing is written unless every experiment's model fits its dataset as prepared
    under ``datasets`` (``check_datasets``)."""
    experiments = read_experiments(config)
    check_datasets(experiments, datasets, config)
    keys = tuple(
        NodeIdentity.load_or_create(StorageConfig(path).identity_path).public_key for path in validator_storages
    )
    network = NetworkManifest(network_id, keys, experiments, quorum=quorum)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(network.to_wire(), indent=1))
    return network
