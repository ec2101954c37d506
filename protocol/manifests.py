"""Manifests: what a network, a release, a workload, an experiment and a dataset look like.

``NetworkManifest`` is what a peer is told before it joins: the keys of the validators (only they
make a head canonical), the edge's key (it signs leases) and the experiments the network runs, each
with the whole spec of its model (``protocol.model``), from which every peer builds it, or the pinned
record of a workload of the network's own JAX code (``protocol.workload``), which only native peers run.
``FetchManifest`` is the dataset origin's table of shards, each with its sha256, so a peer verifies
every byte it downloads, and the kind of features they hold (``FEATURE_KINDS``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from .errors import InvalidMessage
from .fields import read_bool, read_float, read_int, read_list, read_object, read_sha256_hex, read_str
from .head_grid import GRIDS
from .ids import DatasetId, ExperimentKey, HeadId, ShardId
from .lease_work import MAX_LEASE_WORK_BITS
from .messages import HeadDescriptor
from .model import Model, ModelSpec
from .outer import OuterOptimizer
from .signing import b64decode, b64encode
from .updates import CODECS
from .workload import WorkloadModel

__all__ = [
    "FEATURE_KINDS",
    "LR_SCHEDULES",
    "MAX_VALIDATORS",
    "PROTOCOL_VERSION",
    "ExperimentSpec",
    "FetchManifest",
    "Handover",
    "NetworkManifest",
    "ReleaseManifest",
    "ShardEntry",
    "SupportedWorkload",
]

PROTOCOL_VERSION = 1
MAX_VALIDATORS = 64  # validator keys a network manifest may name
FEATURE_KINDS = ("pixels", "tokens")
"""What a shard's uint8 features are: ``pixels`` (k read as k / 256) or ``tokens`` (ids read as is)."""
LR_SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class ShardEntry:
    """One shard of a dataset as listed in ``fetch-manifest.json``."""

    shard_id: ShardId
    locator: str
    sha256: str
    size_bytes: int
    examples: int

    @classmethod
    def from_wire(cls, value: object) -> ShardEntry:
        d = read_object(value, "shard")
        digest = read_sha256_hex(d, "sha256")
        locator = read_str(d, "locator")
        if locator.startswith("/") or ".." in locator.split("/"):
            raise InvalidMessage(f"shard locator must be relative: {locator!r}")
        return cls(
            shard_id=ShardId(d.get("shard_id")),
            locator=locator,
            sha256=digest,
            size_bytes=read_int(d, "size_bytes"),
            examples=read_int(d, "examples", low=1),
        )


@dataclass(frozen=True)
class FetchManifest:
    """The shards of one dataset split that the edge serves.

    ``features`` is optional on the wire (absent: ``pixels``) and written only when it is another kind,
    so pixel datasets keep the manifest they had before token datasets existed."""

    dataset_id: DatasetId
    split: str
    feature_shape: tuple[int, ...]
    num_classes: int
    shards: tuple[ShardEntry, ...]
    features: str = "pixels"

    def __post_init__(self) -> None:
        if self.features not in FEATURE_KINDS:
            raise InvalidMessage(f"unknown feature kind {self.features!r}; kinds: {FEATURE_KINDS}")
        if not 2 <= self.num_classes <= 256:
            raise InvalidMessage(f"num_classes {self.num_classes} must be in [2, 256] (labels are uint8)")

    def shard(self, shard_id: str) -> ShardEntry:
        for entry in self.shards:
            if entry.shard_id == shard_id:
                return entry
        raise KeyError(shard_id)

    @property
    def shard_ids(self) -> tuple[ShardId, ...]:
        return tuple(entry.shard_id for entry in self.shards)

    @property
    def size_bytes(self) -> int:
        """The bytes of every shard of the split together."""
        return sum(entry.size_bytes for entry in self.shards)

    def to_wire(self) -> dict[str, Any]:
        return {
            "dataset_id": self.dataset_id,
            "split": self.split,
            "feature_shape": list(self.feature_shape),
            "num_classes": self.num_classes,
            "shards": [asdict(entry) for entry in self.shards],
            **({} if self.features == "pixels" else {"features": self.features}),
        }

    @classmethod
    def from_wire(cls, value: object) -> FetchManifest:
        d = read_object(value, "fetch manifest")
        shards = tuple(read_list(d, "shards", ShardEntry.from_wire, max_len=100_000))
        if len({s.shard_id for s in shards}) != len(shards):
            raise InvalidMessage("duplicate shard ids in fetch manifest")
        return cls(
            dataset_id=DatasetId(d.get("dataset_id")),
            split=read_str(d, "split", max_len=32),
            feature_shape=tuple(read_list(d, "feature_shape", _positive_int, max_len=8)),
            num_classes=read_int(d, "num_classes", low=2),
            shards=shards,
            features=read_str(d, "features", max_len=16) if "features" in d else "pixels",
        )


def _positive_int(value: object) -> int:
    if type(value) is not int or value < 1:
        raise InvalidMessage("expected a positive integer")
    return value


@dataclass(frozen=True)
class ExperimentSpec:
    """One experiment: its data, model and training hyperparameters, and its window policy.

    ``window_timeout_s`` is an upper bound: validators close a window as soon as every lease issued
    for it has a candidate, and otherwise after the deadline derived from observed window times.

    A lease holds ``shards_per_lease`` shards unless its trainer asks for more, up to
    ``max_shards_per_lease`` (``None``: exactly ``shards_per_lease``): a fast trainer sizes its
    leases to keep its core busy while the validator judges (``protocol.lease_size``). The
    validator's own update always takes one ``shards_per_lease`` window of steps
    (``protocol.judging.reference_steps``), whatever the trainers lease, and is trained once every
    ``anchor_every`` windows (``protocol.judging.anchor_window``; decision 0017). A lease costs a proof of
    work of ``lease_work_bits`` zero bits (``protocol.lease_work``; 0, the default: none).
    """

    key: ExperimentKey
    dataset_id: DatasetId
    model: Model  # a ModelSpec, or a WorkloadModel (native peers only: ``native_only``)
    learning_rate: float
    batch_size: int
    local_epochs: int
    shards_per_lease: int
    min_candidates: int = 1
    max_shards_per_lease: int | None = None
    window_timeout_s: float = 60.0
    screening: str = "balanced"
    codec: str = "fp32"  # how candidates carry their update (``protocol.updates``)
    outer_optimizer: str = OuterOptimizer.kind  # how a window's merged update moves the head (``protocol.outer``)
    outer_learning_rate: float = OuterOptimizer.learning_rate
    outer_momentum: float = OuterOptimizer.momentum
    # the inner learning rate by the window trained on: constant, or a cosine from ``learning_rate`` down
    # to ``lr_min_factor`` × it over ``lr_decay_windows`` windows (then held there)
    lr_schedule: str = "constant"
    lr_decay_windows: int = 0
    lr_min_factor: float = 0.1
    anchor_every: int = 4  # the validator trains its own update on every this-many-th head (decision 0017)
    lease_work_bits: int = 0  # the proof of work a lease costs (``protocol.lease_work``); 0: none
    head_grid: str = "exact"  # "int8": each head is its parent plus int8 steps (``protocol.head_grid``)

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise InvalidMessage(f"unknown update codec {self.codec!r}; codecs: {CODECS}")
        _ = self.outer  # raises InvalidMessage for an unknown outer optimizer or settings out of range
        if self.lr_schedule not in LR_SCHEDULES:
            raise InvalidMessage(f"unknown learning-rate schedule {self.lr_schedule!r}; schedules: {LR_SCHEDULES}")
        if self.lr_schedule == "cosine" and self.lr_decay_windows < 1:
            raise InvalidMessage("a cosine learning-rate schedule needs lr_decay_windows of 1 or more")
        if not 0.0 <= self.lr_min_factor <= 1.0:
            raise InvalidMessage(f"lr_min_factor {self.lr_min_factor} is not within [0, 1]")
        if self.max_shards_per_lease is not None and self.max_shards_per_lease < self.shards_per_lease:
            raise InvalidMessage("max_shards_per_lease must be at least shards_per_lease")
        if not 0 <= self.lease_work_bits <= MAX_LEASE_WORK_BITS:
            raise InvalidMessage(f"lease_work_bits {self.lease_work_bits} is not within [0, {MAX_LEASE_WORK_BITS}]")
        if self.head_grid not in GRIDS:
            raise InvalidMessage(f"unknown head grid {self.head_grid!r}; grids: {GRIDS}")

    @property
    def lease_bounds(self) -> tuple[int, int]:
        """The fewest and the most shards a lease holds."""
        return self.shards_per_lease, self.max_shards_per_lease or self.shards_per_lease

    def lease_shards(self, requested: int | None) -> int:
        """How many shards a lease asked for ``requested`` holds: within ``lease_bounds``,
        ``shards_per_lease`` when not asked."""
        least, most = self.lease_bounds
        return min(max(requested or least, least), most)

    def learning_rate_at(self, window: int) -> float:
        """The inner learning rate of the window trained on the head of ``window`` (every peer alike)."""
        if self.lr_schedule == "constant":
            return self.learning_rate
        progress = min(max(window, 0), self.lr_decay_windows) / self.lr_decay_windows
        factor = self.lr_min_factor + (1.0 - self.lr_min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.learning_rate * factor

    def refusal(self, peer_kind: str) -> str | None:
        """Why a trainer of ``peer_kind`` may not train this experiment (browser peers run no JAX code:
        not a workload model's); ``None`` when it may."""
        if peer_kind == "browser" and self.model.native_only:
            return (
                f"experiment {self.key} is native-only: its model {self.model.name} is JAX code (a workload), "
                "which browser peers do not run"
            )
        return None

    @property
    def outer(self) -> OuterOptimizer:
        return OuterOptimizer(self.outer_optimizer, self.outer_learning_rate, self.outer_momentum)

    def check_dataset(self, dataset: FetchManifest) -> None:
        """Raise ``InvalidMessage`` naming the first mismatch unless the model fits ``dataset``: its input
        shape is the features' shape, it reads the features' kind (an embedding first for token ids), and
        its classes (a next-token model's vocabulary) are the dataset's label range."""
        model = self.model
        if dataset.dataset_id != self.dataset_id:
            raise InvalidMessage(f"dataset {dataset.dataset_id} is not the experiment's dataset {self.dataset_id}")
        if model.input_shape != dataset.feature_shape:
            raise InvalidMessage(
                f"model input {_features(model.input_shape)}, dataset {dataset.dataset_id} has "
                f"{_features(dataset.feature_shape)}"
            )
        if model.reads_tokens != (dataset.features == "tokens"):
            reads = "token ids (an embedding first)" if model.reads_tokens else "pixels (no embedding first)"
            raise InvalidMessage(f"model reads {reads}, dataset {dataset.dataset_id} holds {dataset.features}")
        if model.objective == "next-token" and dataset.features != "tokens":
            raise InvalidMessage(f"a next-token model needs tokens, dataset {dataset.dataset_id} holds pixels")
        if model.classes != dataset.num_classes:
            what = "vocabulary {} tokens" if model.objective == "next-token" else "output {} classes"
            raise InvalidMessage(
                f"model {what.format(model.classes)}, dataset {dataset.dataset_id} has {dataset.num_classes}"
            )

    def to_wire(self) -> dict[str, Any]:
        shallow = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**shallow, "key": str(self.key), "model": self.model.to_wire()}

    @classmethod
    def from_wire(cls, value: object) -> ExperimentSpec:
        d = read_object(value, "experiment")
        return cls(
            key=ExperimentKey.parse(d.get("key")),
            dataset_id=DatasetId(d.get("dataset_id")),
            model=_model(d),
            learning_rate=read_float(d, "learning_rate"),
            batch_size=read_int(d, "batch_size", low=1, high=65536),
            local_epochs=read_int(d, "local_epochs", low=1, high=1000),
            shards_per_lease=read_int(d, "shards_per_lease", low=1, high=256),
            min_candidates=read_int(d, "min_candidates", low=1, high=10_000),
            max_shards_per_lease=read_int(d, "max_shards_per_lease", low=1, high=256)
            if d.get("max_shards_per_lease") is not None
            else None,
            window_timeout_s=read_float(d, "window_timeout_s"),
            screening=read_str(d, "screening", max_len=32),
            codec=read_str(d, "codec", max_len=8) if "codec" in d else "fp32",
            outer_optimizer=read_str(d, "outer_optimizer", max_len=16)
            if "outer_optimizer" in d
            else OuterOptimizer.kind,
            outer_learning_rate=read_float(d, "outer_learning_rate")
            if "outer_learning_rate" in d
            else OuterOptimizer.learning_rate,
            outer_momentum=read_float(d, "outer_momentum") if "outer_momentum" in d else OuterOptimizer.momentum,
            lr_schedule=read_str(d, "lr_schedule", max_len=16) if "lr_schedule" in d else "constant",
            lr_decay_windows=read_int(d, "lr_decay_windows", low=0, high=10**9) if "lr_decay_windows" in d else 0,
            lr_min_factor=read_float(d, "lr_min_factor") if "lr_min_factor" in d else 0.1,
            anchor_every=read_int(d, "anchor_every", low=1, high=1000) if "anchor_every" in d else 4,
            lease_work_bits=read_int(d, "lease_work_bits", low=0, high=MAX_LEASE_WORK_BITS)
            if "lease_work_bits" in d
            else 0,
            head_grid=read_str(d, "head_grid", max_len=8) if "head_grid" in d else "exact",
        )


def _model(d: Mapping[str, object]) -> Model:
    """Field ``model``: a ``WorkloadModel`` when it names a workload, else a ``ModelSpec``."""
    value = d.get("model")
    if isinstance(value, str):
        raise InvalidMessage(
            f"field 'model' names a model ({value!r}) where a manifest holds its spec: write the manifest "
            "again from its config (python -m tools init-network)"
        )
    try:
        return (
            WorkloadModel.from_wire(value)
            if isinstance(value, dict) and "workload" in value
            else ModelSpec.from_wire(value)
        )
    except InvalidMessage as exc:
        raise InvalidMessage(f"field 'model': {exc}") from None


def _features(shape: tuple[int, ...]) -> str:
    return f"{shape[0]} features" if len(shape) == 1 else f"features of shape {list(shape)}"


@dataclass(frozen=True)
class Handover:
    """Where one experiment stood when a revision changed the validators: its current head and that
    head's window (``None``, ``-1``: none yet), and the sequence of the last run-control order applied
    to it (0: none). The validators before the change vouch for them by signing the revision: heads up
    to that window and orders up to that sequence are theirs, what comes after the new validators'."""

    experiment: ExperimentKey
    head: HeadId | None
    window: int = -1
    orders: int = 0

    def __post_init__(self) -> None:
        if (self.head is None) != (self.window < 0):
            raise InvalidMessage(f"the handover of {self.experiment} names a head with its window, or neither")

    def to_wire(self) -> dict[str, Any]:
        return {"head": self.head, "window": self.window, "orders": self.orders}


@dataclass(frozen=True)
class NetworkManifest:
    """Everything a peer must know before it joins a network.

    ``revision`` counts the revisions applied to the network's first terms (``protocol.network_revisions``:
    each signed by a quorum of the validators before it). ``handover`` says, for the last revision that
    changed the validators, where each experiment stood (``Handover``): the validators before it vouched
    for those heads by signing the revision, so they are trusted as certified (``verify_head``) until
    the new validators certify the next. Both are written only when set, so a network never revised keeps the
    wire form (and the validators' signatures over its terms) it had before revisions existed."""

    network_id: str
    validator_keys: tuple[bytes, ...]
    experiments: tuple[ExperimentSpec, ...]
    edge_key: bytes | None = None  # filled in by the edge that serves the manifest
    admission_required: bool = False
    quorum: int = 1  # distinct validators that must vouch for a head before it is canonical
    revision: int = 0
    handover: tuple[Handover, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.quorum <= max(1, len(self.validator_keys)):
            raise InvalidMessage(
                f"quorum {self.quorum} must be between 1 and the {len(self.validator_keys)} validators"
            )
        if len(set(self.validator_keys)) != len(self.validator_keys):
            raise InvalidMessage("a validator key is listed twice")
        if len({spec.key for spec in self.experiments}) != len(self.experiments):
            raise InvalidMessage("an experiment is listed twice")
        models: dict[str, Model] = {}
        for spec in self.experiments:  # peers keep one learner per model name
            if models.setdefault(spec.model.name, spec.model) != spec.model:
                raise InvalidMessage(f"experiments declare two different models named {spec.model.name}")

    def verify_head(self, head: HeadDescriptor) -> None:
        """Raise ``SignatureError`` unless this network trusts ``head``: a quorum of its validators vouch
        for it (``HeadDescriptor.verify_trusted``), or it is the head its last change of validators
        handed over."""
        if any(h.experiment == head.experiment and h.head == head.head_id for h in self.handover):
            return
        head.verify_trusted(self.validator_key_set, self.quorum)

    def experiment(self, key: str) -> ExperimentSpec:
        for spec in self.experiments:
            if spec.key == key:
                return spec
        raise KeyError(key)

    @property
    def validator_key_set(self) -> frozenset[bytes]:
        return frozenset(self.validator_keys)

    def to_wire(self) -> dict[str, Any]:
        return {
            "network_id": self.network_id,
            "edge_key": None if self.edge_key is None else b64encode(self.edge_key),
            "validator_keys": [b64encode(k) for k in self.validator_keys],
            "experiments": [spec.to_wire() for spec in self.experiments],
            "admission_required": self.admission_required,
            "quorum": self.quorum,
            **({"revision": self.revision} if self.revision else {}),
            **({"handover": handover_wire(self.handover)} if self.handover else {}),
        }

    @classmethod
    def from_wire(cls, value: object) -> NetworkManifest:
        d = read_object(value, "network manifest")
        return cls(
            network_id=read_str(d, "network_id", max_len=64),
            edge_key=None if d.get("edge_key") is None else b64decode(d.get("edge_key"), size=32),
            validator_keys=tuple(
                read_list(d, "validator_keys", lambda k: b64decode(k, size=32), max_len=MAX_VALIDATORS)
            ),
            experiments=tuple(read_list(d, "experiments", ExperimentSpec.from_wire, max_len=256)),
            admission_required=read_bool(d, "admission_required") if "admission_required" in d else False,
            quorum=read_int(d, "quorum", low=1, high=64) if "quorum" in d else 1,
            revision=read_int(d, "revision", low=0, high=10**9) if "revision" in d else 0,
            handover=read_handover(d),
        )


def handover_wire(handover: Sequence[Handover]) -> dict[str, Any]:
    return {str(h.experiment): h.to_wire() for h in handover}


def read_handover(d: Mapping[str, object]) -> tuple[Handover, ...]:
    """Field ``handover``: ``{"study/experiment/revision": {"head": id or null, "window": n, "orders": n}}``,
    absent: none."""
    value = read_object(d.get("handover"), "handover") if "handover" in d else {}
    if len(value) > 256:
        raise InvalidMessage("field 'handover' names at most 256 experiments")
    found = []
    for key, entry in value.items():
        fields_ = read_object(entry, "handover entry")
        head = fields_.get("head")
        found.append(
            Handover(
                ExperimentKey.parse(key),
                None if head is None else HeadId(head),
                read_int(fields_, "window", low=-1),
                read_int(fields_, "orders", low=0),
            )
        )
    return tuple(sorted(found, key=lambda h: h.experiment))


@dataclass(frozen=True)
class SupportedWorkload:
    """A workload a peer can run: a model architecture trained on a dataset."""

    workload_id: str
    model: str  # the model's name
    dataset_id: DatasetId

    def supports(self, spec: ExperimentSpec) -> bool:
        return spec.model.name == self.model and spec.dataset_id == self.dataset_id


@dataclass(frozen=True)
class ReleaseManifest:
    """The software release a peer runs; peers of another protocol version are turned away."""

    release_id: str
    protocol_version: int = PROTOCOL_VERSION
