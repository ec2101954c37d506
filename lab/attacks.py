"""The attack suite: the validator's real decision rules against attackers, on real MNIST updates.

Each scenario runs ``windows`` windows of one *setting* under one screening preset:

    iid           ``peers`` trainers (10), each leasing 4 shards of 1,000 examples (as the MNIST network)
    label_skew    ``peers`` benign trainers, each holding only 2 or 3 classes (non-IID)
    label_skew_1  ``peers`` benign trainers, each holding only 1 or 2 classes
    cohort_2/3    windows of only 2 or 3 candidates, one of them an attacker

Honest peers train real updates (JAX, Adam, kept optimizer state); attackers train too (backdoor
attackers on poisoned data), then craft what they submit from their own update or the honest ones
(which they are assumed to see). Every submission is a real signed ``Candidate`` with a real
edge-signed ``Lease`` and goes through ``protocol.judging.precheck`` and ``judge_window`` (with a
``TrustBook``), exactly as a validator runs them, and with the validator's **own update**
(``native_peer.anchor.Anchor``): in every ``ANCHOR_EVERY``-th window the suite, as the validator,
trains the base head for a trainer's number of steps on its reference examples, which no trainer
gets (``REFERENCE``, disjoint from the ``HOLDOUT`` it judges on), and screens each window until the
next against its base + that update: the anchor that screens (it never joins a merge), passed to ``judge_window`` with the lineage's
step size as the heads record it; the tie-break salt is drawn from the closed window.

The scorecard reports harm, not only acceptance, per setting × attack × fraction × preset: malicious
acceptance rate, benign false rejection rate, final head test accuracy and its difference to the
clean run of the same setting, the trigger's attack success rate (triggered non-target test images
classified as the target) and its difference to the clean run, honest peers quarantined, and
quarantine precision/recall. Seeds come from fixed values and sha256 of names, never from ``hash()``,
so the scorecard is the same from run to run; ``seed`` (0 by default) draws another genesis, warm-up and
every batch order, poisoning and attacker draw, for a spread over runs.

    python -m lab attack-suite --out var/attack-suite [--windows 4] [--presets balanced ...]
        [--attacks backdoor ...] [--fractions 0.33 0.5 0.6] [--settings iid ...] [--seed 0]
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

from datasets import mnist
from datasets.layout import load_split, load_train, split_path
from native_peer.anchor import Anchor
from native_peer.evidence import LeaseEvidence
from native_peer.learner import Evaluator, TrainEngine
from native_peer.mnist import mlp_learner
from protocol.batches import make_batches
from protocol.codec import decode_tensors, encode_tensors
from protocol.evidence import lease_measurable
from protocol.hashing import content_id
from protocol.ids import DatasetId, ExperimentKey, HeadId, LeaseId
from protocol.judging import FRESH_TRUST, Submission, anchor_window, judge_window, precheck
from protocol.leases import assign_leases
from protocol.manifests import ExperimentSpec
from protocol.messages import Candidate, HeadDescriptor, Lease
from protocol.model import Params
from protocol.records import RECORD_HEADS, peer_records, weigh_by_record
from protocol.screening import PRESETS
from protocol.signing import PureSigner, peer_id_from_public_key

__all__ = [
    "ATTACKS",
    "FRACTIONS",
    "PLAN",
    "SETTINGS",
    "TRIGGER_PIXELS",
    "Suite",
    "load_data",
    "run_suite",
    "scenario_seed",
    "scorecard_table",
    "write_scorecard",
]

KEY = ExperimentKey.parse("attack/mnist/rev-1")
EDGE = PureSigner(b"\xed" * 32)
VALIDATOR_KEY = PureSigner(b"\xee" * 32).public_key  # names the heads the suite judges on (never signs)
FRACTIONS = (0.1, 0.2, 0.33)
SYBIL_FRACTIONS = (0.5, 0.6)
LEARNING_RATE = 2e-3
BATCH = 64
SHARD_EXAMPLES = 1000
LEASE_SHARDS = 4  # a lease's shards: the MNIST network's shards_per_lease (networks/mnist.toml)
LEASE_EXAMPLES = LEASE_SHARDS * SHARD_EXAMPLES
STEPS = LEASE_EXAMPLES // BATCH  # a trainer's optimizer steps per window: one epoch of its lease
HOLDOUT = 5000  # what the validator judges candidates and heads on (never a trainer's)
REFERENCE = 4000  # what the validator trains its own update on (never a trainer's)
REFERENCE_BATCH = 2 * BATCH  # 2 x the trainers' batch, their step count: what validators do (Validator._reference)
ANCHOR_EVERY = ExperimentSpec.anchor_every  # the validator trains its own update every this many windows
# a 12-pixel patch in the top-left corner that no MNIST training image lights (tests check it)
TRIGGER_PIXELS = tuple(r * 28 + c for r in range(4) for c in range(4) if r < 2 or c < 2)
TARGET = 0
POISON_FRACTION = 0.5  # share of a backdoor attacker's examples it triggers and relabels
BOOST = 5.0  # the boosted backdoor's scale ("model replacement")


@dataclass
class Window:
    """What attackers may use when crafting: the base, their own and the honest updates."""

    base: Params
    own: Params
    honest: list[Params]
    previous_submissions: list[tuple[Candidate, bytes]]
    rng: np.random.Generator
    index: int = 0  # this attacker's position among the attackers
    operator: Params | None = None  # the first attacker's own update (what Sybils copy)
    parent: Params | None = None  # the head before ``base`` (the lineage's last step: base − parent)
    lineage_step: float = 0.0  # the lineage's step size, as the heads record it


def _delta(params: Params, base: Params) -> dict[str, np.ndarray]:
    return {k: params[k].astype(np.float64) - base[k] for k in base}


def _apply(base: Params, delta: dict[str, np.ndarray]) -> Params:
    return {k: (base[k] + delta[k]).astype(np.float32) for k in base}


def _norm(delta: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum((v**2).sum() for v in delta.values())))


def _pair_cosines(deltas: list[dict[str, np.ndarray]]) -> list[float]:
    """The cosine of every pair of ``deltas``."""
    if len(deltas) < 2:
        return []
    rows = np.stack([np.concatenate([d[k].ravel() for k in sorted(d)]) for d in deltas])
    unit = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-300)
    return [float(c) for c in (unit @ unit.T)[np.triu_indices(len(rows), 1)]]


def _honest_stats(w: Window) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    deltas = [_delta(p, w.base) for p in w.honest]
    mean = {k: np.mean([d[k] for d in deltas], axis=0) for k in w.base}
    std = {k: np.std([d[k] for d in deltas], axis=0) for k in w.base}
    return mean, std


def _sign_flip(w: Window) -> list[Params]:
    return [_apply(w.base, {k: -v for k, v in _delta(w.own, w.base).items()})]


def _scale_up(w: Window) -> list[Params]:
    return [_apply(w.base, {k: 10.0 * v for k, v in _delta(w.own, w.base).items()})]


def _free_rider(w: Window) -> list[Params]:
    return [dict(w.base)]


def _nan_inf(w: Window) -> list[Params]:
    poisoned = {k: v.copy() for k, v in w.own.items()}
    poisoned["dense0.kernel"][0, 0] = np.nan
    poisoned["dense1.bias"][0] = np.inf
    return [poisoned]


def _wrong_shape(w: Window) -> list[Params]:
    broken = dict(w.own)
    broken["dense1.kernel"] = broken["dense1.kernel"][:, :9]
    return [broken]


def _alie(w: Window) -> list[Params]:
    """ "A little is enough" (Baruch et al. 2019): mean − z·std, the same for every attacker."""
    mean, std = _honest_stats(w)
    return [_apply(w.base, {k: mean[k] - 1.0 * std[k] for k in mean})]


def _ipm(w: Window) -> list[Params]:
    """Inner-product manipulation (Xie et al. 2020): −ε × the honest mean, ε = 0.5."""
    mean, _ = _honest_stats(w)
    return [_apply(w.base, {k: -0.5 * v for k, v in mean.items()})]


def _colluding_cluster(w: Window) -> list[Params]:
    """All attackers send one vector: the honest mean plus a shared push of twice its norm."""
    mean, _ = _honest_stats(w)
    push = {k: np.random.default_rng(7).standard_normal(v.shape) for k, v in mean.items()}
    return [_apply(w.base, {k: mean[k] + 2.0 * _norm(mean) / _norm(push) * push[k] for k in mean})]


def _late_flood(w: Window) -> list[Params]:
    """Five noise updates per attacker, each of honest size."""
    mean, _ = _honest_stats(w)
    floods = []
    for _ in range(5):
        noise = {k: w.rng.standard_normal(v.shape) for k, v in mean.items()}
        floods.append(_apply(w.base, {k: _norm(mean) / _norm(noise) * v for k, v in noise.items()}))
    return floods


def _backdoor(w: Window) -> list[Params]:
    """A trigger backdoor: the attacker trained on its shard with half the images carrying the
    trigger patch and relabelled ``TARGET``; the update is scaled to the honest median norm, so
    norm screening cannot tell it apart."""
    delta = _delta(w.own, w.base)
    honest_norm = float(np.median([_norm(_delta(p, w.base)) for p in w.honest]))
    return [_apply(w.base, {k: v * honest_norm / _norm(delta) for k, v in delta.items()})]


def _backdoor_boosted(w: Window) -> list[Params]:
    """The same poisoned update, boosted ``BOOST`` times (model replacement, Bagdasaryan et al. 2020)."""
    return [_apply(w.base, {k: BOOST * v for k, v in _delta(w.own, w.base).items()})]


def _sybil_scaled(w: Window) -> list[Params]:
    """Cheap identities of one operator, each sending a scaled-down copy of the operator's update
    (0.25, 0.26, ...): they drag a cohort median norm down until honest updates look too large."""
    assert w.operator is not None
    factor = 0.25 + 0.01 * w.index
    return [_apply(w.base, {k: factor * v for k, v in _delta(w.operator, w.base).items()})]


def _noise_step(w: Window) -> list[Params]:
    """A free rider: the head plus random noise the size of the lineage's last step."""
    noise = {k: w.rng.standard_normal(v.shape) for k, v in w.base.items()}
    return [_apply(w.base, {k: w.lineage_step / _norm(noise) * v for k, v in noise.items()})]


def _repeat_step(w: Window) -> list[Params]:
    """A free rider: the lineage's last step again, head + (1 + 0.01 i)(head − parent) for the i-th
    attacker (the same bytes from several would be one candidate at the edge)."""
    assert w.parent is not None
    return [_apply(w.base, {k: (1.0 + 0.01 * w.index) * v for k, v in _delta(w.base, w.parent).items()})]


def _copy_jitter(w: Window) -> list[Params]:
    """A free rider: another peer's update of this window, each coordinate jittered by 1 %."""
    delta = _delta(w.honest[w.index % len(w.honest)], w.base)
    return [_apply(w.base, {k: v * (1.0 + 0.01 * w.rng.standard_normal(v.shape)) for k, v in delta.items()})]


# Attacks whose damage is in the descriptor, not the parameters, map to None: handled in _submit.
ATTACKS: dict[str, Callable[[Window], list[Params]] | None] = {
    "sign_flip": _sign_flip,
    "scale_up": _scale_up,
    "free_rider": _free_rider,
    "nan_inf": _nan_inf,
    "wrong_shape": _wrong_shape,
    "replay": None,
    "stale_base": None,
    "late_flood": _late_flood,
    "alie": _alie,
    "ipm": _ipm,
    "colluding_cluster": _colluding_cluster,
    "backdoor": _backdoor,
    "backdoor_boosted": _backdoor_boosted,
    "sybil_scaled": _sybil_scaled,
    "noise_step": _noise_step,
    "repeat_step": _repeat_step,
    "copy_jitter": _copy_jitter,
}
FREE_RIDERS = frozenset({"free_rider", "noise_step", "repeat_step", "copy_jitter"})  # no training of their own
BACKDOORS = frozenset({"backdoor", "backdoor_boosted"})


@dataclass(frozen=True)
class Setting:
    name: str
    peers: int | None  # None: the suite's peer count
    skew: int = 0  # label skew: each peer holds this many classes or one more (``skew_classes``); 0: iid leases


SETTINGS = {
    "iid": Setting("iid", None),
    "label_skew": Setting("label_skew", None, skew=2),
    "label_skew_1": Setting("label_skew_1", None, skew=1),
    "cohort_2": Setting("cohort_2", 2),
    "cohort_3": Setting("cohort_3", 3),
}
_SMALL = ("backdoor", "backdoor_boosted", "scale_up", "sign_flip")
# setting -> (attack, fractions) pairs; every setting also has its clean run (fraction 0)
_SYBIL_MAJORITY = {"sybil_scaled": SYBIL_FRACTIONS, "alie": (*FRACTIONS, 0.6), "colluding_cluster": (*FRACTIONS, 0.6)}
PLAN: dict[str, tuple[tuple[str, tuple[float, ...]], ...]] = {
    "iid": tuple((a, _SYBIL_MAJORITY.get(a, FRACTIONS)) for a in ATTACKS),
    "label_skew": (("backdoor", (0.2,)),),
    "label_skew_1": (),
    "cohort_2": tuple((a, (0.5,)) for a in _SMALL),
    "cohort_3": tuple((a, (0.33,)) for a in _SMALL),
}


def skew_classes(peer: int, fewest: int = 2) -> tuple[int, ...]:
    """The classes a label-skewed peer holds: ``fewest`` for even peers, one more for odd ones, spread
    so that every class is held by some of 10 peers (2 or 3 of them with ``fewest`` 2, 1 or 2 with 1)."""
    return tuple((3 * peer + k) % 10 for k in range(fewest + peer % 2))


def poison(x: np.ndarray, y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``POISON_FRACTION`` of the examples with the trigger patch lit and the label ``TARGET``."""
    x, y = x.copy(), y.copy()
    chosen = np.random.default_rng(seed).permutation(len(x))[: int(len(x) * POISON_FRACTION)]
    rows = np.repeat(chosen, len(TRIGGER_PIXELS))
    x[rows, np.tile(TRIGGER_PIXELS, len(chosen))] = 255 / 256
    y[chosen] = TARGET
    return x, y


@dataclass
class Data:
    shards: list[tuple[np.ndarray, np.ndarray]]
    holdout: tuple[np.ndarray, np.ndarray]
    reference: tuple[np.ndarray, np.ndarray]
    test: tuple[np.ndarray, np.ndarray]
    triggered: tuple[np.ndarray, np.ndarray]  # non-target test images with the trigger, labelled TARGET


@dataclass
class Tally:
    malicious: int = 0
    malicious_accepted: int = 0
    benign: int = 0
    benign_rejected: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    benign_cosines: list[float] = field(default_factory=list)  # to the reference, screened-in benign updates
    benign_pair_cosines: list[float] = field(default_factory=list)  # between two benign updates of a window
    benign_evidence: list[float] = field(default_factory=list)  # lease_evidence_z of benign updates
    malicious_evidence: list[float] = field(default_factory=list)
    malicious_examples_credited: int = 0  # examples of credited malicious candidates (server.credit)
    benign_uncredited: int = 0  # benign candidates accepted without the evidence that earns credit
    promoted: int = 0


def load_data(datasets_dir: Path) -> Data:
    """The suite's data, the same for every preparation of the dataset: the whole training pool
    (trainer shards, the validators' holdout and reference splits, whatever the preparation's random
    draw put where), in a canonical order (sha256 of each example), re-carved into the validator's
    ``HOLDOUT`` and ``REFERENCE`` examples and trainer shards of ``SHARD_EXAMPLES``."""
    mnist.prepare(datasets_dir)
    root = datasets_dir / "mnist"
    parts = [load_train(root)]
    parts += [load_split(root, split) for split in ("holdout", "reference") if split_path(root, split).exists()]
    x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    keys = [hashlib.sha256(xi.tobytes() + int(yi).to_bytes(1, "big")).digest() for xi, yi in zip(x, y, strict=True)]
    order = np.asarray(sorted(range(len(x)), key=keys.__getitem__))
    x, y = x[order], y[order]
    holdout, reference = slice(0, HOLDOUT), slice(HOLDOUT, HOLDOUT + REFERENCE)
    rest = range(HOLDOUT + REFERENCE, len(x) - SHARD_EXAMPLES + 1, SHARD_EXAMPLES)
    test_x, test_y = load_split(root, "test")
    keep = test_y != TARGET
    triggered = test_x[keep].copy()
    triggered[:, list(TRIGGER_PIXELS)] = 255 / 256
    return Data(
        [(x[i : i + SHARD_EXAMPLES], y[i : i + SHARD_EXAMPLES]) for i in rest],
        (x[holdout], y[holdout]),
        (x[reference], y[reference]),
        (test_x, test_y),
        (triggered, np.full(len(triggered), TARGET, test_y.dtype)),
    )


def _seed(*parts: object, run: int = 0) -> int:
    """The seed of the draw named by ``parts`` in run ``run`` (run 0 names none, so its draws stay as they were)."""
    named = parts if run == 0 else ("seed", run, *parts)
    return int.from_bytes(hashlib.sha256("|".join(map(repr, named)).encode()).digest()[:8], "big")


class Suite:
    def __init__(self, data: Data, peers: int, windows: int, warmup_windows: int = 2, seed: int = 0) -> None:
        self.data = data
        self.peers = peers
        self.windows = windows
        self.seed = seed
        self.learner = mlp_learner()
        self.engine = TrainEngine(self.learner, optax.adam(LEARNING_RATE))
        self.evaluator = Evaluator(self.learner)
        self.evidence = LeaseEvidence(  # what validators measure on each candidate
            self.learner, self.evaluator, [str(n) for n in range(len(data.shards))], lambda s: data.shards[int(s)]
        )
        self.signers = [PureSigner(i.to_bytes(2, "big") * 16) for i in range(1, max(peers, 3) + 1)]
        self.genesis = self.learner.to_tensors(self.learner.init(jax.random.PRNGKey(seed)))
        self.warm, self.warm_updates, self.warm_states, self.warm_parent = self._warm_up(warmup_windows)
        train_y = np.concatenate([y for _, y in data.shards])
        self._by_class = {c: np.flatnonzero(train_y == c) for c in range(10)}
        self._train_x = np.concatenate([x for x, _ in data.shards])
        self._train_y = train_y

    def evaluate(self, params: Params, split: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
        return self.evaluator(self.learner.from_tensors(params), *split)

    def attack_success(self, params: Params) -> float:
        """Share of triggered non-target test images the model classifies as ``TARGET``."""
        return self.evaluate(params, self.data.triggered)["accuracy"]

    def _fit(self, base: Params, x: np.ndarray, y: np.ndarray, opt_state: Any, seed: int) -> tuple[Params, Any]:
        xb, yb = make_batches(x, y, BATCH, seed)
        params, opt_state, _ = self.engine.train_epoch(self.learner.from_tensors(base), opt_state, xb, yb)
        return self.learner.to_tensors(params), opt_state

    def _warm_up(self, windows: int) -> tuple[Params, list[Params], list[Any], Params]:
        """A shared mid-training head (clean FedAvg windows of one shard a peer) every scenario starts from, the
        updates of its last window (what a replaying attacker can resend in the first window), and
        each peer's optimizer state (trainers keep theirs across windows), and the head before it."""
        base = parent = self.genesis
        updates: list[Params] = []
        states = [self.engine.init_optimizer(self.learner.from_tensors(base)) for _ in self.signers]
        for window in range(windows):
            updates = []
            for i in range(len(self.signers)):
                x, y = self.data.shards[(window * len(self.signers) + i) % len(self.data.shards)]
                params, states[i] = self._fit(
                    base, x, y, states[i], window if self.seed == 0 else _seed("warm", window, run=self.seed)
                )
                updates.append(params)
            parent, base = base, {k: np.mean([u[k] for u in updates], axis=0).astype(np.float32) for k in base}
        return base, updates, states, parent

    def _examples(self, shard_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The examples of shards ``shard_ids`` (indices into ``Data.shards``), in that order."""
        parts = [self.data.shards[int(s)] for s in shard_ids]
        return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])

    def _skewed(self, peer: int, window: int, fewest: int) -> tuple[np.ndarray, np.ndarray]:
        """``SHARD_EXAMPLES`` training examples of the peer's classes, different each window: a quarter
        of an iid peer's lease (with 4,000, 62 steps on 2 or 3 classes, half of their updates were
        refused as ``merge_blocked``: decision 0020)."""
        pool = np.concatenate([self._by_class[c] for c in skew_classes(peer, fewest)])
        pick = np.sort(
            np.random.default_rng(_seed("skew", peer, window, run=self.seed)).choice(
                pool, SHARD_EXAMPLES, replace=False
            )
        )
        return self._train_x[pick], self._train_y[pick]

    def run(
        self,
        attack: str,
        fraction: float,
        preset: str,
        setting: str = "iid",
        *,
        use_reference: bool = True,
        use_evidence: bool = True,
        use_copies: bool = True,
        fresh_identities: bool = False,
    ) -> dict[str, Any]:
        """One scenario; ``use_reference=False`` judges as a validator without a reference update,
        ``use_evidence=False`` without measuring each candidate's evidence that it trained on its lease,
        ``use_copies=False`` without refusing copies of another candidate's update (``rejects_copies``);
        ``fresh_identities=True``: the attackers sign with new keys every window (cheap identities, never
        a record)."""
        policy = PRESETS[preset] if use_evidence else PRESETS[preset].without_lease_evidence()
        policy = policy if use_copies else replace(policy, rejects_copies=False)
        where = SETTINGS[setting]
        peers = where.peers or self.peers
        malicious = set() if attack == "clean" else set(range(round(fraction * peers)))
        signers = self.signers[:peers]
        trust = FRESH_TRUST
        tally = Tally()
        base, before = self.warm, self.warm_parent  # the head and the head before it
        base_metrics = self.evaluate(base, self.data.holdout)
        step: dict[str, float] = {}  # the lineage's step size, as the heads record it
        states = list(self.warm_states[:peers])
        old_artifacts = [encode_tensors(u) for u in self.warm_updates]
        judged: set[str] = {content_id(a) for a in old_artifacts}
        old_lease = Lease(
            LeaseId("lease-old"), KEY, peer_id_from_public_key(signers[0].public_key), HeadId(content_id(b"old")),
            0, DatasetId("mnist"), (), 0, 1,
        )  # fmt: skip
        previous = [(_candidate(signers[0], old_lease, old_lease.base_head, content_id(a)), a) for a in old_artifacts]
        rng = np.random.default_rng(scenario_seed(attack, fraction, preset, setting, self.seed))
        head_id = HeadId(content_id(encode_tensors(base)))
        previous_head = head_id
        peer_ids = [peer_id_from_public_key(s.public_key) for s in signers]
        malicious_ids = {peer_ids[i] for i in malicious}  # every key an attacker signed with
        anchor = Anchor(self.engine, *self.data.reference, STEPS, REFERENCE_BATCH)
        anchored = (head_id, base)  # the head the validator's own update trains from, and its parameters
        pool = sum(len(y) for _, y in self.data.shards)  # the training pool's examples (``lease_measurable``)
        merged_peers: deque[set[str]] = deque(maxlen=RECORD_HEADS)  # the last heads' (``protocol.records``)
        for window in range(self.windows):
            if fresh_identities and window:
                signers = [_sybil(i, window, self.seed) if i in malicious else s for i, s in enumerate(signers)]
                peer_ids = [peer_id_from_public_key(s.public_key) for s in signers]
                malicious_ids |= {peer_ids[i] for i in malicious}
            if anchor_window(window, ANCHOR_EVERY) == window:
                anchored = (head_id, base)
            shard_ids = [str(i) for i in range(len(self.data.shards))]
            assignment = assign_leases(head_id, peer_ids, shard_ids, LEASE_SHARDS)  # type: ignore[arg-type]
            parent = previous_head if window else None
            current = HeadDescriptor(KEY, head_id, parent, window, 0, (), VALIDATOR_KEY, 0)  # the window's head
            trained: list[Params] = []
            leased: list[tuple[np.ndarray, np.ndarray]] = []  # each peer's leased examples, as the lease names them
            for i, peer in enumerate(peer_ids):
                x, y = self._skewed(i, window, where.skew) if where.skew else self._examples(assignment[peer])
                leased.append((x, y))
                if i in malicious and attack in BACKDOORS:
                    x, y = poison(x, y, _seed("poison", i, window, run=self.seed))
                params, states[i] = self._fit(base, x, y, states[i], _seed("batches", i, window, run=self.seed))
                trained.append(params)
            honest = [trained[i] for i in range(peers) if i not in malicious]
            lineage_step = step.get("update_norm") or float(
                np.median([_norm(_delta(u, before)) for u in self.warm_updates])
            )  # the warm-up's last window before the first head records one
            submissions, candidates, is_malicious = [], [], []
            leases: list[tuple[Lease, int]] = []  # each submission's lease and peer
            for i, (signer, peer) in enumerate(zip(signers, peer_ids, strict=True)):
                lease = Lease(
                    LeaseId(f"lease-{window}-{i}"), KEY, peer, head_id, window, DatasetId("mnist"),
                    assignment[peer], 0, 2**40,
                ).signed(EDGE)  # fmt: skip
                ctx = Window(
                    base, trained[i], honest, previous, rng, sorted(malicious).index(i) if i in malicious else 0,
                    trained[0], before, lineage_step,
                )  # fmt: skip
                for candidate, artifact in self._submit(attack if i in malicious else None, ctx, signer, lease):
                    candidates.append((candidate, artifact))
                    is_malicious.append(i in malicious)
                    screen = precheck(
                        candidate,
                        current=current,
                        base=current if candidate.base_head == head_id else None,
                        judged=judged,
                        lease=lease,
                        leased_examples=LEASE_EXAMPLES,
                        edge_key=EDGE.public_key,
                    )
                    params = _decode(artifact) if screen.accepted else None
                    submissions.append(
                        Submission(
                            candidate.candidate_id,
                            candidate.peer_id,
                            "native",
                            float(candidate.examples),
                            params,
                            screen,
                        )
                    )
                    leases.append((lease, i))
            # the validator, once the window is closed: the tie-break salt, each candidate's lease
            # evidence drawn with it, its own update
            salt = hashlib.sha256("\n".join(sorted(c.candidate_id for c, _ in candidates)).encode()).digest()
            for n, (sub, (lease, i)) in enumerate(zip(submissions, leases, strict=True)):
                measurable = lease_measurable(len(leased[i][1]), pool)
                if (
                    policy.asks_lease_evidence
                    and measurable
                    and sub.params is not None
                    and _finite_like(base, sub.params)
                ):
                    z = self.evidence.z(salt, head_id, base, sub.params, lease.lease_id, lease.shard_ids, leased[i])
                    (tally.malicious_evidence if i in malicious else tally.benign_evidence).append(z)
                    submissions[n] = replace(sub, lease_evidence_z=z)
            tally.benign_pair_cosines += _pair_cosines(
                [_delta(trained[i], base) for i in range(peers) if i not in malicious]
            )  # how far apart honest work is: copies (``protocol.near_duplicates``) are at cosine 0.99 or more
            weighed = weigh_by_record(submissions, peer_records(merged_peers), dict(policy.max_examples_by_kind))
            decision = judge_window(
                self.learner.model, base, base_metrics | step, weighed, policy,
                lambda p: self.evaluate(p, self.data.holdout), trust,
                reference=anchor.reference(base, anchored[0], lambda held=anchored[1]: held) if use_reference else None,
                salt=salt,
            )  # fmt: skip
            step = {} if decision.update_norm is None else {"update_norm": decision.update_norm}
            trust = decision.trust
            tally.promoted += int(decision.promoted)
            for sub, bad in zip(submissions, is_malicious, strict=True):
                if not bad and sub.candidate_id in decision.reference_cosines:
                    tally.benign_cosines.append(decision.reference_cosines[sub.candidate_id])
                screen = decision.screens[sub.candidate_id]
                accepted = screen.accepted and decision.promoted
                judged.add(sub.candidate_id)
                credited = sub.candidate_id in decision.credited
                if bad:
                    tally.malicious += 1
                    tally.malicious_accepted += int(accepted)
                    tally.malicious_examples_credited += int(sub.examples) if credited else 0
                else:
                    tally.benign += 1
                    tally.benign_rejected += int(not accepted)
                    tally.benign_uncredited += int(accepted and not credited)
                if not accepted:
                    reason = str(screen.reason)
                    tally.reasons[reason] = tally.reasons.get(reason, 0) + 1
            previous = [(c, a) for c, a in candidates if decision.screens[c.candidate_id].accepted]
            # the next head's merged peers (none when nothing merged: the network makes an empty head)
            merged_peers.append({s.peer_id for s in submissions if s.candidate_id in decision.accepted})
            if decision.merged is not None:
                before, base = base, decision.merged
                base_metrics = decision.merged_metrics or base_metrics
                previous_head, head_id = head_id, HeadId(content_id(encode_tensors(base)))
        quarantined = trust.quarantine
        return {
            "setting": setting,
            "fresh_identities": fresh_identities,
            "peers": peers,
            "attack": attack,
            "fraction": fraction,
            "attackers": len(malicious),
            "preset": preset,
            "malicious_submissions": tally.malicious,
            "malicious_acceptance": tally.malicious_accepted / tally.malicious if tally.malicious else 0.0,
            "benign_submissions": tally.benign,
            "benign_false_rejection": tally.benign_rejected / tally.benign if tally.benign else 0.0,
            "final_test_accuracy": self.evaluate(base, self.data.test)["accuracy"],
            "attack_success": self.attack_success(base),
            "honest_quarantined": len(quarantined - malicious_ids),
            "quarantine_precision": len(quarantined & malicious_ids) / len(quarantined) if quarantined else 1.0,
            "quarantine_recall": len(quarantined & malicious_ids) / len(malicious_ids) if malicious_ids else 1.0,
            "rejection_reasons": tally.reasons,
            "windows_promoted": tally.promoted,
            "benign_min_cosine": min(tally.benign_cosines, default=float("nan")),
            "benign_max_pair_cosine": max(tally.benign_pair_cosines, default=None),  # None: one honest peer
            "malicious_examples_credited": tally.malicious_examples_credited,
            "benign_credit_withheld": tally.benign_uncredited / tally.benign if tally.benign else 0.0,
            "benign_min_evidence_z": min(tally.benign_evidence, default=float("nan")),
            "malicious_max_evidence_z": max(tally.malicious_evidence, default=float("nan")),
        }

    def _submit(self, attack: str | None, w: Window, signer: PureSigner, lease: Lease) -> list[tuple[Candidate, bytes]]:
        base_head = lease.base_head
        if attack == "replay":
            own_old = [c for c, _ in w.previous_submissions if c.peer_id == lease.peer_id]
            old = (own_old or [c for c, _ in w.previous_submissions])[0]
            return [(_candidate(signer, lease, base_head, old.candidate_id), b"")]  # re-signed for this window
        if attack == "stale_base":  # two windows old or more (one window late is a delayed update, judged)
            params_list = [w.own]
            base_head = HeadId(content_id(b"an older head"))
        elif attack is not None:
            craft = ATTACKS[attack]
            assert craft is not None
            params_list = craft(w)
        else:
            params_list = [w.own]
        out = []
        for params in params_list:
            artifact = encode_tensors(params)
            out.append((_candidate(signer, lease, base_head, content_id(artifact)), artifact))
        return out


def scenario_seed(attack: str, fraction: float, preset: str, setting: str = "iid", run: int = 0) -> int:
    """The scenario's random seed in run ``run``, the same in every process (Python's ``hash()`` of str is salted)."""
    return _seed(attack, fraction, preset, setting, run=run)


def _candidate(signer: PureSigner, lease: Lease, base_head: HeadId, candidate_id: str) -> Candidate:
    return Candidate(
        KEY, candidate_id, base_head, lease.lease_id,  # type: ignore[arg-type]
        signer.public_key, "native", STEPS * BATCH, STEPS, 1,
    ).signed(signer)  # fmt: skip


def _finite_like(base: Params, params: Params) -> bool:
    """Whether ``params`` has ``base``'s names and shapes and only finite values: what evidence can be measured on
    (``judge_window`` rejects the rest by schema first)."""
    return params.keys() == base.keys() and all(
        params[k].shape == base[k].shape and np.isfinite(params[k]).all() for k in base
    )


def _decode(artifact: bytes) -> Params:
    tensors, _ = decode_tensors(artifact)
    return tensors  # type: ignore[return-value]


def _sybil(attacker: int, window: int, seed: int) -> PureSigner:
    """Attacker ``attacker``'s key of ``window`` when it takes a new identity every window."""
    return PureSigner(hashlib.sha256(f"dtn-attack-suite/sybil/{attacker}/{window}/{seed}".encode()).digest())


def run_suite(
    datasets_dir: Path,
    presets: tuple[str, ...] = ("minimal", "balanced", "strict"),
    attacks: tuple[str, ...] = tuple(ATTACKS),
    fractions: tuple[float, ...] | None = None,
    windows: int = 4,
    peers: int = 10,
    settings: tuple[str, ...] = tuple(SETTINGS),
    progress: Callable[[str], None] = print,
    use_reference: bool = True,
    suite: Suite | None = None,
    seed: int = 0,
    fresh_identities: bool = False,
) -> dict[str, Any]:
    """Every planned (setting, attack, fraction) with an attack in ``attacks``, for each preset, plus
    each setting's clean run; in the iid setting, with ``fractions`` given, each attack at exactly
    those fractions instead of its planned ones. ``suite``: an already warmed-up suite of ``peers``,
    ``windows`` and ``seed`` to reuse; ``fresh_identities``: attackers take new keys every window
    (``Suite.run``)."""
    suite = suite or Suite(load_data(datasets_dir), peers, windows, seed=seed)
    if (suite.peers, suite.windows, suite.seed) != (peers, windows, seed):
        raise ValueError("the suite given was built for other peers, windows or seed")
    rows = []
    clean: dict[str, dict[str, dict[str, float]]] = {}
    for preset in presets:
        for setting in settings:
            clean_row = suite.run("clean", 0.0, preset, setting, use_reference=use_reference)
            clean.setdefault(preset, {})[setting] = {
                "accuracy": clean_row["final_test_accuracy"],
                "attack_success": clean_row["attack_success"],
            }
            planned = [("clean", 0.0)] + [
                (attack, fraction)
                for attack, allowed in PLAN[setting]
                if attack in attacks
                for fraction in (fractions if fractions is not None and setting == "iid" else allowed)
            ]
            for attack, fraction in planned:
                row = (
                    clean_row
                    if attack == "clean"
                    else suite.run(
                        attack,
                        fraction,
                        preset,
                        setting,
                        use_reference=use_reference,
                        fresh_identities=fresh_identities,
                    )
                )
                row = row | {
                    "accuracy_vs_clean": row["final_test_accuracy"] - clean_row["final_test_accuracy"],
                    "attack_success_vs_clean": row["attack_success"] - clean_row["attack_success"],
                }
                rows.append(row)
                progress(
                    f"{preset:9s} {setting:10s} {attack:18s} {fraction:4.2f}  malicious accepted"
                    f" {row['malicious_acceptance']:.2f}  benign rejected {row['benign_false_rejection']:.3f}"
                    f"  acc {row['final_test_accuracy']:.4f} ({row['accuracy_vs_clean']:+.4f})"
                    f"  attack success {row['attack_success']:.3f} ({row['attack_success_vs_clean']:+.3f})"
                    f"  honest quarantined {row['honest_quarantined']}"
                )
    return {
        "windows": windows,
        "peers": peers,
        "seed": seed,
        "reference": use_reference,
        "fresh_identities": fresh_identities,
        "warm_accuracy": suite.evaluate(suite.warm, suite.data.test)["accuracy"],
        "warm_attack_success": suite.attack_success(suite.warm),
        "clean": clean,
        "clean_accuracy": {p: clean[p]["iid"]["accuracy"] for p in presets if "iid" in clean[p]},
        "rows": rows,
    }


def scorecard_table(scorecard: dict[str, Any]) -> str:
    lines = [
        f"Attack suite: {scorecard['peers']} peers (cohort settings: 2 or 3), {scorecard['windows']} windows per"
        f" scenario (seed {scorecard.get('seed', 0)}{', attackers on new keys every window' if scorecard.get('fresh_identities') else ''}),"
        f" real MNIST updates, judged {'with' if scorecard.get('reference', True) else 'without'} the"
        f" validator's reference update. Start: test accuracy"
        f" {scorecard['warm_accuracy']:.4f}, trigger attack success {scorecard['warm_attack_success']:.3f}.",
        "",
        "| preset | setting | attack | fraction | malicious accepted | benign rejected | test acc | vs clean "
        "| attack success | vs clean | honest quarantined | quarantine P / R | malicious examples credited |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in scorecard["rows"]:
        lines.append(
            f"| {r['preset']} | {r['setting']} | {r['attack']} | {r['fraction']:.2f} | {r['malicious_acceptance']:.2f} "
            f"| {r['benign_false_rejection']:.3f} | {r['final_test_accuracy']:.4f} | {r['accuracy_vs_clean']:+.4f} "
            f"| {r['attack_success']:.3f} | {r['attack_success_vs_clean']:+.3f} | {r['honest_quarantined']} "
            f"| {r['quarantine_precision']:.2f} / {r['quarantine_recall']:.2f} | {r['malicious_examples_credited']} |"
        )
    return "\n".join(lines) + "\n"


def write_scorecard(out: Path, scorecard: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "scorecard.json").write_text(json.dumps(scorecard, indent=1))
    (out / "scorecard.md").write_text(scorecard_table(scorecard))
