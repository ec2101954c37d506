"""Models from config files: ``[models.<name>]`` tables, each one model spec, and the built-in ones.

A table holds ``input_shape`` (one example), ``layers`` (the chain of ``protocol.layers``, each
``{type, name, <its fields>}``) and optionally ``objective`` (``classify``, the default, or
``next-token``): ``ModelSpec``'s wire form without its name, which is the table's. Anything else (an
unknown field, an unknown layer type or layer field, sizes out of range, layers whose shapes do not
chain) is an ``InvalidMessage`` naming the model and the field. ``networks/models.toml``
(``BUILTIN_MODELS``) holds the built-in models, which any network config (``tools.networks``) may name
without declaring them; a network config declares its own models in the same tables.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from protocol.errors import InvalidMessage
from protocol.model import ModelSpec

__all__ = ["BUILTIN_MODELS", "MODEL_FIELDS", "builtin_model", "builtin_models", "read_models"]

BUILTIN_MODELS = Path(__file__).resolve().parent.parent / "networks" / "models.toml"
MODEL_FIELDS = ("input_shape", "layers", "objective")


def read_models(tables: object) -> dict[str, ModelSpec]:
    """The models of a config's ``models`` table (model name -> its table)."""
    if not isinstance(tables, dict):
        raise InvalidMessage("`models` must hold one table per model ([models.<name>])")
    return {name: _model(name, table) for name, table in tables.items()}


def _model(name: str, table: object) -> ModelSpec:
    where = f"model {name}"
    if not isinstance(table, dict):
        raise InvalidMessage(f"{where}: must be a table of {', '.join(MODEL_FIELDS)}")
    unknown = sorted(set(table) - set(MODEL_FIELDS))
    if unknown:
        raise InvalidMessage(f"{where}: unknown field(s) {unknown}; fields: {list(MODEL_FIELDS)}")
    try:
        return ModelSpec.from_wire({"objective": "classify", **table, "name": name})
    except InvalidMessage as exc:
        raise InvalidMessage(f"{where}: {exc}") from None


@functools.cache
def builtin_models() -> Mapping[str, ModelSpec]:
    """The models of ``BUILTIN_MODELS`` by name (read once)."""
    try:
        config = tomllib.loads(BUILTIN_MODELS.read_text())
        if set(config) != {"models"}:
            raise InvalidMessage(f"expected one field, `models`; found {sorted(config)}")
        return MappingProxyType(read_models(config["models"]))
    except (OSError, ValueError, InvalidMessage) as exc:
        raise ValueError(f"{BUILTIN_MODELS}: {exc}") from None


def builtin_model(name: str) -> ModelSpec:
    """The built-in model ``name`` (a ``KeyError`` listing them when there is none)."""
    models = builtin_models()
    if name not in models:
        raise KeyError(f"no built-in model {name!r}; models: {sorted(models)}")
    return models[name]
