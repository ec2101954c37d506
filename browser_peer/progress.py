"""What a browser peer keeps across page loads: its optimizer, its codec residual and its progress.

Saved after every published window through the bridge's durable storage (IndexedDB in the browser)
as one safetensors artifact (``protocol.codec``: tensors plus string metadata, never pickled):
Adam's moments ``mu/<name>`` and ``nu/<name>``, the lossy codec's residual ``residual/<name>``, and in
the metadata the step count, windows done and the last head trained on. A saved state is used only
for the experiment and model it was written for, with every tensor checked against the model's
shapes; anything else is dropped and the peer starts afresh.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.codec import decode_tensors, encode_tensors
from protocol.errors import ProtocolError
from protocol.ids import HeadId
from protocol.model import ModelSpec, Params

from .numpy_trainer import Adam

__all__ = ["Progress", "storage_key"]

FORMAT = "dtn-browser-progress-v1"


def storage_key(experiment: str) -> str:
    return f"progress/{experiment}"


@dataclass
class Progress:
    optimizer: Adam
    residual: Params | None
    windows_done: int
    last_base: HeadId | None

    def encode(self, experiment: str, model: ModelSpec) -> bytes:
        tensors = {f"mu/{k}": v for k, v in self.optimizer.mu.items()} | {
            f"nu/{k}": v for k, v in self.optimizer.nu.items()
        }
        tensors |= {f"residual/{k}": v for k, v in (self.residual or {}).items()}
        metadata = {
            "format": FORMAT,
            "experiment": experiment,
            "model": model.name,
            "count": str(self.optimizer.count),
            "windows_done": str(self.windows_done),
            "last_base": self.last_base or "",
        }
        return encode_tensors(tensors, metadata)

    @classmethod
    def decode(cls, data: bytes, experiment: str, model: ModelSpec, learning_rate: float) -> Progress | None:
        """The saved progress, or None where it is not this experiment's and model's (or is damaged)."""
        try:
            tensors, metadata = decode_tensors(data)
            if (metadata.get("format"), metadata.get("experiment"), metadata.get("model")) != (
                FORMAT,
                experiment,
                model.name,
            ):
                return None
            parts: dict[str, Params] = {"mu": {}, "nu": {}, "residual": {}}
            for name, array in tensors.items():
                part, _, leaf = name.partition("/")
                parts[part][leaf] = array
            for part in ("mu", "nu"):
                model.check(parts[part])
            if parts["residual"]:
                model.check(parts["residual"])
            optimizer = Adam(learning_rate, count=int(metadata["count"]), mu=parts["mu"], nu=parts["nu"])
            return cls(
                optimizer,
                parts["residual"] or None,
                int(metadata["windows_done"]),
                HeadId(metadata["last_base"]) if metadata["last_base"] else None,
            )
        except (ProtocolError, KeyError, ValueError):
            return None
