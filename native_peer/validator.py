"""Validators: the authority that decides what becomes the shared model.

For each experiment a validator creates the genesis head, then loops over windows. A window is
the set of candidates trained on the current head. It closes when every live lease of the window
has delivered a candidate, or when the deadline passes (``deadline_factor`` × the median of recent
window durations, clamped to [``min_deadline_s``, the experiment's ``window_timeout_s``]).

Every candidate is judged on what the validator measures itself, never on reported metrics:

1. base is the current head               → ``stale_base``
2. artifact id not seen before            → (judged once; a re-sent artifact is never judged again)
3. trainer signature                      → ``bad_signature``
4. lease exists, is the trainer's, is for this base, covers the claimed examples
                                          → ``wrong_lease`` / ``out_of_lease``
5. artifact downloads and decodes         → ``undecodable``
then, in ``protocol.judging.judge_window`` (pure, shared with the attack suite):
6. peer not quarantined                   → ``quarantined`` (``protocol.trust``)
7. one candidate per peer per window      → ``replay``
8. names, shapes, dtype, finite values    → ``wrong_shape`` / ``non_finite``
9. update norm and direction vs. cohort   → ``norm_too_large`` / ``free_rider`` / ``outlier``
10. validation loss vs. the base head     → ``regression``

Accepted candidates are merged with the preset's aggregator, weighted by examples capped per peer
kind (weighted mean:
``base + Σ nᵢ(θᵢ − base) / Σ nᵢ``, accumulated in float64, candidates ordered by content id). The
merged model is evaluated on the validation split; if its loss exceeds the current head's by more
than the preset's margin, promotion is blocked. Otherwise the head is signed and published, and a
signed verdict with its reason is published for every candidate. State survives restarts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np

from datasets.mnist import load_split
from protocol.codec import decode_tensors, encode_tensors
from protocol.envelope import pack_envelope
from protocol.errors import ProtocolError
from protocol.hashing import content_id
from protocol.ids import HeadId
from protocol.judging import Submission, judge_window, precheck, stale_base
from protocol.manifests import ExperimentSpec, NetworkManifest
from protocol.messages import Candidate, HeadDescriptor, Verdict
from protocol.screening import PRESETS, Screen
from protocol.trust import TrustBook

from .edge_client import EdgeClient, EdgeRequestError
from .identity import NodeIdentity
from .learner import Evaluator, JaxLearner
from .storage import StorageConfig, write_atomic

__all__ = ["Validator", "ValidatorConfig", "WindowReport"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValidatorConfig:
    poll_s: float = 0.25
    min_deadline_s: float = 5.0
    deadline_factor: float = 3.0
    history: int = 10
    clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True)
class WindowReport:
    experiment: str
    window: int
    promoted: HeadDescriptor | None
    verdicts: tuple[Verdict, ...]


def _named(split: str, result: dict[str, float]) -> dict[str, float]:
    """``{"loss", "accuracy"}`` as ``{"<split>_loss", "<split>_accuracy"}``."""
    return {f"{split}_loss": result["loss"], f"{split}_accuracy": result["accuracy"]}


class Validator:
    def __init__(
        self,
        learner: JaxLearner,
        network: NetworkManifest,
        storage: StorageConfig,
        edge_url: str,
        datasets_dir: Path,
        config: ValidatorConfig = ValidatorConfig(),
        *,
        admission_token: str | None = None,
    ) -> None:
        self.learner = learner
        self.identity = NodeIdentity.load_or_create(storage.identity_path)
        if self.identity.public_key not in network.validator_key_set:
            raise ValueError("this node's key is not a validator key of the network manifest")
        self.storage = storage
        self.config = config
        self.edge = EdgeClient(edge_url, token=admission_token)
        self.network = replace(network, edge_key=network.edge_key or self.edge.network().edge_key)
        self.datasets_dir = datasets_dir
        self.evaluate = Evaluator(learner)
        self._splits: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        self._state_path = storage.root / "validator-state.json"
        self._state: dict[str, Any] = storage.read_json(self._state_path, {"judged": {}, "durations": {}})
        self.trust = TrustBook.from_wire(self._state["trust"]) if "trust" in self._state else TrustBook()
        self._window_opened: dict[str, float] = {}

    def close(self) -> None:
        self.edge.close()

    # -- data and state --------------------------------------------------------------------
    def _split(self, spec: ExperimentSpec, split: str) -> tuple[np.ndarray, np.ndarray]:
        cache = self._splits.setdefault(spec.dataset_id, {})
        if split not in cache:
            cache[split] = load_split(self.datasets_dir / spec.dataset_id, split)
        return cache[split]

    def _evaluate(self, spec: ExperimentSpec, params: Any, split: str) -> dict[str, float]:
        return self.evaluate(params, *self._split(spec, split))

    def _save_state(self) -> None:
        write_atomic(self._state_path, json.dumps(self._state).encode())

    def _deadline_s(self, spec: ExperimentSpec) -> float:
        recent = self._state["durations"].get(spec.key, [])[-self.config.history :]
        if not recent:
            return spec.window_timeout_s
        derived = self.config.deadline_factor * statistics.median(recent)
        return min(max(derived, self.config.min_deadline_s), spec.window_timeout_s)

    # -- heads -----------------------------------------------------------------------------
    def _sign_head(
        self,
        spec: ExperimentSpec,
        params: Any,
        parent: HeadDescriptor | None,
        merged: Sequence[str],
        steps: int,
        validation: dict[str, float],
    ) -> tuple[HeadDescriptor, bytes]:
        """The signed head for ``params``; ``validation`` is their already measured validation result."""
        window = 0 if parent is None else parent.window + 1
        artifact = encode_tensors(
            self.learner.to_tensors(params), {"model": spec.model, "experiment": spec.key, "window": str(window)}
        )
        head = HeadDescriptor(
            experiment=spec.key,
            head_id=HeadId(content_id(artifact)),
            parent=None if parent is None else parent.head_id,
            window=window,
            global_step=(0 if parent is None else parent.global_step) + steps,
            merged=tuple(sorted(merged)),  # type: ignore[arg-type]
            validator_key=self.identity.public_key,
            created_at_ms=int(time.time() * 1000),
            metrics=_named("val", validation) | _named("test", self._evaluate(spec, params, "test")),
        ).signed(self.identity)
        return head, artifact

    def ensure_genesis(self, spec: ExperimentSpec) -> HeadDescriptor:
        """The experiment's current head, creating the genesis head if there is none."""
        head = self.edge.current_head(spec.key)
        if head is not None:
            head.verify_trusted(self.network.validator_key_set)
            return head
        seed = int.from_bytes(hashlib.sha256(spec.key.encode()).digest()[:4], "big")
        params = self.learner.init(jax.random.PRNGKey(seed))
        head, artifact = self._sign_head(spec, params, None, (), 0, self._evaluate(spec, params, "validation"))
        try:
            self.edge.publish_head(spec.key, pack_envelope(head.to_wire(), artifact))
        except EdgeRequestError as exc:
            if exc.status != 409:
                raise
            return self.ensure_genesis(spec)
        log.info("%s: genesis head %s (val acc %.4f)", spec.key, head.head_id[:19], head.metrics["val_accuracy"])
        return head

    def _head_params(self, head: HeadDescriptor) -> dict[str, np.ndarray]:
        data = self.edge.artifact(head.head_id, self.storage.head_path(head.head_id))
        tensors, _ = decode_tensors(data)
        return tensors

    # -- one polling round -----------------------------------------------------------------
    def poll(self, spec: ExperimentSpec) -> WindowReport | None:
        """Judge what is ready; close the window and promote when its time has come."""
        self._flush()
        head = self.ensure_genesis(spec)
        judged: dict[str, str] = self._state["judged"]
        fresh = [c for c in self.edge.candidates(spec.key) if c.candidate_id not in judged]
        verdicts = [
            self._verdict(c, stale_base(c.base_head, head.head_id)) for c in fresh if c.base_head != head.head_id
        ]
        window = [c for c in fresh if c.base_head == head.head_id]
        if head.head_id not in self._window_opened:
            self._window_opened = {head.head_id: self.config.clock()}  # a new window; older ones are closed
        opened = self._window_opened[head.head_id]
        if verdicts:
            self._record(verdicts)
            self._flush()
        if len(window) < spec.min_candidates:
            return None
        now_ms = time.time() * 1000
        live = [lease for lease in self.edge.leases(spec.key, head.head_id) if lease.expires_at_ms > now_ms]
        delivered = {c.peer_id for c in window}
        everyone_in = all(lease.peer_id in delivered for lease in live)
        if not everyone_in and self.config.clock() - opened < self._deadline_s(spec):
            return None
        if everyone_in:
            durations = self._state["durations"].setdefault(spec.key, [])
            durations.append(self.config.clock() - opened)
            del durations[: -self.config.history]
        return self._close_window(spec, head, window)

    def _close_window(self, spec: ExperimentSpec, head: HeadDescriptor, window: list[Candidate]) -> WindowReport:
        policy = PRESETS[spec.screening]
        val_x, val_y = self._split(spec, "validation")
        decision = judge_window(
            self.learner.model,
            self._head_params(head),
            {"loss": head.metrics["val_loss"]},
            [self._precheck(spec, head, candidate) for candidate in window],
            policy,
            lambda params: self.evaluate(self.learner.from_tensors(params), val_x, val_y),
            self.trust,
        )
        promoted: HeadDescriptor | None = None
        if decision.merged is not None:
            steps = sum(c.steps for c in window if c.candidate_id in decision.accepted)
            params = self.learner.from_tensors(decision.merged)
            assert decision.merged_metrics is not None  # judge_window measures every merge it promotes
            promoted, artifact = self._sign_head(spec, params, head, decision.accepted, steps, decision.merged_metrics)
            write_atomic(self.storage.head_path(promoted.head_id), artifact)
            self._state["pending_head"] = promoted.to_wire()
        metrics = {cid: _named("val", m) for cid, m in decision.candidate_metrics.items()}
        verdicts = [
            self._verdict(c, decision.screens[c.candidate_id], promoted, metrics.get(c.candidate_id, {}))
            for c in window
        ]
        self._state["trust"] = self.trust.to_wire()
        self._record(verdicts)
        self._flush()
        if promoted is not None:
            log.info(
                "%s: window %d closed, %d/%d accepted, head %s val acc %.4f test acc %.4f",
                spec.key,
                promoted.window,
                len(decision.accepted),
                len(window),
                promoted.head_id[:19],
                promoted.metrics["val_accuracy"],
                promoted.metrics["test_accuracy"],
            )
        return WindowReport(spec.key, head.window, promoted, tuple(verdicts))

    def _precheck(self, spec: ExperimentSpec, head: HeadDescriptor, candidate: Candidate) -> Submission:
        """Fetch what ``protocol.judging.precheck`` needs (lease, manifest), then the artifact."""
        lease = self.edge.lease(candidate.lease_id)
        leased = 0
        if lease is not None:
            manifest = self.edge.fetch_manifest(lease.dataset_id)
            leased = sum(manifest.shard(s).examples for s in lease.shard_ids) * spec.local_epochs
        screen = precheck(
            candidate,
            current_head=head.head_id,
            judged=self._state["judged"],
            lease=lease,
            leased_examples=leased,
            edge_key=self.network.edge_key,
        )
        tensors = None
        if screen.accepted:
            path = self.storage.root / "candidates" / candidate.candidate_id.removeprefix("sha256:")
            try:
                tensors, _ = decode_tensors(self.edge.artifact(candidate.candidate_id, path))
            except (ProtocolError, EdgeRequestError) as exc:
                screen = Screen(False, f"undecodable: {exc}")
        return Submission(
            candidate.candidate_id, candidate.peer_id, candidate.peer_kind, float(candidate.examples), tensors, screen
        )

    def _verdict(
        self,
        candidate: Candidate,
        screen: Screen,
        promoted: HeadDescriptor | None = None,
        metrics: dict[str, float] | None = None,
    ) -> Verdict:
        return Verdict(
            experiment=candidate.experiment,
            candidate_id=candidate.candidate_id,
            base_head=candidate.base_head,
            peer_id=candidate.peer_id,
            accepted=screen.accepted and promoted is not None,
            reason=screen.reason[:200],
            validator_key=self.identity.public_key,
            decided_at_ms=int(time.time() * 1000),
            head_id=promoted.head_id if screen.accepted and promoted is not None else None,
            metrics=metrics or {},
        ).signed(self.identity)

    def _record(self, verdicts: Sequence[Verdict]) -> None:
        """Write decisions to disk first (judged ids and an outbox), then publish from the outbox."""
        for verdict in verdicts:
            self._state["judged"][verdict.candidate_id] = verdict.reason
        self._state.setdefault("outbox", []).extend(v.to_wire() for v in verdicts)
        self._save_state()

    def _flush(self) -> None:
        """Publish a recorded head, then recorded verdicts; safe to repeat after a crash."""
        pending = self._state.get("pending_head")
        if pending is not None:
            head = HeadDescriptor.from_wire(pending)
            artifact = self.storage.head_path(head.head_id).read_bytes()
            try:
                self.edge.publish_head(head.experiment, pack_envelope(head.to_wire(), artifact))
            except EdgeRequestError as exc:
                if exc.status != 409:
                    raise
                log.warning("recorded head %s was not promoted: %s", head.head_id[:19], exc)
            self._state["pending_head"] = None
            self._save_state()
        outbox = self._state.get("outbox", [])
        while outbox:
            self.edge.publish_verdict(Verdict.from_wire(outbox[0]))
            outbox.pop(0)
            self._save_state()

    def run(self, specs: Sequence[ExperimentSpec], stop: threading.Event) -> None:
        """Validate ``specs`` until ``stop`` is set."""
        failures = 0
        while not stop.is_set():
            try:
                for spec in specs:
                    self.poll(spec)
                failures = 0
            except (httpx.TransportError, EdgeRequestError) as exc:
                failures += 1
                backoff_s = min(30.0, 0.5 * 2**failures)
                log.warning("edge unavailable (%s); retrying in %.1f s", exc, backoff_s)
                stop.wait(backoff_s)
            stop.wait(self.config.poll_s)
