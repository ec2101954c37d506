"""The attack suite: the validator's real decision rules against attackers, on real MNIST updates.

Each scenario runs ``windows`` windows with ``peers`` trainers, a fraction of them malicious, under
one screening preset. Honest peers train real updates (JAX, Adam, one leased shard each); attackers
train too, then craft what they submit from their own update or the honest ones (which they are
assumed to see). Every submission is a real signed ``Candidate`` with a real edge-signed ``Lease``
and goes through ``protocol.judging.precheck`` and ``judge_window`` (with a ``TrustBook``), exactly
as a validator runs them. The scorecard reports, per attack × fraction × preset: malicious
acceptance rate, benign false rejection rate, final head test accuracy vs. the clean run (fraction
0), and quarantine precision/recall.

    python -m lab attack-suite --out var/attack-suite [--windows 4] [--presets balanced ...]
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

from datasets import mnist
from datasets.layout import load_split
from native_peer.learner import Evaluator, TrainEngine
from native_peer.mnist import mlp_learner
from protocol.batches import make_batches
from protocol.codec import decode_tensors, encode_tensors
from protocol.hashing import content_id
from protocol.ids import DatasetId, ExperimentKey, HeadId, LeaseId
from protocol.judging import FRESH_TRUST, Submission, judge_window, precheck
from protocol.leases import assign_leases
from protocol.messages import Candidate, Lease
from protocol.model import Params
from protocol.screening import PRESETS
from protocol.shards import decode_shard
from protocol.signing import PureSigner, peer_id_from_public_key

__all__ = ["ATTACKS", "run_suite"]

KEY = ExperimentKey.parse("attack/mnist/rev-1")
EDGE = PureSigner(b"\xed" * 32)
FRACTIONS = (0.0, 0.1, 0.2, 0.33)
LEARNING_RATE = 2e-3
BATCH = 64


@dataclass
class Window:
    """What attackers may use when crafting: the base, their own and the honest updates."""

    base: Params
    own: Params
    honest: list[Params]
    previous_submissions: list[tuple[Candidate, bytes]]
    rng: np.random.Generator


def _delta(params: Params, base: Params) -> dict[str, np.ndarray]:
    return {k: params[k].astype(np.float64) - base[k] for k in base}


def _apply(base: Params, delta: dict[str, np.ndarray]) -> Params:
    return {k: (base[k] + delta[k]).astype(np.float32) for k in base}


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
    scale = 2.0 * np.sqrt(sum((v**2).sum() for v in mean.values())) / np.sqrt(sum((v**2).sum() for v in push.values()))
    return [_apply(w.base, {k: mean[k] + scale * push[k] for k in mean})]


def _late_flood(w: Window) -> list[Params]:
    """Five noise updates per attacker, each of honest size."""
    mean, _ = _honest_stats(w)
    norm = np.sqrt(sum((v**2).sum() for v in mean.values()))
    floods = []
    for _ in range(5):
        noise = {k: w.rng.standard_normal(v.shape) for k, v in mean.items()}
        scale = norm / np.sqrt(sum((v**2).sum() for v in noise.values()))
        floods.append(_apply(w.base, {k: scale * v for k, v in noise.items()}))
    return floods


def _low_norm_backdoor(w: Window) -> list[Params]:
    """Own update plus a small push that maps a trigger (a bright corner) to class 0, kept at the
    honest norm so norm screening cannot see it."""
    delta = _delta(w.own, w.base)
    trigger = np.zeros(784)
    trigger[-30:] = 1.0
    delta["dense0.kernel"][:, :8] += 0.02 * trigger[:, None]
    honest_norm = np.median([np.sqrt(sum((v**2).sum() for v in _delta(p, w.base).values())) for p in w.honest])
    norm = np.sqrt(sum((v**2).sum() for v in delta.values()))
    return [_apply(w.base, {k: v * honest_norm / norm for k, v in delta.items()})]


# Attacks whose damage is in the descriptor, not the parameters, return None: handled in _submit.
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
    "low_norm_backdoor": _low_norm_backdoor,
}


@dataclass
class Data:
    shards: list[tuple[np.ndarray, np.ndarray]]
    val: tuple[np.ndarray, np.ndarray]
    test: tuple[np.ndarray, np.ndarray]


@dataclass
class Tally:
    malicious: int = 0
    malicious_accepted: int = 0
    benign: int = 0
    benign_rejected: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


def load_data(datasets_dir: Path, validation_size: int = 2000) -> Data:
    manifest = mnist.prepare(datasets_dir)
    root = datasets_dir / "mnist"
    shards = [decode_shard((root / "train" / entry.locator).read_bytes()) for entry in manifest.shards]
    val_x, val_y = load_split(root, "validation")
    return Data(shards, (val_x[:validation_size], val_y[:validation_size]), load_split(root, "test"))


class Suite:
    def __init__(self, data: Data, peers: int, windows: int, warmup_windows: int = 2) -> None:
        self.data = data
        self.peers = peers
        self.windows = windows
        self.learner = mlp_learner()
        self.engine = TrainEngine(self.learner, optax.adam(LEARNING_RATE))
        self.evaluator = Evaluator(self.learner)
        self.signers = [PureSigner(i.to_bytes(2, "big") * 16) for i in range(1, peers + 1)]
        self.genesis = self.learner.to_tensors(self.learner.init(jax.random.PRNGKey(0)))
        self.warm, self.warm_updates, self.warm_states = self._warm_up(warmup_windows)

    def evaluate(self, params: Params, split: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
        return self.evaluator(self.learner.from_tensors(params), *split)

    def _train(self, base: Params, shard: int, opt_state: Any, seed: int) -> tuple[Params, Any]:
        x, y = self.data.shards[shard]
        xb, yb = make_batches(x, y, BATCH, seed)
        params = self.learner.from_tensors(base)
        params, opt_state, _ = self.engine.train_epoch(params, opt_state, xb, yb)
        return self.learner.to_tensors(params), opt_state

    def _warm_up(self, windows: int) -> tuple[Params, list[Params], list[Any]]:
        """A shared mid-training head (clean FedAvg windows) every scenario starts from, the
        updates of its last window (what a replaying attacker can resend in the first window), and
        each peer's optimizer state (trainers keep theirs across windows)."""
        base = self.genesis
        updates: list[Params] = []
        states = [self.engine.init_optimizer(self.learner.from_tensors(base)) for _ in range(self.peers)]
        for window in range(windows):
            updates = []
            for i in range(self.peers):
                params, states[i] = self._train(
                    base, (window * self.peers + i) % len(self.data.shards), states[i], window
                )
                updates.append(params)
            base = {k: np.mean([u[k] for u in updates], axis=0).astype(np.float32) for k in base}
        return base, updates, states

    def run(self, attack: str, fraction: float, preset: str) -> dict[str, Any]:
        policy = PRESETS[preset]
        malicious = set(range(round(fraction * self.peers)))
        trust = FRESH_TRUST
        tally = Tally()
        base = self.warm
        base_metrics = self.evaluate(base, self.data.val)
        states = list(self.warm_states)
        old_artifacts = [encode_tensors(u) for u in self.warm_updates]
        judged: set[str] = {content_id(a) for a in old_artifacts}
        old_lease = Lease(
            LeaseId("lease-old"),
            KEY,
            peer_id_from_public_key(self.signers[0].public_key),
            HeadId(content_id(b"old")),
            0,
            DatasetId("mnist"),
            (),
            0,
            1,
        )
        previous = [
            (_candidate(self.signers[0], old_lease, old_lease.base_head, content_id(a)), a) for a in old_artifacts
        ]
        rng = np.random.default_rng(scenario_seed(attack, fraction, preset))
        head_id = HeadId(content_id(encode_tensors(base)))
        previous_head = head_id
        for window in range(self.windows):
            peer_ids = [peer_id_from_public_key(s.public_key) for s in self.signers]
            assignment = assign_leases(head_id, peer_ids, [str(i) for i in range(len(self.data.shards))], 1)  # type: ignore[arg-type]
            trained: list[Params] = []
            for i, peer in enumerate(peer_ids):
                params, states[i] = self._train(base, int(assignment[peer][0]), states[i], window + 100)
                trained.append(params)
            honest = [trained[i] for i in range(self.peers) if i not in malicious]
            submissions, candidates, is_malicious = [], [], []
            for i, (signer, peer) in enumerate(zip(self.signers, peer_ids, strict=True)):
                lease = Lease(
                    LeaseId(f"lease-{window}-{i}"), KEY, peer, head_id, window, DatasetId("mnist"),
                    assignment[peer], 0, 2**40,
                ).signed(EDGE)  # fmt: skip
                ctx = Window(base, trained[i], honest, previous, rng)
                for candidate, artifact in self._submit(
                    attack if i in malicious else None, ctx, signer, lease, previous_head
                ):
                    candidates.append((candidate, artifact))
                    is_malicious.append(i in malicious)
                    screen = precheck(
                        candidate,
                        current_head=head_id,
                        judged=judged,
                        lease=lease,
                        leased_examples=1000,
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
            decision = judge_window(
                self.learner.model, base, {"loss": base_metrics["loss"]}, submissions, policy,
                lambda p: self.evaluate(p, self.data.val), trust,
            )  # fmt: skip
            trust = decision.trust
            for sub, bad in zip(submissions, is_malicious, strict=True):
                screen = decision.screens[sub.candidate_id]
                accepted = screen.accepted and decision.promoted
                judged.add(sub.candidate_id)
                if bad:
                    tally.malicious += 1
                    tally.malicious_accepted += int(accepted)
                else:
                    tally.benign += 1
                    tally.benign_rejected += int(not accepted)
                if not accepted:
                    reason = str(screen.reason)
                    tally.reasons[reason] = tally.reasons.get(reason, 0) + 1
            previous = [(c, a) for c, a in candidates if decision.screens[c.candidate_id].accepted]
            if decision.merged is not None:
                base = decision.merged
                base_metrics = decision.merged_metrics or base_metrics
                previous_head, head_id = head_id, HeadId(content_id(encode_tensors(base)))
        quarantined = trust.quarantine
        malicious_ids = {peer_id_from_public_key(self.signers[i].public_key) for i in malicious}
        return {
            "attack": attack,
            "fraction": fraction,
            "preset": preset,
            "malicious_submissions": tally.malicious,
            "malicious_acceptance": tally.malicious_accepted / tally.malicious if tally.malicious else 0.0,
            "benign_submissions": tally.benign,
            "benign_false_rejection": tally.benign_rejected / tally.benign if tally.benign else 0.0,
            "final_test_accuracy": self.evaluate(base, self.data.test)["accuracy"],
            "quarantine_precision": len(quarantined & malicious_ids) / len(quarantined) if quarantined else 1.0,
            "quarantine_recall": len(quarantined & malicious_ids) / len(malicious_ids) if malicious_ids else 1.0,
            "rejection_reasons": tally.reasons,
        }

    def _submit(
        self, attack: str | None, w: Window, signer: PureSigner, lease: Lease, previous_head: HeadId
    ) -> list[tuple[Candidate, bytes]]:
        base_head = lease.base_head
        if attack == "replay":
            own_old = [c for c, _ in w.previous_submissions if c.peer_id == lease.peer_id]
            old = (own_old or [c for c, _ in w.previous_submissions])[0]
            return [(_candidate(signer, lease, base_head, old.candidate_id), b"")]  # re-signed for this window
        if attack == "stale_base":
            params_list = [w.own]
            base_head = previous_head if previous_head != lease.base_head else HeadId(content_id(b"an older head"))
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


def scenario_seed(attack: str, fraction: float, preset: str) -> int:
    """The scenario's random seed, the same in every process (Python's ``hash()`` of str is salted)."""
    return int.from_bytes(hashlib.sha256(f"{attack}|{fraction!r}|{preset}".encode()).digest()[:8], "big")


def _candidate(signer: PureSigner, lease: Lease, base_head: HeadId, candidate_id: str) -> Candidate:
    return Candidate(
        KEY, candidate_id, base_head, lease.lease_id,  # type: ignore[arg-type]
        signer.public_key, "native", 1000 - 1000 % BATCH, 1000 // BATCH, int(time.time() * 1000),
    ).signed(signer)  # fmt: skip


def _decode(artifact: bytes) -> Params:
    tensors, _ = decode_tensors(artifact)
    return tensors  # type: ignore[return-value]


def run_suite(
    datasets_dir: Path,
    presets: tuple[str, ...] = tuple(PRESETS),
    attacks: tuple[str, ...] = tuple(ATTACKS),
    fractions: tuple[float, ...] = FRACTIONS,
    windows: int = 4,
    peers: int = 10,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    suite = Suite(load_data(datasets_dir), peers, windows)
    rows = []
    clean: dict[str, float] = {}
    for preset in presets:
        clean_row = suite.run("clean", 0.0, preset)  # no attacker: the reference run
        clean[preset] = clean_row["final_test_accuracy"]
        for attack in attacks:
            for fraction in fractions:
                row = clean_row | {"attack": attack} if fraction == 0 else suite.run(attack, fraction, preset)
                row["accuracy_vs_clean"] = row["final_test_accuracy"] - clean[preset]
                rows.append(row)
                progress(
                    f"{preset:9s} {attack:18s} {fraction:4.2f}  malicious accepted {row['malicious_acceptance']:.2f}"
                    f"  benign rejected {row['benign_false_rejection']:.3f}  acc {row['final_test_accuracy']:.4f}"
                )
    return {"windows": windows, "peers": peers, "clean_accuracy": clean, "rows": rows}


def scorecard_table(scorecard: dict[str, Any]) -> str:
    lines = [
        f"Attack suite: {scorecard['peers']} peers, {scorecard['windows']} windows per scenario, real MNIST updates.",
        "",
        "| preset | attack | fraction | malicious accepted | benign rejected | test acc | vs clean | quarantine P / R |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in scorecard["rows"]:
        lines.append(
            f"| {r['preset']} | {r['attack']} | {r['fraction']:.2f} | {r['malicious_acceptance']:.2f} "
            f"| {r['benign_false_rejection']:.3f} | {r['final_test_accuracy']:.4f} | {r['accuracy_vs_clean']:+.4f} "
            f"| {r['quarantine_precision']:.2f} / {r['quarantine_recall']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def write_scorecard(out: Path, scorecard: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "scorecard.json").write_text(json.dumps(scorecard, indent=1))
    (out / "scorecard.md").write_text(scorecard_table(scorecard))
