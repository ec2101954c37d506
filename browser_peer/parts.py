"""One window on several cores of one tab: the lease's examples are split into parts, every part is
trained by its own Web Worker from the same head and the same optimizer state (the tab's Adam), and
the parts' parameters and Adam moments are averaged, weighted by examples, into the one candidate the
tab signs and the optimizer it goes on with.

That is local SGD inside the tab, the averaging the validators apply across trainers, with one
exchange per window (head, moments and examples out; parameters and moments back) instead of one per
step: a per-step gradient exchange between workers would copy the model twice per batch. Part
workers keep nothing between windows.

``PartTask`` / ``PartResult`` travel between workers as safetensors (``protocol.codec``), never pickled.
``train`` is the loop every part runs, the tab's own part included.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from protocol.batches import make_batches
from protocol.codec import decode_tensors, encode_tensors
from protocol.errors import CodecError, InvalidMessage
from protocol.model import ModelSpec, Params

from .guest import Guest
from .numpy_trainer import Adam, Backend, gradients

__all__ = ["PartResult", "PartRunner", "PartTask", "average", "merged_optimizer", "split", "train"]

F32 = npt.NDArray[np.float32]
_STATE = ("params", "mu", "nu")  # tensor name prefixes of a part's state


def _flatten(**groups: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f"{group}/{name}": array for group, arrays in groups.items() for name, array in arrays.items()}


def _unflatten(tensors: Mapping[str, np.ndarray], model: ModelSpec) -> dict[str, Params]:
    groups: dict[str, Params] = {group: {} for group in _STATE}
    for key, array in tensors.items():
        group, _, name = key.partition("/")
        if group in groups:
            groups[group][name] = array
    model.check(groups["params"])
    for group in ("mu", "nu"):
        if groups[group]:  # an optimizer that has not stepped yet has no moments
            model.check(groups[group])
    return groups


@dataclass(frozen=True)
class PartTask:
    model: ModelSpec  # the experiment's, as the network's manifest declares it
    batch_size: int
    seeds: tuple[int, ...]  # the batch order of each epoch
    params: Params
    optimizer: Adam  # the tab's, as the window starts
    x: F32
    y: npt.NDArray[np.int32]

    def encode(self) -> bytes:
        tensors = _flatten(params=self.params, mu=self.optimizer.mu, nu=self.optimizer.nu) | {"x": self.x, "y": self.y}
        settings = {"model": self.model.to_wire(), "batch_size": self.batch_size, "seeds": self.seeds,
                    "learning_rate": self.optimizer.learning_rate, "count": self.optimizer.count}  # fmt: skip
        return encode_tensors(tensors, {"task": json.dumps(settings)})

    @classmethod
    def decode(cls, data: bytes) -> PartTask:
        try:
            tensors, metadata = decode_tensors(data)
            settings = json.loads(metadata["task"])
            model = ModelSpec.from_wire(settings["model"])
            groups = _unflatten(tensors, model)
            optimizer = Adam(
                float(settings["learning_rate"]), count=int(settings["count"]), mu=groups["mu"], nu=groups["nu"]
            )
            seeds = tuple(int(seed) for seed in settings["seeds"])
            return cls(
                model, int(settings["batch_size"]), seeds, groups["params"], optimizer, tensors["x"], tensors["y"]
            )
        except (KeyError, ValueError, TypeError, InvalidMessage) as exc:
            raise CodecError(f"not a part task: {exc!r}") from None


@dataclass(frozen=True)
class PartResult:
    params: Params
    optimizer: Adam
    steps: int
    loss_sum: float

    def encode(self) -> bytes:
        tensors = _flatten(params=self.params, mu=self.optimizer.mu, nu=self.optimizer.nu)
        settings = {"count": self.optimizer.count, "steps": self.steps, "loss_sum": self.loss_sum}
        return encode_tensors(tensors, {"result": json.dumps(settings)})

    @classmethod
    def decode(cls, data: bytes, model: ModelSpec, learning_rate: float) -> PartResult:
        try:
            tensors, metadata = decode_tensors(data)
            settings = json.loads(metadata["result"])
            groups = _unflatten(tensors, model)
            optimizer = Adam(learning_rate, count=int(settings["count"]), mu=groups["mu"], nu=groups["nu"])
            return cls(groups["params"], optimizer, int(settings["steps"]), float(settings["loss_sum"]))
        except (KeyError, ValueError, TypeError) as exc:
            raise CodecError(f"not a part result: {exc!r}") from None


def split(x: F32, y: npt.NDArray[np.int32], parts: int, batch_size: int) -> list[tuple[F32, npt.NDArray[np.int32]]]:
    """``parts`` slices of whole batches (the last takes the rest); fewer when there are not enough
    batches for every part."""
    batches = len(x) // batch_size
    parts = max(1, min(parts, batches))
    bounds = [batch_size * (batches * i // parts) for i in range(parts)] + [len(x)]
    return [(x[a:b], y[a:b]) for a, b in itertools.pairwise(bounds)]


def average(arrays: list[Params], weights: list[float]) -> Params:
    """``arrays`` (one set of named tensors per part), averaged with ``weights`` (example counts)."""
    total = float(sum(weights))
    return {
        name: sum((np.float32(w / total) * a[name] for a, w in zip(arrays, weights, strict=True)),
                  np.zeros_like(arrays[0][name]))
        for name in arrays[0]
    }  # fmt: skip


def merged_optimizer(results: list[PartResult], weights: list[float]) -> Adam:
    """The optimizer the tab goes on with: the parts' moments averaged, the most steps taken."""
    first = results[0].optimizer
    return Adam(
        first.learning_rate,
        count=max(r.optimizer.count for r in results),
        mu=average([r.optimizer.mu for r in results], weights),
        nu=average([r.optimizer.nu for r in results], weights),
    )


async def train(
    task: PartTask,
    backend: Backend,
    guest: Guest,
    on_batch: Callable[[int, int, float], None] = lambda steps, total, elapsed_s: None,
) -> PartResult:
    """Train ``task``'s params on its examples with its optimizer (``on_batch(steps, total, seconds)``
    after each batch)."""
    model = task.model
    params, optimizer = task.params, task.optimizer
    started = time.perf_counter()
    steps, loss_sum = 0, 0.0
    batches = [make_batches(task.x, task.y, task.batch_size, seed) for seed in task.seeds]
    total = sum(len(xb) for xb, _ in batches)
    for xb, yb in batches:
        for x, y in zip(xb, yb, strict=True):
            batch_started = time.perf_counter()
            loss, grads = gradients(model, params, x, y, backend.matmul)
            params = optimizer.step(params, grads, backend.adam)
            loss_sum += loss
            steps += 1
            on_batch(steps, total, time.perf_counter() - started)
            await guest.after_batch(time.perf_counter() - batch_started)
    return PartResult(params, optimizer, steps, loss_sum)


class PartRunner:
    """A part worker's side: the page's guest settings, kept across windows, and its backend."""

    def __init__(self, backend: Backend) -> None:
        self.guest = Guest()
        self.backend = backend

    async def run(self, payload: bytes) -> bytes:
        return (await train(PartTask.decode(payload), self.backend, self.guest)).encode()
