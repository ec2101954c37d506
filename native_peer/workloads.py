"""Workloads: your own JAX model, optimizer and loss as a native-only experiment's learner.

A network config names a workload by import path (``workload = "mypkg.models:learner"``): an attribute
that is a ``Workload`` or a callable returning one. ``workload(...)`` builds one from a plain pytree
``init(key) -> params`` and ``apply(params, x) -> logits``, or from a module factory ``make(key) ->
module`` (an Equinox or a Flax NNX module, called on a batch), with any optax transformation (schedule
included), or a function of the ``ExperimentSpec`` returning one. Parameters travel under their pytree
key paths written with ``.`` (``wire_names``: ``{"l1": {"kernel": ...}}`` is ``l1.kernel``).

``describe`` is what ``init-network`` writes into the manifest (``protocol.workload.WorkloadModel``):
the workload's shapes and its pin, the sha256 of every file of its package (``package_sources``) and
the versions of ``Workload.packages``. ``load`` builds the learner of a manifest's workload model on a
trainer or validator, and refuses (``WorkloadError``, one line naming what differs) unless the code
installed here and the packages' versions are the pinned ones; it checks before it imports the
workload. Nothing from the network is imported or run: the manifest only names code installed here.
An NNX module trains its ``nnx.Param`` variables; its other state stays as ``make`` built it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from protocol.errors import InvalidMessage
from protocol.manifests import ExperimentSpec, NetworkManifest
from protocol.model import Model, ModelSpec
from protocol.workload import MAX_SOURCE_FILES, WORKLOAD_PATH, WorkloadModel, pin_difference

from .learner import JaxLearner, softmax_cross_entropy, spec_learner

__all__ = [
    "Workload",
    "WorkloadError",
    "describe",
    "load",
    "model_learner",
    "network_learners",
    "one_line",
    "package_sources",
    "wire_names",
    "workload",
    "workload_learner",
]

PyTree = Any
Optimizer = optax.GradientTransformation | Callable[[ExperimentSpec], optax.GradientTransformation]
PINNED = ("jax", "jaxlib", "optax")  # whose versions every workload's pin holds (jaxlib: the compiler)


class WorkloadError(ValueError):
    """A workload that cannot be found, built or run as the manifest pins it (one line)."""


@dataclass(frozen=True)
class Workload:
    """A user's model as a learner's parts: ``init``/``apply`` over a parameter pytree, one example's
    ``input_shape``, the ``optimizer``, the ``objective`` (``classify`` or ``next-token``), whether
    it reads token ids (``tokens``), the ``packages`` whose versions the pin holds, and the loss."""

    init: Callable[[jax.Array], PyTree]
    apply: Callable[[PyTree, jax.Array], jax.Array]
    input_shape: tuple[int, ...]
    optimizer: Optimizer
    objective: str = "classify"
    tokens: bool = False
    packages: tuple[str, ...] = PINNED
    loss: Callable[[jax.Array, jax.Array], jax.Array] = softmax_cross_entropy

    def make_optimizer(self, spec: ExperimentSpec) -> optax.GradientTransformation:
        return self.optimizer if isinstance(self.optimizer, optax.GradientTransformation) else self.optimizer(spec)


def workload(
    model: Callable[[jax.Array], Any],
    apply: Callable[[PyTree, jax.Array], jax.Array] | None = None,
    *,
    input_shape: Sequence[int],
    optimizer: Optimizer,
    objective: str = "classify",
    tokens: bool = False,
) -> Workload:
    """The workload of a plain pytree (``model`` is ``init(key) -> params``, with ``apply``) or of a
    module (``model`` is ``make(key) -> module``, an Equinox or Flax NNX module, without ``apply``)."""
    if apply is not None:
        return Workload(model, apply, tuple(input_shape), optimizer, objective, tokens)
    init, module_apply, framework = _module(model)
    return Workload(init, module_apply, tuple(input_shape), optimizer, objective, tokens, (*PINNED, framework))


def _module(make: Callable[[jax.Array], Any]) -> tuple[Callable[[jax.Array], PyTree], Callable[..., jax.Array], str]:
    """``init``, ``apply`` and the framework's package of the module ``make`` builds."""
    template = make(jax.random.PRNGKey(0))
    eqx, nnx = sys.modules.get("equinox"), sys.modules.get("flax.nnx")
    if eqx is not None and isinstance(template, eqx.Module):
        _, static = eqx.partition(template, eqx.is_inexact_array)
        return (
            lambda key: eqx.partition(make(key), eqx.is_inexact_array)[0],
            lambda params, x: eqx.combine(params, static)(x),
            "equinox",
        )
    if nnx is not None and isinstance(template, nnx.Module):
        graph, _, rest = nnx.split(template, nnx.Param, ...)
        return (
            lambda key: nnx.to_pure_dict(nnx.split(make(key), nnx.Param, ...)[1]),
            lambda params, x: nnx.merge(graph, params, rest)(x),
            "flax",
        )
    raise WorkloadError(
        f"workload(): {type(template).__name__} is neither an Equinox nor a Flax NNX module; "
        "for a plain pytree pass init and apply"
    )


def wire_names(tree: PyTree) -> list[str]:
    """Each leaf's name on the wire, in ``tree``'s leaf order: its key path written with ``.``."""
    return [
        jax.tree_util.keystr(path, simple=True, separator=".") for path, _ in jax.tree_util.tree_leaves_with_path(tree)
    ]


def package_sources(path: str) -> dict[str, str]:
    """The sha256 of every file of the workload at import ``path``'s package (the folder of its module,
    without ``__pycache__``, ``.pyc`` and dot files), by path from the package's parent folder; a
    top-level module's own file alone. Finding the module imports its parent packages, not the module."""
    if not WORKLOAD_PATH.fullmatch(path):
        raise WorkloadError(f"workload {path!r} must be an import path module:attribute")
    module = path.partition(":")[0]
    try:
        found = importlib.util.find_spec(module)
    except ImportError as exc:
        raise WorkloadError(f"workload {path}: {exc}") from None
    if found is None or found.origin is None or not Path(found.origin).is_file():
        raise WorkloadError(f"workload {path}: no module {module} is installed here")
    origin = Path(found.origin)
    if found.submodule_search_locations is None and "." not in module:
        files, base = [origin], origin.parent
    else:
        base = origin.parent.parent
        files = [
            file
            for file in sorted(origin.parent.rglob("*"))
            if file.is_file()
            and file.suffix != ".pyc"
            and not any(part.startswith((".", "__pycache__")) for part in file.relative_to(origin.parent).parts)
        ]
    if len(files) > MAX_SOURCE_FILES:
        raise WorkloadError(
            f"workload {path}: its package {origin.parent} has {len(files)} files, more than {MAX_SOURCE_FILES}; "
            "give the workload a package of its own"
        )
    return {file.relative_to(base).as_posix(): hashlib.sha256(file.read_bytes()).hexdigest() for file in files}


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _imported(path: str) -> Workload:
    module, _, attribute = path.partition(":")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise WorkloadError(f"workload {path}: {exc}") from None
    except Exception as exc:  # the module's own code failed as it was imported
        raise WorkloadError(f"workload {path}: importing {module} raised {one_line(exc)}") from None
    try:
        made = found if isinstance(found, Workload) else found() if callable(found) else None
    except Exception as exc:  # the user's factory
        raise WorkloadError(f"workload {path}: {attribute}() raised {one_line(exc)}") from None
    if not isinstance(made, Workload):
        what = f"{attribute}() returned" if callable(found) else "is"
        raise WorkloadError(
            f"workload {path}: {what} {type(made if callable(found) else found).__name__}, not a Workload "
            "(native_peer.workloads: an attribute that is one or a callable returning one)"
        )
    return made


def one_line(exc: BaseException) -> str:
    """``exc`` as ``Type: first line of its message``."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _described(path: str, name: str, made: Workload, sources: Mapping[str, str]) -> WorkloadModel:
    versions = {package: _version(package) for package in made.packages}
    missing = [package for package, version in versions.items() if version is None]
    if missing:
        raise WorkloadError(f"workload {path}: packages {missing} are not installed here")
    example = jax.ShapeDtypeStruct((1, *made.input_shape), jnp.int32 if made.tokens else jnp.float32)
    try:
        template = jax.eval_shape(made.init, jax.random.PRNGKey(0))
        output = jax.eval_shape(made.apply, template, example).shape[1:]
        return WorkloadModel(
            name=name,
            workload=path,
            input_shape=made.input_shape,
            objective=made.objective,
            output=tuple(output),
            tokens=made.tokens,
            param_shapes=tuple(
                zip(
                    wire_names(template),
                    (tuple(leaf.shape) for leaf in jax.tree_util.tree_leaves(template)),
                    strict=True,
                )
            ),
            sources=tuple(sorted(sources.items())),
            versions=tuple(sorted((package, str(version)) for package, version in versions.items())),
        )
    except (InvalidMessage, TypeError, ValueError) as exc:
        raise WorkloadError(f"workload {path}: {exc}") from None
    except Exception as exc:  # the workload's own init or apply, traced
        raise WorkloadError(f"workload {path}: tracing its init and apply raised {one_line(exc)}") from None


def describe(path: str, name: str) -> WorkloadModel:
    """The manifest's record of the workload at import ``path`` as model ``name``: what ``init-network``
    writes (imports and builds the workload here; its shapes are traced, not computed)."""
    sources = package_sources(path)
    return _described(path, name, _imported(path), sources)


def load(model: WorkloadModel) -> JaxLearner:
    """The learner of a manifest's workload ``model``, built from the code installed here, once its
    files and packages' versions are the pinned ones (``WorkloadError`` naming the first difference)."""
    refuse = f"workload {model.workload} (model {model.name}, pin {model.digest[:12]})"
    sources = package_sources(model.workload)
    difference = pin_difference(model, sources, {package: _version(package) for package, _ in model.versions})
    if difference is not None:
        raise WorkloadError(f"{refuse}: {difference}; refusing to run it")
    made = _imported(model.workload)
    local = _described(model.workload, model.name, made, sources)
    if local != model:
        fields = [key for key, value in local.to_wire().items() if model.to_wire()[key] != value]
        raise WorkloadError(f"{refuse}: the same code builds another {', '.join(fields)} here; refusing to run it")
    return workload_learner(made, model)


def workload_learner(made: Workload, model: WorkloadModel) -> JaxLearner:
    """``made`` as a learner of ``model``: parameters to and from the wire by ``wire_names``."""
    leaves, treedef = jax.tree_util.tree_flatten(jax.eval_shape(made.init, jax.random.PRNGKey(0)))
    names = [name for name, _ in model.param_shapes]

    def to_tensors(params: PyTree) -> dict[str, np.ndarray]:
        return {
            name: np.asarray(leaf, np.float32)
            for name, leaf in zip(names, jax.tree_util.tree_leaves(params), strict=True)
        }

    def from_tensors(tensors: Mapping[str, np.ndarray]) -> PyTree:
        model.check(tensors)
        return treedef.unflatten(
            [jnp.asarray(tensors[name], leaf.dtype) for name, leaf in zip(names, leaves, strict=True)]
        )

    return JaxLearner(model, made.init, made.apply, to_tensors, from_tensors, made.make_optimizer, made.loss)


def model_learner(model: Model) -> JaxLearner:
    """The learner of a manifest's model: ``spec_learner`` (Adam) for a spec, ``load`` for a workload."""
    if isinstance(model, WorkloadModel):
        return load(model)
    assert isinstance(model, ModelSpec), model  # the manifest's two kinds of model
    return spec_learner(model)


def network_learners(network: NetworkManifest) -> dict[str, JaxLearner]:
    """A learner (``model_learner``) for every model the network's experiments train, by model name."""
    return {spec.model.name: model_learner(spec.model) for spec in network.experiments}
