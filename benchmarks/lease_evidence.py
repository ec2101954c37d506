"""How far a validator tells work from claims: the lease evidence z (``protocol.evidence``) of honest
updates against free riders', by lease size and window, from genesis.

Ten honest trainers (the MNIST MLP, Adam 2e-3 with its state kept across windows, batch 64, one epoch
of their lease a window) train FedAvg windows from a fresh genesis on leases of 1,000 examples (one
shard) and 4,000 (four: ``shards_per_lease`` of the MNIST network and the attack suite). Each window
the evidence of every update is measured as validators measure it (``native_peer.evidence.
LeaseEvidence``: up to 4,000 of the lease's examples against as many of the window's control shards
outside it), for

    honest     the trainer's update
    parts      the same lease trained as a browser tab on 4 cores trains it (``browser_peer.parts``:
               4 parts from the same head and optimizer state, averaged)
    ahead      the lease trained as a continuous trainer trains it (``native_peer.trainer``): from the
               trainer's own last update (its honest candidate of the window before), with its own
               optimizer state, carried onto the head (head + θ − θ last update)
    noise      a free rider: noise the size of the lineage's last step (``lab.attacks``)
    repeat     a free rider: the lineage's last step again
    copy       a free rider: another trainer's update of the window, jittered by 1 %

each free rider claiming each trainer's lease. The baseline is the free riders: the evidence works
where honest z stays clear of theirs. The same z against the validator's holdout instead of training
shards is printed beside (``holdout``): the control validators do not use, and why. Printed per lease
size, over ``--runs`` runs (another genesis, shards and batch orders each): the head's holdout loss
as a share of chance and each kind's z (min / median / max) per window; then, at window 0 and over
windows ≥ 1, the share of each kind at or above 2 and 3 (the acceptance and credit bounds of
``ScreeningPolicy``).

    python -m benchmarks.lease_evidence [--runs 3] [--windows 6]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

from lab.attacks import ATTACKS, BATCH, LEARNING_RATE, Data, Window, load_data
from native_peer.evidence import LeaseEvidence
from native_peer.learner import Evaluator, TrainEngine
from native_peer.mnist import mlp_learner
from protocol.batches import make_batches
from protocol.evidence import EvidenceDraw
from protocol.screening import PRESETS

PEERS = 10
LEASE_SHARDS = (1, 4)
PARTS = 4
FREE_RIDERS = {"noise": "noise_step", "repeat": "repeat_step", "copy": "copy_jitter"}
KINDS = ("honest", "parts", "ahead", *FREE_RIDERS)
BOUNDS = (PRESETS["balanced"].min_lease_evidence_z, PRESETS["balanced"].credit_lease_evidence_z)

Params = dict[str, np.ndarray]
# (window) -> kind -> [(z against training shards, z against the holdout)]
Measured = dict[int, dict[str, list[tuple[float, float]]]]


class Run:
    def __init__(self, data: Data, shards: int, seed: int) -> None:
        self.data, self.shards, self.seed = data, shards, seed
        self.learner = mlp_learner()
        self.engine = TrainEngine(self.learner, optax.adam(LEARNING_RATE))
        self.evaluator = Evaluator(self.learner)
        self.shard_ids = [str(n) for n in range(len(data.shards))]
        self.measure = LeaseEvidence(self.learner, self.evaluator, self.shard_ids, lambda s: data.shards[int(s)])
        self.order = np.random.default_rng(seed).permutation(len(data.shards))

    def _examples(self, shard_ids: list[str] | tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        parts = [self.data.shards[int(s)] for s in shard_ids]
        return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])

    def _fit(self, base: Params, x: np.ndarray, y: np.ndarray, state: Any, seed: int) -> tuple[Params, Any]:
        xb, yb = make_batches(x, y, BATCH, seed)
        params, state, _ = self.engine.train_epoch(self.learner.from_tensors(base), state, xb, yb)
        return self.learner.to_tensors(params), state

    def _in_parts(self, base: Params, x: np.ndarray, y: np.ndarray, state: Any, seed: int) -> tuple[Params, Any]:
        """``browser_peer.parts``: ``PARTS`` slices from the same head and state, parameters and moments averaged."""
        fitted = [
            self._fit(base, xs, ys, state, seed + k)
            for k, (xs, ys) in enumerate(zip(*(np.array_split(a, PARTS) for a in (x, y)), strict=True))
        ]
        params = {k: np.mean([p[k] for p, _ in fitted], axis=0).astype(np.float32) for k in base}
        return params, jax.tree_util.tree_map(lambda *s: sum(s) / len(s), *[s for _, s in fitted])

    def evidence(
        self, salt: bytes, window: int, base: Params, params: Params, lease: str, shard_ids: list[str]
    ) -> tuple[float, float]:
        """z against training shards outside the lease (what validators measure), and against the holdout."""
        x, y = self._examples(shard_ids)
        rows = EvidenceDraw.of(salt, self.shard_ids).lease_rows(lease, len(y))
        before, after = self.learner.from_tensors(base), self.learner.from_tensors(params)
        held = tuple(a[: len(rows)] for a in self.data.holdout)
        return (
            self.measure.z(salt, str(window), base, params, lease, shard_ids),
            self.evaluator.lease_evidence(before, after, (x[rows], y[rows]), held),
        )

    def windows(self, count: int) -> tuple[list[float], Measured]:
        base = parent = self.learner.to_tensors(self.learner.init(jax.random.PRNGKey(self.seed)))
        states = {
            kind: [self.engine.init_optimizer(self.learner.from_tensors(base))] * PEERS for kind in ("honest", "parts")
        }
        last: list[Params] = []  # each trainer's honest update of the window before: where "ahead" trains from
        rng = np.random.default_rng(self.seed)
        step, losses, measured = 0.0, [], defaultdict(lambda: defaultdict(list))
        for window in range(count):
            salt = f"{self.seed}/{self.shards}/{window}".encode()  # a closed window's salt
            first = window * PEERS * self.shards
            leases = [
                [str(self.order[(first + i * self.shards + j) % len(self.order)]) for j in range(self.shards)]
                for i in range(PEERS)
            ]
            updates: dict[str, list[Params]] = {"honest": [], "parts": []}
            if window == 1:  # a continuous trainer goes on with the optimizer state of its published window
                states["ahead"] = list(states["honest"])
            for i, shard_ids in enumerate(leases):
                x, y = self._examples(shard_ids)
                seed = 1000 * self.seed + PEERS * window + i
                for kind, fit in (("honest", self._fit), ("parts", self._in_parts)):
                    params, states[kind][i] = fit(base, x, y, states[kind][i], seed)
                    updates[kind].append(params)
                if last:
                    params, states["ahead"][i] = self._fit(last[i], x, y, states["ahead"][i], seed)
                    updates.setdefault("ahead", []).append({k: base[k] + (params[k] - last[i][k]) for k in base})
            losses.append(self.evaluator(self.learner.from_tensors(base), *self.data.holdout)["loss"] / math.log(10))
            for i, shard_ids in enumerate(leases):
                lease = f"lease-{window}-{i}"
                for kind in updates:
                    measured[window][kind].append(self.evidence(salt, window, base, updates[kind][i], lease, shard_ids))
                for kind, attack in FREE_RIDERS.items():
                    if window == 0 and kind != "copy":
                        continue  # no lineage step and no last step before the first head
                    ctx = Window(base, updates["honest"][i], updates["honest"], [], rng, i + 1, None, parent, step)
                    crafted = ATTACKS[attack](ctx)[0]  # type: ignore[misc]
                    measured[window][kind].append(self.evidence(salt, window, base, crafted, lease, shard_ids))
            honest = last = updates["honest"]
            step = float(
                np.median(
                    [
                        math.sqrt(sum(float(((u[k] - base[k].astype(np.float64)) ** 2).sum()) for k in base))
                        for u in honest
                    ]
                )
            )
            parent, base = base, {k: np.mean([u[k] for u in honest], axis=0).astype(np.float32) for k in base}
        return losses, measured


def _spread(values: list[float]) -> str:
    return f"{min(values):5.1f} {statistics.median(values):5.1f} {max(values):5.1f}" if values else " " * 17


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--windows", type=int, default=6)
    args = parser.parse_args()
    data = load_data(Path(tempfile.mkdtemp(prefix="dtn-evidence-")) / "datasets")
    for shards in LEASE_SHARDS:
        results = [Run(data, shards, seed).windows(args.windows) for seed in range(args.runs)]
        pooled: Measured = defaultdict(lambda: defaultdict(list))
        for _, measured in results:
            for window, kinds in measured.items():
                for kind, values in kinds.items():
                    pooled[window][kind] += values
        print(f"\nleases of {shards * 1000} examples: {args.runs} runs x {PEERS} trainers; z min / median / max")
        print(
            "window loss/chance "
            + " ".join(f"{kind:>17}" for kind in KINDS)
            + f" {'copy (holdout)':>17} {'repeat (holdout)':>17}"
        )
        for window in range(args.windows):
            loss = statistics.median(losses[window] for losses, _ in results)
            cells = [_spread([z for z, _ in pooled[window][kind]]) for kind in KINDS]
            cells += [_spread([h for _, h in pooled[window][kind]]) for kind in ("copy", "repeat")]
            print(f"{window:>6} {loss:>11.2f} " + " ".join(cells), flush=True)
        for label, windows in (("window 0", [0]), ("windows >= 1", range(1, args.windows))):
            shares = []
            for kind in KINDS:
                values = [z for w in windows for z, _ in pooled[w][kind]]
                if values:
                    shares.append(
                        f"{kind} " + " / ".join(f"{sum(z >= b for z in values)}" for b in BOUNDS) + f" of {len(values)}"
                    )
            print(f"{label}: at or above {BOUNDS[0]:g} / {BOUNDS[1]:g}: " + ", ".join(shares), flush=True)


if __name__ == "__main__":
    main()
