"""Workload models: an experiment whose model is JAX code of the network's own, native peers only.

A network config may name a workload by import path (``workload = "mypkg.models:learner"``); the
operator's ``init-network`` imports it there, once, and writes into the manifest what every peer must
know of it (a ``WorkloadModel``): the import path, one example's input shape, the objective, the
output's shape, the parameters' wire names and shapes in the model's order, and its pin: the sha256
of every file of the workload's package (``sources``) and the versions of the packages it was checked
with (``versions``: jax, jaxlib, optax, and flax or equinox where used). Nothing in a manifest is ever
imported or run: a native peer runs the workload only from code already installed where it runs, and
only when that code and those versions are the pinned ones (``pin_difference``, ``native_peer.workloads``).
Browser peers cannot run JAX code, so a workload model is ``native_only``.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import InvalidMessage
from .fields import read_bool, read_list, read_object, read_str
from .layers import Shape
from .model import MAX_PARAMS, MODEL_NAME, Model, check_input_shape, read_input_shape
from .signing import canonical_json

__all__ = [
    "MAX_PARAM_RANK",
    "MAX_SOURCE_FILES",
    "MAX_TENSORS",
    "PARAM_NAME",
    "WORKLOAD_PATH",
    "WorkloadModel",
    "pin_difference",
]

WORKLOAD_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
PARAM_NAME = re.compile(
    r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}"
)  # a key path written with "." (``native_peer.workloads``)
_PACKAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_TENSORS = 4096  # parameter tensors of one workload
MAX_PARAM_RANK = 8
MAX_SOURCE_FILES = 1000  # files of one workload's package
MAX_PATH = 256


@dataclass(frozen=True)
class WorkloadModel(Model):
    """The manifest's record of a workload: what the protocol needs of its model, and its pin.

    ``param_shapes``: (wire name, shape) in the model's order; ``output``: one example's logits shape;
    ``tokens``: whether it reads token ids; ``sources``: (path within the package's parent folder,
    sha256) sorted by path; ``versions``: (package, version) sorted by package. Construction checks
    every field and raises ``InvalidMessage``."""

    native_only: ClassVar[bool] = True

    name: str
    workload: str
    input_shape: Shape
    objective: str
    output: Shape
    tokens: bool
    param_shapes: tuple[tuple[str, Shape], ...]
    sources: tuple[tuple[str, str], ...]
    versions: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not MODEL_NAME.fullmatch(self.name):
            raise InvalidMessage(f"model name {self.name!r} must match {MODEL_NAME.pattern}")
        if not isinstance(self.workload, str) or len(self.workload) > 200 or not WORKLOAD_PATH.fullmatch(self.workload):
            raise InvalidMessage(f"workload {self.workload!r} must be an import path module:attribute")
        check_input_shape(self.input_shape)
        self.check_output(self.output)
        if not 1 <= len(self.param_shapes) <= MAX_TENSORS:
            raise InvalidMessage(f"a workload has 1 to {MAX_TENSORS} parameter tensors, not {len(self.param_shapes)}")
        for name, shape in self.param_shapes:
            if not isinstance(name, str) or not PARAM_NAME.fullmatch(name):
                raise InvalidMessage(f"parameter name {name!r} must match {PARAM_NAME.pattern}")
            if len(shape) > MAX_PARAM_RANK or not all(type(d) is int and d >= 1 for d in shape):
                raise InvalidMessage(f"parameter {name}: shape {list(shape)} must be up to {MAX_PARAM_RANK} sizes >= 1")
        if len(self.shapes) != len(self.param_shapes):
            raise InvalidMessage("a workload's parameter names must be distinct")
        if sum(math.prod(shape) for _, shape in self.param_shapes) > MAX_PARAMS:
            raise InvalidMessage(f"{self.name} has more than {MAX_PARAMS} parameters")
        if not 1 <= len(self.sources) <= MAX_SOURCE_FILES or list(self.sources) != sorted(dict(self.sources).items()):
            raise InvalidMessage(f"a workload pins 1 to {MAX_SOURCE_FILES} distinct files, sorted by path")
        for path, digest in self.sources:
            if not 1 <= len(path) <= MAX_PATH or path.startswith("/") or ".." in path.split("/"):
                raise InvalidMessage(f"pinned file {path!r} must be a relative path of up to {MAX_PATH} characters")
            if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
                raise InvalidMessage(f"pinned file {path}: sha256 must be 64 lowercase hex digits")
        if not self.versions or list(self.versions) != sorted(dict(self.versions).items()):
            raise InvalidMessage("a workload pins the versions of its packages, distinct and sorted by package")
        for package, version in self.versions:
            if not _PACKAGE.fullmatch(package) or not 1 <= len(version) <= 64:
                raise InvalidMessage(f"pinned package {package!r} {version!r}: a package name and a version")

    @property
    def shapes(self) -> dict[str, Shape]:
        return dict(self.param_shapes)

    @property
    def classes(self) -> int:
        return self.output[-1]

    @property
    def reads_tokens(self) -> bool:
        return self.tokens

    @property
    def digest(self) -> str:
        """The pin as one sha256 (hex) over the pinned files' digests and the packages' versions."""
        return hashlib.sha256(canonical_json({"sources": self.sources, "versions": self.versions})).hexdigest()

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "workload": self.workload,
            "input_shape": list(self.input_shape),
            "objective": self.objective,
            "output": list(self.output),
            "tokens": self.tokens,
            "params": [[name, list(shape)] for name, shape in self.param_shapes],
            "sources": dict(self.sources),
            "versions": dict(self.versions),
        }

    @classmethod
    def from_wire(cls, value: object) -> WorkloadModel:
        d = read_object(value, "workload model")
        unknown = set(d) - {
            "name",
            "workload",
            "input_shape",
            "objective",
            "output",
            "tokens",
            "params",
            "sources",
            "versions",
        }
        if unknown:
            raise InvalidMessage(f"a workload model has no fields {sorted(unknown)}")
        return cls(
            name=read_str(d, "name", max_len=64),
            workload=read_str(d, "workload", max_len=200),
            input_shape=read_input_shape(d),
            objective=read_str(d, "objective", max_len=16),
            output=_shape(d.get("output"), "output"),
            tokens=read_bool(d, "tokens"),
            param_shapes=tuple(read_list(d, "params", _param, max_len=MAX_TENSORS)),
            sources=_strings(d, "sources", MAX_SOURCE_FILES),
            versions=_strings(d, "versions", 16),
        )


def _shape(value: object, what: str) -> Shape:
    if not isinstance(value, list) or len(value) > MAX_PARAM_RANK or not all(type(v) is int for v in value):
        raise InvalidMessage(f"{what}: expected a list of up to {MAX_PARAM_RANK} integers")
    return tuple(value)


def _param(value: object) -> tuple[str, Shape]:
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], str):
        raise InvalidMessage("field 'params': each entry must be [name, shape]")
    return value[0], _shape(value[1], f"parameter {value[0][:128]!r}")


def _strings(d: Mapping[str, object], key: str, max_len: int) -> tuple[tuple[str, str], ...]:
    table = d.get(key)
    if not isinstance(table, dict) or len(table) > max_len:
        raise InvalidMessage(f"field {key!r} must be an object of up to {max_len} entries")
    if not all(
        isinstance(k, str) and len(k) <= MAX_PATH and isinstance(v, str) and len(v) <= 64 for k, v in table.items()
    ):
        raise InvalidMessage(f"field {key!r} must map strings to strings of up to 64 characters")
    return tuple(sorted(table.items()))


def pin_difference(pinned: WorkloadModel, sources: Mapping[str, str], versions: Mapping[str, str | None]) -> str | None:
    """What differs between ``pinned``'s pin and the local one (``sources``: path -> sha256 of the
    workload's files here; ``versions``: package -> its version here, ``None`` when not installed),
    in a few words naming the first difference; ``None`` when they are the same."""
    for package, version in pinned.versions:
        here = versions.get(package)
        if here != version:
            return f"{package} {here or 'not installed'} here, the manifest pins {version}"
    files = dict(pinned.sources)
    for path in sorted(files.keys() | sources.keys()):
        if path not in sources:
            return f"pinned file {path} is missing here"
        if path not in files:
            return f"file {path} is here but not pinned"
        if sources[path] != files[path]:
            return f"file {path} differs from the pinned one (sha256 {sources[path][:12]}… here, {files[path][:12]}… pinned)"
    return None
