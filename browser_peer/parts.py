"""One window on several cores of one tab: the lease's examples are split into parts, every part is
trained by its own Web Worker from the same head and the same optimizer state (the tab's Adam), and
the parts' parameters and Adam moments are averaged, weighted by examples, into the one candidate the
tab signs and the optimizer it goes on with.

That is local SGD inside the tab, the averaging the validators apply across trainers, with one
exchange per window (head, moments and examples out; parameters and moments back) instead of one per
step: a per-step gradient exchange between workers would copy the model twice per batch. Part
workers keep nothing between windows.

Examples stay in the shards' stored form (uint8) until a batch is trained: a part's task carries a
quarter of the bytes of float32 features, and the tab skips a float32 copy of its whole lease (each such
pass over a 16-shard lease cost 40-70 ms in Pyodide, a fifth of the window's training). ``train``
reads each batch as float32 with the features' ``scale`` (``protocol.shards.feature_scale``).

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

__all__ = ["PartPace", "PartResult", "PartRunner", "PartTask", "average", "merged_optimizer", "split", "train"]

U8 = npt.NDArray[np.uint8]
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
    x: U8  # features as the shards store them
    y: npt.NDArray[np.int32]
    scale: float  # what a stored feature is multiplied by to read it (``protocol.shards.feature_scale``)

    def encode(self) -> bytes:
        tensors = _flatten(params=self.params, mu=self.optimizer.mu, nu=self.optimizer.nu) | {"x": self.x, "y": self.y}
        settings = {"model": self.model.to_wire(), "batch_size": self.batch_size, "seeds": self.seeds,
                    "learning_rate": self.optimizer.learning_rate, "count": self.optimizer.count,
                    "scale": self.scale}  # fmt: skip
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
            x, y = tensors["x"], tensors["y"]
            if x.dtype != np.uint8 or len(x) != len(y):
                raise ValueError("a part's examples are uint8 features and one label each")
            scale = float(settings["scale"])
            return cls(model, int(settings["batch_size"]), seeds, groups["params"], optimizer, x, y, scale)
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


def split(
    x: U8, y: npt.NDArray[np.int32], weights: list[float], batch_size: int
) -> list[tuple[U8, npt.NDArray[np.int32]]]:
    """One slice of whole batches per weight, sized in proportion to it (the last takes the rest), each
    of at least one batch; fewer slices when there are not enough batches for every part."""
    batches = len(x) // batch_size
    parts = max(1, min(len(weights), batches))
    shares = np.cumsum(np.maximum(np.asarray(weights[:parts], np.float64), 1e-9))
    cuts: list[int] = []
    for i, share in enumerate(shares[:-1]):  # at least one batch before each cut and after it
        low, high = (cuts[-1] if cuts else 0) + 1, batches - (parts - 1 - i)
        cuts.append(min(max(round(float(batches * share / shares[-1])), low), high))
    bounds = [0, *(batch_size * cut for cut in cuts), len(x)]
    return [(x[a:b], y[a:b]) for a, b in itertools.pairwise(bounds)]


class PartPace:
    """Each part's examples a second in the windows before, to split the next window so that the parts
    finish together: another worker's part also pays for the transfer of its task and result, and the
    cores are not equally free. Weights start equal and follow each window's measured rates, smoothed."""

    SMOOTHING = 0.5  # the newest window's share of a part's rate

    def __init__(self) -> None:
        self._rates: list[float] = []

    def weights(self, parts: int) -> list[float]:
        """One weight per part for a window in ``parts`` parts."""
        return list(self._rates) if len(self._rates) == parts else [1.0] * parts

    def measured(self, rates: list[float | None]) -> None:
        """Each part's examples a second in the window just trained (None: that part failed, and the
        weights start over)."""
        measured = [float(rate) for rate in rates if rate is not None and rate > 0]
        if len(measured) < len(rates):
            self._rates = []
        elif len(measured) != len(self._rates):
            self._rates = measured
        else:
            self._rates = [(1 - self.SMOOTHING) * old + self.SMOOTHING * new
                           for old, new in zip(self._rates, measured, strict=True)]  # fmt: skip


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
    after each batch); each batch is read as float32 as it is trained."""
    model = task.model
    params, optimizer = task.params, task.optimizer
    started = time.perf_counter()
    steps, loss_sum = 0, 0.0
    batches = [make_batches(task.x, task.y, task.batch_size, seed) for seed in task.seeds]
    total = sum(len(xb) for xb, _ in batches)
    scale = np.float32(task.scale)
    for xb, yb in batches:
        for stored, y in zip(xb, yb, strict=True):
            batch_started = time.perf_counter()
            x = np.multiply(stored, scale, dtype=np.float32)
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
