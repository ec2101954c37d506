"""Validators: the authority that decides what becomes the shared model.

For each experiment a validator creates the genesis head, then loops over windows. A window is
the set of candidates trained on the current head. It closes when every live lease of the window
has delivered a candidate, or when the deadline passes (``deadline_factor`` × the median of recent
window durations, clamped to [``min_deadline_s``, the experiment's ``window_timeout_s``];
``protocol.deadline``).

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
than the preset's margin, the merge is blocked (``merge_blocked``). The next head is signed and
published either way: the merged parameters, or, when nothing was accepted, the same parameters
under a new head id (``merged`` empty), so trainers get fresh leases and an all-reject window never
stalls the experiment. A signed verdict with its typed reason (``protocol.reasons.Reason``) is
published for every candidate.

Each experiment has its own open window and deadline (one validator may run several experiments).

State (``ValidatorState``: judged ids, recent window durations, the trust book, an outbox of
decisions not yet published) is one typed, bounded object, written to disk once per flush, before
anything it records is published; evaluation data is read through ``datasets.layout``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np

from datasets.layout import load_split
from protocol.backoff import Backoff
from protocol.clock import SYSTEM_CLOCK, Clock
from protocol.codec import decode_tensors, encode_tensors
from protocol.deadline import DeadlinePolicy, window_deadline_s
from protocol.envelope import pack_envelope
from protocol.errors import ProtocolError
from protocol.fields import read_float, read_list, read_object, read_str
from protocol.hashing import content_id
from protocol.ids import HeadId
from protocol.judging import Submission, judge_window, precheck, stale_base
from protocol.manifests import ExperimentSpec, NetworkManifest
from protocol.messages import Candidate, HeadDescriptor, Verdict
from protocol.reasons import Reason
from protocol.screening import PRESETS, Screen
from protocol.trust import TrustBook

from .edge_client import EdgeClient, EdgeRequestError
from .identity import NodeIdentity
from .learner import Evaluator, JaxLearner
from .storage import StorageConfig, write_atomic

__all__ = ["Validator", "ValidatorConfig", "ValidatorState", "WindowReport"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValidatorConfig:
    poll_s: float = 0.25
    deadline: DeadlinePolicy = field(default_factory=DeadlinePolicy)
    max_judged: int = 100_000  # candidate ids remembered for replay detection (oldest forgotten first)
    clock: Clock = SYSTEM_CLOCK


@dataclass
class ValidatorState:
    """What a validator must remember across restarts, bounded; saved whole by ``save``.

    ``judged``: candidate id → the reason it was decided with (insertion order = age);
    ``durations``: recent full-window durations per experiment; ``outbox``: recorded verdicts not yet
    published; ``pending_head``: a signed head recorded but not yet published."""

    judged: dict[str, Reason] = field(default_factory=dict)
    durations: dict[str, list[float]] = field(default_factory=dict)
    trust: TrustBook = field(default_factory=TrustBook)
    outbox: list[Verdict] = field(default_factory=list)
    pending_head: HeadDescriptor | None = None

    def record(self, verdicts: Sequence[Verdict], max_judged: int) -> None:
        for verdict in verdicts:
            self.judged[verdict.candidate_id] = verdict.reason
        for stale in list(self.judged)[: max(0, len(self.judged) - max_judged)]:
            del self.judged[stale]
        self.outbox.extend(verdicts)

    def add_duration(self, experiment: str, seconds: float, history: int) -> None:
        self.durations[experiment] = [*self.durations.get(experiment, []), seconds][-history:]

    def to_wire(self) -> dict[str, Any]:
        return {
            "judged": {cid: str(reason) for cid, reason in self.judged.items()},
            "durations": self.durations,
            "trust": self.trust.to_wire(),
            "outbox": [v.to_wire() for v in self.outbox],
            "pending_head": None if self.pending_head is None else self.pending_head.to_wire(),
        }

    @classmethod
    def from_wire(cls, value: object) -> ValidatorState:
        d = read_object(value, "validator state")
        judged = read_object(d.get("judged"), "judged")
        durations = read_object(d.get("durations"), "durations")
        pending = d.get("pending_head")
        return cls(
            judged={cid: Reason(read_str(judged, cid, max_len=32)) for cid in judged},
            durations={key: read_list(durations, key, _seconds) for key in durations},
            trust=TrustBook.from_wire(d.get("trust")),
            outbox=read_list(d, "outbox", Verdict.from_wire, max_len=1 << 20),
            pending_head=None if pending is None else HeadDescriptor.from_wire(pending),
        )

    @classmethod
    def load(cls, path: Path) -> ValidatorState:
        return cls.from_wire(json.loads(path.read_bytes())) if path.exists() else cls()

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(self.to_wire()).encode())


@dataclass(frozen=True)
class WindowReport:
    """A closed window: the head that follows it and a verdict per candidate. Without any accepted
    candidate the next head carries the same parameters (``merged`` is empty), so trainers get fresh
    leases and the experiment goes on."""

    experiment: str
    window: int
    head: HeadDescriptor
    verdicts: tuple[Verdict, ...]

    @property
    def merged(self) -> bool:
        return bool(self.head.merged)


def _named(split: str, result: dict[str, float]) -> dict[str, float]:
    """``{"loss", "accuracy"}`` as ``{"<split>_loss", "<split>_accuracy"}``."""
    return {f"{split}_loss": result["loss"], f"{split}_accuracy": result["accuracy"]}


def _unnamed(split: str, metrics: dict[str, float]) -> dict[str, float]:
    """The inverse of ``_named``: ``{"<split>_loss", ...}`` back to ``{"loss", "accuracy"}``."""
    return {"loss": metrics[f"{split}_loss"], "accuracy": metrics[f"{split}_accuracy"]}


def _seconds(value: object) -> float:
    return read_float({"seconds": value}, "seconds")


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
        self.clock = config.clock
        self.edge = EdgeClient(edge_url, token=admission_token)
        self.network = replace(network, edge_key=network.edge_key or self.edge.network().edge_key)
        self.datasets_dir = datasets_dir
        self.evaluate = Evaluator(learner)
        self._splits: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        self._state_path = storage.root / "validator-state.json"
        self.state = ValidatorState.load(self._state_path)
        self._windows: dict[str, tuple[HeadId, float]] = {}  # experiment -> (open window's base, opened at)

    @property
    def trust(self) -> TrustBook:
        return self.state.trust

    def close(self) -> None:
        self.edge.close()

    # -- data --------------------------------------------------------------------------------
    def _split(self, spec: ExperimentSpec, split: str) -> tuple[np.ndarray, np.ndarray]:
        cache = self._splits.setdefault(spec.dataset_id, {})
        if split not in cache:
            cache[split] = load_split(self.datasets_dir / spec.dataset_id, split)
        return cache[split]

    def _evaluate(self, spec: ExperimentSpec, params: Any, split: str) -> dict[str, float]:
        return self.evaluate(params, *self._split(spec, split))

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
            created_at_ms=self.clock.now_ms(),
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
        fresh = [c for c in self.edge.candidates(spec.key) if c.candidate_id not in self.state.judged]
        stale = [self._verdict(c, stale_base(c.base_head, head.head_id)) for c in fresh if c.base_head != head.head_id]
        window = [c for c in fresh if c.base_head == head.head_id]
        base, opened = self._windows.get(spec.key, (None, 0.0))
        if base != head.head_id:  # a new window of this experiment; its older one is closed
            opened = self.clock.monotonic_s()
            self._windows[spec.key] = (head.head_id, opened)
        if stale:
            self._record(stale)
        if len(window) < spec.min_candidates:
            return None
        now_ms = self.clock.now_ms()
        live = [lease for lease in self.edge.leases(spec.key, head.head_id) if lease.expires_at_ms > now_ms]
        delivered = {c.peer_id for c in window}
        everyone_in = all(lease.peer_id in delivered for lease in live)
        elapsed_s = self.clock.monotonic_s() - opened
        deadline_s = window_deadline_s(
            self.state.durations.get(spec.key, []), spec.window_timeout_s, self.config.deadline
        )
        if not everyone_in and elapsed_s < deadline_s:
            return None
        if everyone_in:
            self.state.add_duration(spec.key, elapsed_s, self.config.deadline.history)
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
            self.state.trust,
        )
        if decision.merged is not None:
            steps = sum(c.steps for c in window if c.candidate_id in decision.accepted)
            assert decision.merged_metrics is not None  # judge_window measures every merge it promotes
            merged, validation = decision.merged, decision.merged_metrics
        else:  # nothing to merge: the next attempt starts from the same parameters under a new head
            steps, merged, validation = 0, self._head_params(head), _unnamed("val", head.metrics)
        promoted, artifact = self._sign_head(
            spec, self.learner.from_tensors(merged), head, decision.accepted, steps, validation
        )
        write_atomic(self.storage.head_path(promoted.head_id), artifact)
        self.state.pending_head = promoted
        metrics = {cid: _named("val", m) for cid, m in decision.candidate_metrics.items()}
        verdicts = [
            self._verdict(c, decision.screens[c.candidate_id], promoted, metrics.get(c.candidate_id, {}))
            for c in window
        ]
        self.state.trust = decision.trust
        self._record(verdicts)
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
            judged=self.state.judged,
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
                screen = Screen(Reason.UNDECODABLE, str(exc))
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
        """The signed verdict; an accepting ``screen`` names the head ``promoted`` it was merged into."""
        accepted = screen.accepted and promoted is not None
        return Verdict(
            experiment=candidate.experiment,
            candidate_id=candidate.candidate_id,
            base_head=candidate.base_head,
            peer_id=candidate.peer_id,
            accepted=accepted,
            reason=screen.reason,
            detail=screen.detail[:200],
            validator_key=self.identity.public_key,
            decided_at_ms=self.clock.now_ms(),
            head_id=promoted.head_id if accepted and promoted is not None else None,
            metrics=metrics or {},
        ).signed(self.identity)

    def _record(self, verdicts: Sequence[Verdict]) -> None:
        """Record decisions (judged ids and the outbox) on disk, then publish them."""
        self.state.record(verdicts, self.config.max_judged)
        self.state.save(self._state_path)
        self._flush()

    def _flush(self) -> None:
        """Publish the recorded head, then the recorded verdicts, then save the state once.

        Safe to repeat after a crash: the edge keeps the first copy of a head or verdict."""
        if not self.state.outbox and self.state.pending_head is None:
            return
        head = self.state.pending_head
        if head is not None:
            artifact = self.storage.head_path(head.head_id).read_bytes()
            try:
                self.edge.publish_head(head.experiment, pack_envelope(head.to_wire(), artifact))
            except EdgeRequestError as exc:
                if exc.status != 409:
                    raise
                log.warning("recorded head %s was not promoted: %s", head.head_id[:19], exc)
            self.state.pending_head = None
        try:
            while self.state.outbox:
                self.edge.publish_verdict(self.state.outbox[0])
                self.state.outbox.pop(0)
        finally:
            self.state.save(self._state_path)

    def run(self, specs: Sequence[ExperimentSpec], stop: threading.Event) -> None:
        """Validate ``specs`` until ``stop`` is set."""
        backoff = Backoff()
        while not stop.is_set():
            try:
                for spec in specs:
                    self.poll(spec)
                backoff.reset()
            except (httpx.TransportError, EdgeRequestError) as exc:
                delay_s = backoff.next_delay_s()
                log.warning("edge unavailable (%s); retrying in %.1f s", exc, delay_s)
                stop.wait(delay_s)
            stop.wait(self.config.poll_s)
