"""Validators: the authority that decides what becomes the shared model.

For each experiment a validator creates the genesis head, then loops over windows. A window is
the set of candidates trained on the current head. It closes when every live lease of the window
has delivered a candidate, or when the deadline passes (``deadline_factor`` × the median of recent
window durations, clamped to [``min_deadline_s``, the experiment's ``window_timeout_s``]), then
with whatever it holds, none included, once anyone leased in it (``protocol.deadline.window_closes``).
A window nobody has leased in is idle: its deadline counts from its first lease, not from its head.

Every candidate is judged on what the validator measures itself, never on reported metrics:

1. base is the current head, or the one before it (a delayed update, moved onto the current head and
   merged at ``protocol.judging.staleness_weight``)
                                          → ``stale_base``
2. artifact id not seen before            → (judged once; a re-sent artifact is never judged again)
3. trainer signature                      → ``bad_signature``
4. lease exists, is the trainer's, is for this base, covers the claimed examples
                                          → ``wrong_lease`` / ``out_of_lease``
5. artifact downloads and decodes         → ``undecodable``
then, in ``protocol.judging.judge_window`` (pure, shared with the attack suite):
6. peer not quarantined                   → ``quarantined`` (``protocol.trust``)
7. one candidate per peer and lease window → ``replay``
8. names, shapes, dtype, finite values    → ``wrong_shape`` / ``non_finite``
9. once the head has learned, evidence that it trained on its lease (``protocol.evidence``, measured
   on this validator's copy of the training split) → ``no_lease_evidence``
10. update norm and direction vs. cohort  → ``norm_too_large`` / ``free_rider`` / ``outlier``
11. holdout loss vs. the base head        → ``regression``

Accepted candidates are merged with the preset's aggregator, weighted by examples capped per peer
kind (weighted mean:
``base + Σ nᵢ(θᵢ − base) / Σ nᵢ``, accumulated in float64, candidates ordered by content id). The
merged model is evaluated on the holdout split (carved from the training pool at preparation,
served to no trainer, see ``datasets.layout``); if its loss exceeds the current head's by more
than the preset's margin, the merge is blocked (``merge_blocked``). The next head is signed and
published either way: the merged parameters, or, when nothing was accepted, the same parameters
under a new head id (``merged`` empty), so trainers get fresh leases and an all-reject window never
stalls the experiment. A signed verdict with its typed reason (``protocol.reasons.Reason``) is
published for every candidate; an accepted one credits its examples only with evidence that it
trained on its lease (``WindowDecision.credited``).

Each experiment has its own open window and deadline (one validator may run several experiments).
A window that could close is first checked against run control (``protocol.run_control``): while the
orders the edge holds, each checked here for the network's quorum, leave the experiment paused or
stopped, no window closes and its deadline counts from the poll that finds it running again. A
``pardon`` releases its peer from quarantine before the window is judged; validators that read it one
window apart may disagree on that one window's head, which the quorum settles as any disagreement.

Quorum (``NetworkManifest.quorum`` = k of the listed validators): a head is canonical only once k
distinct validators vouch for it. Each validator judges independently and deterministically; the
one whose turn it is (a rendezvous order over the validator keys, seeded by the current head id)
proposes the next head with an ``Attestation`` listing the candidates it considered; every other
validator judges exactly those candidates itself and attests the proposal when it computes the same
head, byte for byte. The next validator in the order proposes its own head when the window has been
closed for one more deadline without a canonical head (a validator down, or a proposal it disputes).
A decision's verdicts and trust book take effect only when its head becomes canonical. With k = 1 a
proposed head is canonical at once, as with a single validator.

An edge that lost the lineage (it runs on a new, empty store) gets it back from validators before
anything else happens: each validator keeps the canonical heads it read, with their certificates and
artifacts (``native_peer.lineage_journal``), and publishes again, through the edge's usual checks
(proposer's signature, parent is the current head, attestations of exactly that head until the
quorum), every head the edge's current head lacks, in window order; then its open decisions. No new
genesis is made while the journal holds one. At each new window, and on a lease signed by another key
than the edge's known one (a new store makes a new key), the validator reads the network manifest
again and takes the new key if the edge serves the same network terms (``native_peer.network_chain``),
or the terms a revision signed by a quorum of the validators made (``protocol.network_revisions``): a
new experiment is validated from then on, and a validator whose key a revision removed stops.
Given several edges (``EdgeClient``: the next one when one is unreachable), a move to another edge
is followed the same way: the network read again, the candidates read from the new edge's first,
the heads it lacks published again, and this validator's open proposals too (the last one may have
reached only the edge that went away).

State (``ValidatorState``: judged ids, recent window durations, the trust book, an outbox of final
verdicts not yet published, decisions on open windows) is one typed, bounded object, written to disk
before anything it records is published; evaluation data is read through ``datasets.layout``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np

from datasets.layout import load_split, shard_path
from protocol.aggregation import Vector
from protocol.backoff import Backoff
from protocol.clock import SYSTEM_CLOCK, Clock
from protocol.codec import decode_tensors, encode_tensors
from protocol.credit import leased_examples
from protocol.deadline import (
    DeadlinePolicy,
    DeliveryRecord,
    WindowProgress,
    window_closes,
    window_deadline_s,
    window_grace_s,
)
from protocol.envelope import pack_envelope
from protocol.errors import InvalidMessage, ProtocolError, SignatureError
from protocol.evidence import lease_measurable
from protocol.fields import read_bool, read_float, read_int, read_list, read_object
from protocol.hashing import content_id
from protocol.ids import ContentId, ExperimentKey, HeadId, LeaseId
from protocol.judging import (
    REFERENCE_BATCH_FACTOR,
    Submission,
    WindowDecision,
    anchor_window,
    judge_window,
    precheck,
    reference_steps,
    stale_base,
    staleness,
)
from protocol.manifests import ExperimentSpec, NetworkManifest
from protocol.messages import MAX_WINDOW_CANDIDATES, Attestation, Candidate, Evaluation, HeadDescriptor, Lease, Verdict
from protocol.network_pins import NetworkSignature
from protocol.outer import decode_state, encode_state
from protocol.reasons import Reason
from protocol.records import RECORD_HEADS, peer_records, weigh_by_record
from protocol.run_control import RunState
from protocol.screening import PRESETS, Screen, ScreeningPolicy, screen_schema
from protocol.shards import decode_shard
from protocol.trust import TrustBook
from protocol.updates import decode_update

from .anchor import Anchor
from .edge_client import EdgeClient, EdgeRequestError
from .evidence import LeaseEvidence
from .identity import NodeIdentity
from .learner import Evaluator, JaxLearner, TrainEngine
from .lineage_journal import LineageJournal
from .network_chain import NetworkChain
from .storage import StorageConfig, write_atomic
from .workloads import WorkloadError, model_learner

__all__ = ["Decision", "Validator", "ValidatorConfig", "ValidatorState", "WindowReport", "share_principal_weight"]

log = logging.getLogger(__name__)

MERGED_PEERS_HELD = 256  # heads whose merged peers are kept here (``Validator._merged_peers``)


@dataclass(frozen=True)
class ValidatorConfig:
    """``idle_s``: the longest the validator waits for the edge's activity (a candidate, lease, head or
    quorum event wakes it at once, and an open window's deadline when it comes first)."""

    idle_s: float = 1.0
    deadline: DeadlinePolicy = field(default_factory=DeadlinePolicy)
    max_judged: int = 100_000  # candidate ids remembered for replay detection (oldest forgotten first)
    clock: Clock = SYSTEM_CLOCK


@dataclass
class Decision:
    """What this validator decided about one window, kept until the edge shows which head follows it.

    ``head`` is the head it computed: its own proposal (``propose``) or another validator's that it
    reached too and attests (``attestation``, published when the network's quorum is above one).
    Its ``verdicts`` and next ``trust`` book take effect only if ``head`` becomes canonical."""

    head: HeadDescriptor
    propose: bool
    attestation: Attestation | None
    trust: TrustBook
    verdicts: list[Verdict]
    published: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "head": self.head.to_wire(),
            "propose": self.propose,
            "attestation": None if self.attestation is None else self.attestation.to_wire(),
            "trust": self.trust.to_wire(),
            "verdicts": [v.to_wire() for v in self.verdicts],
            "published": self.published,
        }

    @classmethod
    def from_wire(cls, value: object) -> Decision:
        d = read_object(value, "decision")
        attestation = d.get("attestation")
        return cls(
            head=HeadDescriptor.from_wire(d.get("head")),
            propose=read_bool(d, "propose"),
            attestation=None if attestation is None else Attestation.from_wire(attestation),
            trust=TrustBook.from_wire(d.get("trust")),
            verdicts=read_list(d, "verdicts", Verdict.from_wire, max_len=1 << 16),
            published=read_bool(d, "published"),
        )


@dataclass
class ValidatorState:
    """What a validator must remember across restarts, bounded.

    ``judged``: candidate id → the reason it was decided with (insertion order = age), kept in an
    append-only journal beside the state file (``record`` appends, and rewrites it to the newest
    ``max_judged`` once it holds twice that); ``durations``: recent full-window durations per
    experiment; ``outbox``: final verdicts not yet published; ``decisions``: head id → this validator's
    decision on an open window (kept until the window's canonical head is known). ``save`` writes
    everything but the journal, which stays small: one write per decision, whatever the history."""

    judged: dict[str, Reason] = field(default_factory=dict)
    durations: dict[str, list[float]] = field(default_factory=dict)
    trust: TrustBook = field(default_factory=TrustBook)
    outbox: list[Verdict] = field(default_factory=list)
    decisions: dict[str, Decision] = field(default_factory=dict)
    control: dict[str, int] = field(default_factory=dict)  # experiment -> the last run-control order applied
    # experiment -> (the head whose window rolls back, the earlier canonical head whose parameters it takes)
    rollbacks: dict[str, tuple[str, str]] = field(default_factory=dict)
    journal: Path | None = None  # where ``judged`` is appended (``load`` sets it beside the state file)
    _journaled: int = 0  # lines in the journal

    def record(self, verdicts: Sequence[Verdict], max_judged: int) -> None:
        for verdict in verdicts:
            self.judged[verdict.candidate_id] = verdict.reason
        for stale in list(self.judged)[: max(0, len(self.judged) - max_judged)]:
            del self.judged[stale]
        self.outbox.extend(verdicts)
        if self.journal is None:
            return
        if self._journaled + len(verdicts) > 2 * max_judged:
            lines = "".join(f"{cid} {reason}\n" for cid, reason in self.judged.items())
            write_atomic(self.journal, lines.encode())
            self._journaled = len(self.judged)
        else:
            with open(self.journal, "a") as handle:
                handle.write("".join(f"{v.candidate_id} {v.reason}\n" for v in verdicts))
            self._journaled += len(verdicts)

    def add_duration(self, experiment: str, seconds: float, history: int) -> None:
        self.durations[experiment] = [*self.durations.get(experiment, []), seconds][-history:]

    def to_wire(self) -> dict[str, Any]:
        return {
            "durations": self.durations,
            "trust": self.trust.to_wire(),
            "outbox": [v.to_wire() for v in self.outbox],
            "decisions": {head_id: decision.to_wire() for head_id, decision in self.decisions.items()},
            "control": self.control,
            "rollbacks": {key: list(pair) for key, pair in self.rollbacks.items()},
        }

    @classmethod
    def from_wire(cls, value: object) -> ValidatorState:
        d = read_object(value, "validator state")
        durations = read_object(d.get("durations"), "durations")
        decisions = read_object(d.get("decisions", {}), "decisions")
        control = read_object(d.get("control", {}), "control")
        rollbacks = read_object(d.get("rollbacks", {}), "rollbacks")
        return cls(
            durations={key: read_list(durations, key, _seconds) for key in durations},
            trust=TrustBook.from_wire(d.get("trust")),
            outbox=read_list(d, "outbox", Verdict.from_wire, max_len=1 << 20),
            decisions={head_id: Decision.from_wire(decisions[head_id]) for head_id in decisions},
            control={key: read_int(control, key) for key in control},
            rollbacks={key: _head_pair(rollbacks, key) for key in rollbacks},
        )

    @classmethod
    def load(cls, path: Path) -> ValidatorState:
        state = cls.from_wire(json.loads(path.read_bytes())) if path.exists() else cls()
        state.journal = path.with_name(path.name + ".judged")
        if state.journal.exists():
            text = state.journal.read_text()
            lines = text.splitlines()[: text.count("\n")]  # a line cut short by a crash was never decided
            state.judged = {cid: Reason(reason) for cid, _, reason in (line.partition(" ") for line in lines)}
            state._journaled = len(lines)
        return state

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

    def __repr__(self) -> str:  # what an assertion shows: the verdicts and what was merged, not the head's bytes
        verdicts = ", ".join(f"{v.candidate_id[:19]}: {v.reason} ({v.detail})" for v in self.verdicts)
        return f"WindowReport({self.experiment} window {self.window}, merged {list(self.head.merged)}, verdicts [{verdicts}])"


def _named(split: str, result: dict[str, float]) -> dict[str, float]:
    """``{"loss", "accuracy", ...}`` as ``{"<split>_loss", "<split>_accuracy", ...}``."""
    return {f"{split}_{name}": value for name, value in result.items()}


def _unnamed(split: str, metrics: dict[str, float]) -> dict[str, float]:
    """The inverse of ``_named``: ``{"<split>_loss", ...}`` back to ``{"loss", ...}``."""
    return {name.removeprefix(f"{split}_"): value for name, value in metrics.items() if name.startswith(f"{split}_")}


def _lineage_step(head: HeadDescriptor) -> dict[str, float]:
    """``{"update_norm": …}``: the step size ``head`` records (``WindowDecision.update_norm``), if any."""
    return {"update_norm": head.metrics["update_norm"]} if "update_norm" in head.metrics else {}


def share_principal_weight(
    prechecked: Sequence[tuple[Submission, str | None]], policy: ScreeningPolicy
) -> list[Submission]:
    """The submissions, with the merge weight of all keys under one admission principal capped
    together at what one peer may weigh: more keys on one token never buy more influence."""
    caps = dict(policy.max_examples_by_kind)
    groups: dict[str, list[Submission]] = {}
    for submission, principal in prechecked:
        if principal is not None and submission.precheck.accepted:
            groups.setdefault(principal, []).append(submission)
    scaled: dict[str, float] = {}
    for members in groups.values():
        weights = [min(s.examples, caps.get(s.peer_kind, s.examples)) for s in members]
        limit = max(caps.get(s.peer_kind, w) for s, w in zip(members, weights, strict=True))
        if sum(weights) > limit:
            for s, w in zip(members, weights, strict=True):
                scaled[s.candidate_id] = w * limit / sum(weights)
    return [replace(s, examples=scaled[s.candidate_id]) if s.candidate_id in scaled else s for s, _ in prechecked]


def _head_pair(d: dict[str, Any], key: str) -> tuple[str, str]:
    pair = d[key]
    if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(h, str) for h in pair):
        raise InvalidMessage(f"rollback of {key} must be [base head, target head]")
    return pair[0], pair[1]


def _seconds(value: object) -> float:
    return read_float({"seconds": value}, "seconds")


class Validator:
    def __init__(
        self,
        learners: JaxLearner | Mapping[str, JaxLearner],
        network: NetworkManifest,
        storage: StorageConfig,
        edge_url: str | Sequence[str],
        datasets_dir: Path,
        config: ValidatorConfig = ValidatorConfig(),
        *,
        admission_token: str | None = None,
    ) -> None:
        # one learner per model (name -> learner): a validator judges every experiment of those models
        self.learners = {learners.model.name: learners} if isinstance(learners, JaxLearner) else dict(learners)
        self.identity = NodeIdentity.load_or_create(storage.identity_path)
        self.storage = storage
        self.config = config
        self.clock = config.clock
        self.edge = EdgeClient(edge_url, token=admission_token, reader=self.identity)
        # the manifest given, revised by the revisions kept here and those the edge serves since
        self._network = NetworkChain.load(network, storage.network_revisions_path)
        self._network.read(self.edge)
        if self.identity.public_key not in self.network.validator_key_set:
            raise ValueError("this node's key is not a validator key of the network manifest")
        self.datasets_dir = datasets_dir
        self._evaluators = {name: Evaluator(learner) for name, learner in self.learners.items()}
        self._splits: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        self._state_path = storage.root / "validator-state.json"
        self.state = ValidatorState.load(self._state_path)
        self._windows: dict[str, tuple[HeadId, float]] = {}  # experiment -> (open window's base, opened at)
        self._disputed: set[str] = set()  # proposals of others this validator computed differently
        # experiment -> its own update (``native_peer.anchor``): trained once an anchor head is current,
        # before the window's candidates arrive (``warm``)
        self._anchors: dict[str, Anchor] = {}
        self._current: dict[str, HeadDescriptor] = {}  # experiment -> its canonical head, as last read
        self._answered: dict[str, HeadDescriptor] = {}  # experiment -> the head a publish made canonical (``_publish``)
        self._seen_heads: dict[str, HeadDescriptor] = {}  # the last few canonical heads read, by id
        self._merged_by: dict[str, frozenset[str]] = {}  # head id -> the peers it merged (``_merged_peers``)
        # experiment -> when its open window may close without activity: the newcomers' grace and the
        # deadline (this validator's turn)
        self._due: dict[str, tuple[float, ...]] = {}
        # experiment -> when it is polled again and its back-off: its edge served what did not verify (``run``)
        self._held: dict[str, tuple[float, Backoff]] = {}
        # experiment -> (open window's head, seconds after it opened when only newcomers' leases were out)
        self._ready: dict[str, tuple[HeadId, float]] = {}
        self._evidence: dict[str, LeaseEvidence] = {}  # experiment -> its lease evidence
        self._delivered = DeliveryRecord()  # the peers whose leases a window waits for past the newcomers' grace
        # experiment -> (cursor into the edge's candidates, those read and not judged yet)
        self._followed: dict[str, tuple[int, dict[str, Candidate]]] = {}
        self._journals: dict[str, LineageJournal] = {}  # experiment -> the canonical lineage held here
        self._failovers = 0  # the edge client's moves to another edge, as last followed (``_edge_head``)
        # experiment -> the window of its last head queued for its test-split evaluation (``evaluate``), and
        # the heads queued: those this validator proposed that became canonical, not yet measured
        self._evaluated: dict[str, int] = {}
        self._to_evaluate: dict[str, list[HeadDescriptor]] = {}

    @property
    def network(self) -> NetworkManifest:
        """The network this validator serves now (``native_peer.network_chain``)."""
        return self._network.network

    @property
    def retired(self) -> str | None:
        """Why this validator validates no more (a revision of the network replaced its key), or ``None``."""
        if self.identity.public_key in self.network.validator_key_set:
            return None
        return f"network revision {self.network.revision} has no validator key of this node's; it stops validating"

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
        return self._evaluators[spec.model.name](params, *self._split(spec, split))

    def learner(self, spec: ExperimentSpec) -> JaxLearner:
        """The learner of ``spec``'s model (a ``KeyError`` naming it when this validator has none)."""
        learner = self.learners.get(spec.model.name)
        if learner is None or learner.model != spec.model:
            raise KeyError(
                f"no learner for model {spec.model.name} of {spec.key} as the network declares it; this validator "
                f"has {sorted(self.learners)}"
            )
        return learner

    # -- heads -----------------------------------------------------------------------------
    def _sign_head(
        self,
        spec: ExperimentSpec,
        params: Any,
        parent: HeadDescriptor | None,
        merged: Sequence[str],
        steps: int,
        validation: dict[str, float],
        outer_state: ContentId | None = None,
        update_norm: float | None = None,
    ) -> tuple[HeadDescriptor, bytes]:
        """The signed head for ``params``; ``validation`` is their already measured validation result,
        ``outer_state`` the id of the outer optimizer's state after it (stored by the caller),
        ``update_norm`` the lineage's step size after it (``WindowDecision.update_norm``). It holds only
        what decides the lineage: its test-split metrics follow once it is published (``evaluate``)."""
        window = 0 if parent is None else parent.window + 1
        artifact = encode_tensors(
            self.learner(spec).to_tensors(params),
            {"model": spec.model.name, "experiment": spec.key, "window": str(window)},
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
            metrics=_named("val", validation) | ({} if update_norm is None else {"update_norm": update_norm}),
            outer_state=outer_state,
        ).signed(self.identity)
        return head, artifact

    def sign_network(self) -> bool:
        """Give the edge this validator's signature over the network's terms (``protocol.network_pins``:
        what joining peers pin); whether the edge took it. An edge serving other terms refuses it (logged)."""
        try:
            self.edge.sign_network(NetworkSignature.of(self.network, self.identity))
        except EdgeRequestError as exc:
            log.warning("the edge refused this validator's signature of network %s: %s", self.network.network_id, exc)
            return False
        return True

    def ensure_genesis(self, spec: ExperimentSpec) -> HeadDescriptor:
        """The experiment's current head; without one, the genesis head this validator computes (from
        a seed derived from the experiment's key, so every validator computes the same bytes), proposed
        or attested. With a quorum above one it is canonical once enough validators have done so. An
        edge without a head (a new network, or an edge that lost its store) is given this validator's
        signature of the network's terms first."""
        head = self._edge_head(spec, None)
        if head is not None:
            self._network.verify_head(head)
            return head
        self.sign_network()
        seed = int.from_bytes(hashlib.sha256(spec.key.encode()).digest()[:4], "big")
        params = self.learner(spec).init(jax.random.PRNGKey(seed))
        genesis, artifact = self._sign_head(spec, params, None, (), 0, self._evaluate(spec, params, "holdout"))
        write_atomic(self.storage.head_path(genesis.head_id), artifact)
        proposed = {p.head_id: p for p in self._proposals(spec, None)}
        if genesis.head_id in proposed and self.identity.public_key in proposed[genesis.head_id].signers(
            self.network.validator_key_set
        ):
            return proposed[genesis.head_id]
        self._decide_on(spec, proposed.get(genesis.head_id, genesis), (), self.state.trust, [])
        log.info("%s: genesis head %s (val acc %.4f)", spec.key, genesis.head_id[:19], genesis.metrics["val_accuracy"])
        return self.edge.current_head(spec.key) or genesis

    def _journal(self, key: str) -> LineageJournal:
        if key not in self._journals:
            self._journals[key] = LineageJournal(
                self.storage.experiment_dir(ExperimentKey.parse(key)) / "lineage.jsonl"
            )
        return self._journals[key]

    def _edge_head(self, spec: ExperimentSpec, listed: HeadId | None) -> HeadDescriptor | None:
        """The edge's current head of ``spec``, once the edge holds every head of the lineage held here
        (``_restore``): the one taken here already (``_take``) when the edge's candidate listing named it
        (``listed``) and the same edge answers, else read from the edge (unverified)."""
        known = self._current.get(spec.key)
        if known is not None and listed == known.head_id and self.edge.failovers == self._failovers:
            return known
        head = self.edge.current_head(spec.key)
        if self.edge.failovers != self._failovers:  # another edge of the list answers now
            self._failovers = self.edge.failovers
            self._follow_network()
            # a head proposed to the last edge may not have reached this one, of any experiment: the move
            # is seen once, by whichever experiment's poll comes first
            self._republish(None)
        lost = self._journal(spec.key).after(None if head is None else head.head_id)
        if lost:
            self._restore(spec, lost)
            head = self.edge.current_head(spec.key)
        return head

    def _restore(self, spec: ExperimentSpec, lost: Sequence[HeadDescriptor]) -> None:
        """Publish again this validator's signature of the network's terms, the heads ``lost`` that the
        edge lacks (oldest first, each with the attestations of its certificate), then this validator's
        open decisions; the edge's candidates are read from its first on (a new store counts them from 1
        again). A 409 means another validator is giving the same heads back: the next poll goes on from
        wherever the edge's head is then."""
        log.warning(
            "%s: the edge lacks %d heads of the lineage held here (windows %d to %d); publishing them again",
            spec.key,
            len(lost),
            lost[0].window,
            lost[-1].window,
        )
        self.sign_network()  # an edge that lost the lineage lost the validators' signatures of the network too
        try:
            for head in lost:
                if head.outer_state is not None:
                    state = self.storage.head_path(head.outer_state).read_bytes()
                    self.edge.publish_outer_state(spec.key, pack_envelope(head.to_wire(), state))
                artifact = self.storage.head_path(head.head_id).read_bytes()
                self.edge.publish_head(spec.key, pack_envelope(replace(head, certificate=()).to_wire(), artifact))
                for attestation in head.certificate:
                    self.edge.publish_attestation(attestation)
        except EdgeRequestError as exc:
            if exc.status != 409:
                raise
            log.warning("%s: the edge took another head meanwhile: %s", spec.key, exc)
        self._followed.pop(spec.key, None)
        self._follow_network()
        self._republish(spec.key)

    def _republish(self, key: str | None) -> None:
        """Publish this validator's open decisions of experiment ``key`` (``None``: of every experiment)
        again (proposals, attestations), to an edge that may lack them: a replaced edge, or another edge
        of the list after a failover (its last proposal, certified by the edge that went away before this
        one mirrored it, or refused there for an outer state uploaded only to the edge that went away, is
        otherwise waited for forever)."""
        for decision in self.state.decisions.values():
            if key is None or decision.head.experiment == key:
                decision.published = False
        self._flush()

    def _keep_lineage(self, current: HeadDescriptor) -> None:
        """Add canonical ``current`` to the lineage held here, with the heads between it and the last one
        held (read from the edge and verified), their artifacts and outer states kept on disk."""

        def parent_of(head_id: HeadId) -> HeadDescriptor | None:
            return self._head(self.network.experiment(current.experiment), head_id)

        for head in self._journal(current.experiment).extend(current, parent_of):
            for cid in (head.head_id, head.outer_state):
                if cid is not None and not self.storage.head_path(cid).exists():
                    self.edge.artifact(cid, self.storage.head_path(cid))

    def _head_params(self, head: HeadDescriptor) -> dict[str, np.ndarray]:
        data = self.edge.artifact(head.head_id, self.storage.head_path(head.head_id))
        tensors, _ = decode_tensors(data)
        return tensors

    # -- one polling round -----------------------------------------------------------------
    def poll(self, spec: ExperimentSpec) -> WindowReport | None:
        """Judge what is ready; close the window and propose its head when its time has come (with a
        quorum above one: attest the proposals of other validators that reach the same head)."""
        self._flush()
        head = self._edge_head(spec, self._follow_candidates(spec))
        if head is None:  # no head yet, so no candidate either: propose or attest the genesis head
            self.ensure_genesis(spec)
            return None
        if head is not self._current.get(spec.key):
            self._take(head)  # settled: its candidates are judged now
        if spec.key not in self._followed:  # another edge, or a lineage given back: its candidates from its first
            self._follow_candidates(spec)
        fresh = self._unjudged(spec)
        arrived = [c for c in fresh if staleness(c.base_head, head) is not None]  # late ones of its parent too
        ids = {c.candidate_id for c in arrived}
        stale = [self._verdict(c, stale_base(c.base_head, head.head_id)) for c in fresh if c.candidate_id not in ids]
        window = arrived[:MAX_WINDOW_CANDIDATES]  # what one head can name; the rest are judged in the next
        base, opened = self._windows.get(spec.key, (None, 0.0))
        if base != head.head_id:  # a new window of this experiment; its older one is closed
            opened = self.clock.monotonic_s()
            self._windows[spec.key] = (head.head_id, opened)
        if stale:
            self._record(stale)
        if self.network.quorum > 1:
            self._attest_proposals(spec, head, window)
        elapsed_s = self.clock.monotonic_s() - opened
        recent_s = self.state.durations.get(spec.key, [])
        deadline_s = window_deadline_s(recent_s, spec.window_timeout_s, self.config.deadline)
        ready = self._ready.get(spec.key)
        if ready is not None and ready[0] != head.head_id:
            ready = None  # of an earlier window
        turn = self._turn(head)  # later proposers step in only when earlier ones did not

        def newcomers_grace_s() -> float:  # and when the window may close without activity
            first_s = None if ready is None else ready[1]  # no history yet: the window's own pace (its first)
            grace_s = window_grace_s(recent_s, spec.window_timeout_s, self.config.deadline, first_s)
            due = (opened + grace_s + deadline_s * turn, opened + deadline_s * (turn + 1))
            self._due[spec.key] = tuple(t for t in due if t > opened + elapsed_s)  # what is still to come
            return grace_s

        grace_s = newcomers_grace_s()
        if any(d.head.parent == head.head_id for d in self.state.decisions.values()):
            return None  # this validator already proposed or attested a head for this window
        if len(window) < spec.min_candidates and elapsed_s < deadline_s + turn * deadline_s:
            return None  # nothing can close it yet: spare the edge the lease query
        if self._follow_control(spec):  # paused or stopped by run control: no window closes, no head follows;
            self._windows[spec.key] = (head.head_id, self.clock.monotonic_s())  # its deadline counts from resume
            return None
        now_ms = self.clock.now_ms()
        leases = self.edge.window_leases(spec.key, head)
        if not leases and not window:  # an idle window: its deadline counts from its first lease
            self._windows[spec.key] = (head.head_id, self.clock.monotonic_s())
            return None
        delivered = {c.lease_id for c in arrived}
        out = [lease for lease in leases if lease.expires_at_ms > now_ms and lease.lease_id not in delivered]
        unproven = sum(1 for lease in out if lease.peer_id not in self._delivered)
        progress = WindowProgress(len(window), len(leases), len(out) - unproven, elapsed_s, unproven)
        if ready is None and progress.outstanding == 0 and len(window) >= spec.min_candidates:  # only newcomers are out
            self._ready[spec.key] = ready = (head.head_id, elapsed_s)
            grace_s = newcomers_grace_s()
        if not window_closes(
            progress, min_candidates=spec.min_candidates, deadline_s=deadline_s, grace_s=grace_s, turn=turn
        ):
            return None
        if window and turn == 0 and ready is not None:
            # how long the peers with a record took, newcomers' grace aside (a close at the deadline
            # too): the history the deadline and the grace follow keeps the honest pace while squatters
            # hold leases in every window
            self.state.add_duration(spec.key, ready[1], self.config.deadline.history)
        for lease in out:
            self._delivered.missed(lease.peer_id)
        if self._rollback_to(spec, head) is not None:
            window = []  # its candidates are judged on the head it makes (stale there)
        return self._close_window(spec, head, window, leases)

    def _follow_control(self, spec: ExperimentSpec) -> bool:
        """Apply the run-control orders the edge holds for ``spec``'s experiment, each checked here for
        the network's quorum (``RunState.of``: an edge cannot forge one): a ``pardon`` not applied
        before releases its peer from quarantine, in the trust book and in every open decision's. True
        while the orders leave the experiment paused or stopped. ``SignatureError`` for orders that do
        not check (the run loop then waits for an edge that serves what the validators signed)."""
        try:
            orders = self.edge.run_orders(spec.key)
            state = RunState.of(orders, self._network.history(), spec.key)
        except InvalidMessage as exc:  # malformed, out of sequence, another experiment's: not what validators signed
            raise SignatureError(f"the edge serves run-control orders that do not check: {exc}") from None
        done = self.state.control.get(spec.key, 0)
        if state.sequence > done:
            for signed in orders:
                order = signed.order
                if order.sequence > done and order.action == "pardon" and order.target:
                    self._pardon(order.target)
                current = self._current.get(spec.key)
                if order.sequence > done and order.action == "rollback" and order.target and current is not None:
                    self.state.rollbacks[spec.key] = (current.head_id, order.target)
            self.state.control[spec.key] = state.sequence
            self.state.save(self._state_path)
        return state.halted is not None

    def _rollback_to(self, spec: ExperimentSpec, head: HeadDescriptor) -> HeadDescriptor | None:
        """The earlier canonical head whose parameters the window on ``head`` takes, when a rollback
        order read on ``head`` names one of its ancestors; ``None`` otherwise (a rollback to a head
        outside the lineage is ignored, as every validator ignores it)."""
        base, target = self.state.rollbacks.get(spec.key, (None, None))
        if base != head.head_id or target is None:
            return None
        at: HeadDescriptor | None = head
        while at is not None and at.head_id != target:
            at = None if at.parent is None else self.edge.head(spec.key, at.parent)
        if at is None:
            log.warning("%s: rollback to %s ignored: not a head of the lineage of %s", spec.key, target, head.head_id)
            return None
        self._network.verify_head(at)
        return at

    def _pardon(self, peer_id: str) -> None:
        log.info("run control: peer %s pardoned (out of quarantine, strikes cleared)", peer_id)
        self.state.trust = self.state.trust.pardoned(peer_id)
        for head_id, decision in self.state.decisions.items():
            self.state.decisions[head_id] = replace(decision, trust=decision.trust.pardoned(peer_id))

    def _follow_candidates(self, spec: ExperimentSpec) -> HeadId | None:
        """Read the experiment's candidates that arrived since the last read (the edge is followed with a
        cursor: history once, at start-up) into those waiting to be judged; the edge's current head id
        as it listed them."""
        since, waiting = self._followed.get(spec.key, (0, {}))
        arrived, since, listed = self.edge.candidates_since(spec.key, since)
        waiting.update({c.candidate_id: c for c in arrived})
        self._followed[spec.key] = (since, waiting)
        return listed

    def _unjudged(self, spec: ExperimentSpec) -> list[Candidate]:
        """The candidates read (``_follow_candidates``) and not judged yet, in arrival order."""
        waiting = self._followed[spec.key][1]
        for judged in [cid for cid in waiting if cid in self.state.judged]:
            del waiting[judged]
        return list(waiting.values())

    def _records(self, spec: ExperimentSpec, head: HeadDescriptor) -> dict[str, int]:
        """Each peer's record at the window on ``head`` (``protocol.records``): the peers the last
        ``RECORD_HEADS`` canonical heads (``head`` and those before it) merged candidates of."""
        heads = [head]
        while len(heads) < RECORD_HEADS and heads[-1].parent is not None:
            parent = self._head(spec, heads[-1].parent)
            if parent is None:  # the edge no longer holds it: the record counts the heads it has
                break
            heads.append(parent)
        return peer_records(self._merged_peers(spec, h) for h in heads)

    def _merged_peers(self, spec: ExperimentSpec, head: HeadDescriptor) -> frozenset[str]:
        """The peers of the candidates ``head`` merged, from their signed descriptors (read from the
        edge once per head: the candidates on its parent, then on the head before that for one merged
        a window late)."""
        if not head.merged or head.parent is None:
            return frozenset()
        held = self._merged_by.get(head.head_id)
        if held is None:
            wanted, peers, base = set(head.merged), set(), head.parent
            for _ in range(2):
                for candidate in self.edge.candidates(spec.key, base_head=base):
                    if candidate.candidate_id in wanted:
                        candidate.verify_own()
                        wanted.discard(candidate.candidate_id)
                        peers.add(candidate.peer_id)
                parent = self._head(spec, base) if wanted else None
                if parent is None or parent.parent is None:
                    break
                base = parent.parent
            if len(self._merged_by) >= MERGED_PEERS_HELD:
                self._merged_by.clear()
            held = self._merged_by[head.head_id] = frozenset(peers)
        return held

    def _turn(self, head: HeadDescriptor) -> int:
        """This validator's place in the order in which validators propose the window after ``head``
        (0: first). The order is a rendezvous hash of the head id, so it rotates from window to window."""
        if self.network.quorum == 1:
            return 0
        order = sorted(
            self.network.validator_keys, key=lambda key: hashlib.sha256(head.head_id.encode() + key).digest()
        )
        return order.index(self.identity.public_key)

    def _judge(
        self, spec: ExperimentSpec, head: HeadDescriptor, window: Sequence[Candidate], leases: Sequence[Lease] = ()
    ) -> tuple[HeadDescriptor, bytes, WindowDecision]:
        """Judge ``window`` on top of ``head``: the signed next head, its artifact, the decision.
        ``leases``: the window's leases as the edge listed them (a candidate's lease not among them is
        read from the edge)."""
        known = {lease.lease_id: lease for lease in leases}
        policy = PRESETS[spec.screening]
        val_x, val_y = self._split(spec, "holdout")
        base = self._head_params(head)
        learner = self.learner(spec)
        window_steps = reference_steps(spec, self.edge.fetch_manifest(spec.dataset_id))  # candidates' steps in these
        # robust rules break ties, and lease evidence draws its examples, by a salt no submitter knows
        # before the window's set is closed
        salt = hashlib.sha256("\n".join(sorted(c.candidate_id for c in window)).encode()).digest()
        decision = judge_window(
            learner.model,
            base,
            _unnamed("val", head.metrics) | _lineage_step(head),
            weigh_by_record(
                share_principal_weight(
                    [self._precheck(spec, head, base, window_steps, c, salt, known) for c in window], policy
                ),
                self._records(spec, head),
                dict(policy.max_examples_by_kind),
            ),
            policy,
            lambda params: self._evaluators[spec.model.name](learner.from_tensors(params), val_x, val_y),
            self.state.trust,
            reference=self._reference(spec, head, base) if policy.anchored else None,
            salt=salt,
            outer=spec.outer,
            momentum=self._outer_state(head),
            grid=spec.head_grid,
        )
        if decision.merged is not None:
            steps = sum(c.steps for c in window if c.candidate_id in decision.accepted)
            assert decision.merged_metrics is not None  # judge_window measures every merge it promotes
            merged, validation = decision.merged, decision.merged_metrics
        else:  # nothing to merge: the next attempt starts from the same parameters under a new head
            steps, merged, validation = 0, base, _unnamed("val", head.metrics)
        outer_state = None
        if decision.outer_state is not None:
            state = encode_state(learner.model, decision.outer_state)
            outer_state = ContentId(content_id(state))
            write_atomic(self.storage.head_path(outer_state), state)
        if (target := self._rollback_to(spec, head)) is not None:  # run control: that head's parameters
            if target.outer_state is not None:  # kept here, as the head's own would be, to publish with it
                self.edge.artifact(target.outer_state, self.storage.head_path(target.outer_state))
            merged, validation, outer_state = (
                self._head_params(target),
                _unnamed("val", target.metrics),
                target.outer_state,
            )
            return (
                *self._sign_head(spec, learner.from_tensors(merged), head, (), 0, validation, outer_state),
                decision,
            )
        promoted, artifact = self._sign_head(
            spec,
            learner.from_tensors(merged),
            head,
            decision.accepted,
            steps,
            validation,
            outer_state,
            decision.update_norm,
        )
        return promoted, artifact, decision

    def _outer_state(self, head: HeadDescriptor) -> Vector | None:
        """The outer optimizer state ``head`` names (``protocol.outer``): kept next to the head here,
        else read from the edge (a restarted or new validator) and verified by content id."""
        if head.outer_state is None:
            return None
        data = self.edge.artifact(head.outer_state, self.storage.head_path(head.outer_state))
        return decode_state(self.learner(self.network.experiment(head.experiment)).model, data)

    def _reference(
        self, spec: ExperimentSpec, head: HeadDescriptor, base: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """θ_ref for the window on ``head`` (parameters ``base``): ``base`` + this validator's own update
        from the head of its anchor window (``protocol.judging.anchor_window``), trained on its
        ``reference`` split (data no trainer gets) by ``native_peer.anchor.Anchor``: the trust anchor
        that screens and bounds the window's candidates and never enters a head."""
        at = self._anchor_head(spec, head)
        return self._anchor(spec).reference(
            base, at.head_id, lambda: self._head_params(at), spec.learning_rate_at(at.window)
        )

    def _anchor(self, spec: ExperimentSpec) -> Anchor:
        if spec.key not in self._anchors:
            x, y = self._split(spec, "reference")
            learner = self.learner(spec)
            steps = reference_steps(spec, self.edge.fetch_manifest(spec.dataset_id))
            engine = TrainEngine(learner, learner.make_optimizer(spec))
            self._anchors[spec.key] = Anchor(engine, x, y, steps, REFERENCE_BATCH_FACTOR * spec.batch_size)
        return self._anchors[spec.key]

    def _anchor_head(self, spec: ExperimentSpec, head: HeadDescriptor) -> HeadDescriptor:
        """The head of ``head``'s anchor window in its lineage (parents read from the edge when not seen,
        each verified). A lineage the edge no longer holds back to it anchors at ``head`` itself."""
        target = anchor_window(head.window, spec.anchor_every)
        at = head
        while at.window > target and at.parent is not None:
            parent = self._head(spec, at.parent)
            if parent is None:
                log.warning(
                    "%s: anchor head of window %d unknown at the edge; anchoring at %s",
                    spec.key,
                    target,
                    head.head_id[:19],
                )
                return head
            at = parent
        return at

    def warm(self, spec: ExperimentSpec) -> None:
        """Work that depends only on the current head, done before its window's candidates arrive: the
        peers' records (``_records``: read once per head) and the anchor update of an anchored
        experiment when the head is (or anchors at) a new anchor."""
        head = self._current.get(spec.key)
        if head is not None:
            self._records(spec, head)
        if head is None or not PRESETS[spec.screening].anchored:
            return
        at = self._anchor_head(spec, head)
        self._anchor(spec).prepare(at.head_id, lambda: self._head_params(at), spec.learning_rate_at(at.window))

    def evaluate(self, spec: ExperimentSpec) -> list[Evaluation]:
        """Measure on the test split each head of ``spec`` this validator proposed that became canonical
        since the last call, and publish what it measured (``protocol.messages.Evaluation``): work that
        decides nothing, so it follows the head's publication instead of delaying it. Returns the
        evaluations published; one the edge refuses (its head not in the edge's lineage) is dropped."""
        published, pending = [], self._to_evaluate.get(spec.key, [])
        while pending:  # each head leaves the queue once the edge answered (an unavailable edge: next round)
            head = pending[0]
            params = self.learner(spec).from_tensors(self._head_params(head))
            evaluation = Evaluation.of(
                head, "test", self._evaluate(spec, params, "test"), self.identity, self.clock.now_ms()
            )
            try:
                self.edge.publish_evaluation(evaluation)
            except EdgeRequestError as exc:
                if exc.status != 404:
                    raise
                log.warning("evaluation of head %s not taken: %s", head.head_id[:19], exc)
            else:
                published.append(evaluation)
                log.info(
                    "%s: head %s of window %d: test acc %.4f",
                    spec.key,
                    head.head_id[:19],
                    head.window,
                    evaluation.metrics.get("test_accuracy", float("nan")),
                )
            pending.pop(0)
        return published

    def _close_window(
        self, spec: ExperimentSpec, head: HeadDescriptor, window: list[Candidate], leases: Sequence[Lease]
    ) -> WindowReport:
        promoted, artifact, decision = self._judge(spec, head, window, leases)
        write_atomic(self.storage.head_path(promoted.head_id), artifact)
        verdicts = self._verdicts(window, decision, promoted)
        self._decide_on(spec, promoted, [c.candidate_id for c in window], decision.trust, verdicts)
        log.info(
            "%s: window %d closed, %d/%d accepted, head %s val acc %.4f",
            spec.key,
            promoted.window,
            len(decision.accepted),
            len(window),
            promoted.head_id[:19],
            promoted.metrics["val_accuracy"],
        )
        return WindowReport(spec.key, head.window, promoted, tuple(verdicts))

    def _verdicts(self, window: Sequence[Candidate], decision: WindowDecision, head: HeadDescriptor) -> list[Verdict]:
        metrics = {cid: _named("val", m) for cid, m in decision.candidate_metrics.items()}
        for cid, cosine in decision.reference_cosines.items():  # how far the anchor trusted it
            metrics.setdefault(cid, {})["reference_cosine"] = cosine
        for cid, z in decision.lease_evidence.items():  # the evidence it trained on its lease
            if np.isfinite(z):
                metrics.setdefault(cid, {})["lease_evidence_z"] = z
        return [
            self._verdict(
                c,
                decision.screens[c.candidate_id],
                head,
                metrics.get(c.candidate_id, {}),
                credited=c.candidate_id in decision.credited,
            )
            for c in window
        ]

    def _proposals(self, spec: ExperimentSpec, parent: HeadDescriptor | None) -> list[HeadDescriptor]:
        """The heads proposed on ``parent`` (``None``: genesis heads) by validators of the network: one
        whose proposer the network does not list (a revision retired it while its proposal waited, or an
        edge that serves what no validator of ours proposed) can never be certified, and is passed over."""
        keys = self.network.validator_key_set
        listed = self.edge.proposals(spec.key, None if parent is None else parent.head_id)
        return [proposal for proposal in listed if proposal.validator_key in keys]

    def _attest_proposals(self, spec: ExperimentSpec, head: HeadDescriptor, window: Sequence[Candidate]) -> None:
        """Judge each head other validators proposed after ``head`` from the candidates its proposer
        considered; attest it when this validator computes exactly the same head."""
        keys = self.network.validator_key_set
        for proposal in self._proposals(spec, head):
            if proposal.head_id in self.state.decisions or proposal.head_id in self._disputed:
                continue
            if self.identity.public_key in proposal.signers(keys):
                continue
            considered = next(
                (a.considered for a in proposal.certificate if a.validator_key == proposal.validator_key), None
            )
            candidates = [c for c in window if considered is not None and c.candidate_id in considered]
            if considered is None or len(candidates) != len(considered):
                continue  # not all of what its proposer judged is visible here (yet)
            if self._follow_control(spec):
                return  # paused or stopped: no head follows, whoever proposed it
            mine, artifact, decision = self._judge(spec, head, candidates)
            if (mine.head_id, mine.outer_state) != (proposal.head_id, proposal.outer_state):
                self._disputed.add(proposal.head_id)
                log.warning(
                    "%s: proposal %s of window %d disagrees with this validator's %s",
                    spec.key,
                    proposal.head_id[:19],
                    proposal.window,
                    mine.head_id[:19],
                )
                continue
            write_atomic(self.storage.head_path(mine.head_id), artifact)
            verdicts = self._verdicts(candidates, decision, proposal)
            self._decide_on(spec, proposal, considered, decision.trust, verdicts)

    def _decide_on(
        self,
        spec: ExperimentSpec,
        head: HeadDescriptor,
        considered: Sequence[str],
        trust: TrustBook,
        verdicts: list[Verdict],
    ) -> None:
        """Record this validator's decision for ``head`` (its own when it signed it, else one it
        attests), publish it, and settle the window if the head is canonical already."""
        mine = head.validator_key == self.identity.public_key
        attestation = None
        if self.network.quorum > 1:
            attestation = Attestation.of(head, considered, self.identity, self.clock.now_ms())
        self.state.decisions[head.head_id] = Decision(replace(head, certificate=()), mine, attestation, trust, verdicts)
        self.state.save(self._state_path)
        self._answered.pop(spec.key, None)
        self._flush()
        answered = self._answered.pop(spec.key, None)  # ``head`` itself, when publishing it made it canonical
        current = answered if answered is not None and answered.head_id == head.head_id else None
        current = current or self.edge.current_head(spec.key)
        if current is not None:
            self._take(current)

    def _take(self, current: HeadDescriptor) -> None:
        """Take ``current``, the edge's current head of its experiment: verified for the network's
        quorum, remembered, settled (``_settle``), then held as the current head, which later polls
        use without reading it again while the edge lists it (``_edge_head``)."""
        self._network.verify_head(current)
        self._remember(current)
        self._settle(current)
        self._current[current.experiment] = current

    def _settle(self, current: HeadDescriptor) -> None:
        """Once ``current`` is canonical: the decision that computed it takes effect (its verdicts are
        published, its trust book kept, its candidates' downloaded artifacts deleted: a decided
        candidate is never judged again); decisions about windows now closed are dropped."""
        if current.validator_key == self.identity.public_key and current.window > self._evaluated.get(
            current.experiment, -1
        ):  # canonical now: its test-split evaluation follows (``evaluate``)
            self._evaluated[current.experiment] = current.window
            self._to_evaluate.setdefault(current.experiment, []).append(current)
        rollback = self.state.rollbacks.get(current.experiment)
        if rollback is not None and rollback[0] != current.head_id:  # its window is closed
            del self.state.rollbacks[current.experiment]
        self._keep_lineage(current)
        settled = False
        for head_id, decision in list(self.state.decisions.items()):
            if decision.head.experiment != current.experiment:
                continue
            if head_id == current.head_id:
                self.state.trust = decision.trust
                self.state.record(decision.verdicts, self.config.max_judged)
                for verdict in decision.verdicts:
                    self._delivered.judged(verdict.peer_id, verdict.accepted)
                    self._candidate_path(verdict.candidate_id).unlink(missing_ok=True)
            if head_id == current.head_id or decision.head.parent != current.head_id:
                del self.state.decisions[head_id]
                settled = True
        if settled:
            self.state.save(self._state_path)
            self._flush()

    def _precheck(
        self,
        spec: ExperimentSpec,
        head: HeadDescriptor,
        base: dict[str, np.ndarray],
        window_steps: int,
        candidate: Candidate,
        salt: bytes,
        known: Mapping[LeaseId, Lease],
    ) -> tuple[Submission, str | None]:
        """Fetch what ``protocol.judging.precheck`` needs (lease, manifest, the candidate's base head),
        then the artifact, decoded with the experiment's update codec against its base head's
        parameters; a delayed update (on the head before ``head``) is moved onto ``base`` (the
        head's parameters): θ = base + (θ_c − its base). The candidate's declared steps count in
        units of ``window_steps`` (``protocol.judging.reference_steps``). Its lease evidence is
        measured when the preset asks for it and the lease holds at most half the training pool
        (``protocol.evidence.lease_measurable``; ``_lease_evidence``, drawn with the window's ``salt``).
        With the submission, the principal its lease names (its admission token's id). Its lease is
        taken from ``known`` when there (the window's, listed by the edge), else read from the edge."""
        lease = known.get(candidate.lease_id) or self.edge.lease(candidate.lease_id)
        if lease is not None:
            self._signed_by_edge(lease)
        leased = 0
        manifest = self.edge.fetch_manifest(spec.dataset_id)
        if lease is not None:
            leased = leased_examples(lease, manifest, spec.local_epochs)
        behind = staleness(candidate.base_head, head)
        own_base = head if behind == 0 else self._head(spec, candidate.base_head) if behind == 1 else None
        screen = precheck(
            candidate,
            current=head,
            base=own_base,
            judged=self.state.judged,
            lease=lease,
            leased_examples=leased,
            edge_key=self.network.edge_key,
        )
        tensors = evidence = None
        measured: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None = None  # (its base's, trained)
        if screen.accepted and own_base is not None:
            path = self._candidate_path(candidate.candidate_id)
            model = self.learner(spec).model
            try:
                encoded, _ = decode_tensors(self.edge.artifact(candidate.candidate_id, path))
                if behind == 0:
                    tensors = decode_update(model, base, encoded, spec.codec)
                    measured = (base, tensors)
                else:
                    then = self._head_params(own_base)
                    trained = decode_update(model, then, encoded, spec.codec)
                    tensors = {
                        k: (base[k] + (trained[k].astype(np.float64) - then[k])).astype(np.float32) for k in base
                    }
                    measured = (then, trained)  # judged on the head it was trained on, not the moved one
            except (ProtocolError, EdgeRequestError) as exc:
                screen = Screen(Reason.UNDECODABLE, str(exc))
            asks = PRESETS[spec.screening].asks_lease_evidence
            measurable = lease_measurable(leased // spec.local_epochs, sum(s.examples for s in manifest.shards))
            if (
                asks
                and measured is not None
                and lease is not None
                and measurable
                and screen_schema(model, measured[1]).accepted
            ):
                evidence = self._lease_evidence(spec, salt, lease, own_base.head_id, measured)  # else: schema rejects
        submission = Submission(
            candidate.candidate_id,
            candidate.peer_id,
            candidate.peer_kind,
            float(candidate.examples),
            tensors,
            screen,
            candidate.steps / window_steps,
            lease_window=-1 if lease is None else lease.window,
            windows_behind=behind or 0,
            lease_evidence_z=evidence,
        )
        return submission, None if lease is None else lease.principal

    def _follow_network(self) -> None:
        """Take the network as the edge serves it now when its key or revision moved and it follows from
        the terms held here (``NetworkChain.read``). A new key is a replaced edge, whose new store
        counts candidates from the first again, so they are read from there. A revision may add
        experiments (a learner is made for each new model; its dataset must be under ``datasets_dir``)
        or change the validators: this validator signs the new terms, or retires (``retired``)."""
        before = self.network
        if self._network.read(self.edge) is None:
            return
        if self.network.edge_key != before.edge_key:
            log.warning("the edge signs with a new key (a replaced edge); network %s re-read", self.network.network_id)
            self._followed.clear()
        if self.network.revision != before.revision and self.retired is None:
            self._drop_retired_proposals()
            for spec in self.network.experiments:
                if spec.model.name not in self.learners:
                    try:
                        self.learners[spec.model.name] = learner = model_learner(spec.model)
                    except WorkloadError as exc:
                        log.error("%s is not validated here: %s", spec.key, exc)
                        continue
                    self._evaluators[spec.model.name] = Evaluator(learner)
            self.sign_network()

    def _drop_retired_proposals(self) -> None:
        """Drop the open decisions on heads whose proposer the network no longer lists (a revision
        retired it): no edge certifies such a head, so an attestation of it is never published."""
        keys = self.network.validator_key_set
        retired = [head_id for head_id, d in self.state.decisions.items() if d.head.validator_key not in keys]
        for head_id in retired:
            log.info("head %s: its proposer left the network in revision %d", head_id[:19], self.network.revision)
            del self.state.decisions[head_id]
        if retired:
            self.state.save(self._state_path)

    def _signed_by_edge(self, lease: Lease) -> None:
        """Follow the edge's key (``_follow_network``) when ``lease`` is not signed by the known one; a
        lease the edge did not sign stays refused (``precheck``)."""
        if self.network.edge_key is not None:
            try:
                lease.verify(self.network.edge_key)
            except SignatureError:
                self._follow_network()

    def _lease_evidence(
        self,
        spec: ExperimentSpec,
        salt: bytes,
        lease: Lease,
        head_id: str,
        measured: tuple[dict[str, np.ndarray], dict[str, np.ndarray]],
    ) -> float | None:
        """``LeaseEvidence.z`` of ``measured`` (the parameters of head ``head_id`` the candidate trained
        on, a delayed update's too, and the trained ones) on ``lease``, in a window of ``salt``, from
        this validator's copy of the prepared training split. ``None`` (not measured: no credit) when a
        shard is not here."""
        if spec.key not in self._evidence:
            manifest = self.edge.fetch_manifest(spec.dataset_id)
            root = self.datasets_dir / spec.dataset_id

            def read(shard_id: str) -> tuple[np.ndarray, np.ndarray]:
                return decode_shard(shard_path(root, manifest.shard(shard_id)).read_bytes(), manifest.features)

            self._evidence[spec.key] = LeaseEvidence(
                self.learner(spec), self._evaluators[spec.model.name], manifest.shard_ids, read
            )
        try:
            z = self._evidence[spec.key].z(salt, head_id, *measured, lease.lease_id, lease.shard_ids)
        except (OSError, ProtocolError, ValueError, KeyError) as exc:
            log.warning("%s: lease %s: evidence not measured: %s", spec.key, lease.lease_id, exc)
            return None
        log.debug("%s: lease %s: evidence z %.2f", spec.key, lease.lease_id, z)
        return z

    def _candidate_path(self, candidate_id: str) -> Path:
        """Where a candidate's artifact is kept while it is judged."""
        return self.storage.root / "candidates" / candidate_id.removeprefix("sha256:")

    def _head(self, spec: ExperimentSpec, head_id: HeadId) -> HeadDescriptor | None:
        """A head of ``spec``'s lineage by id (the current one, the one before it as last seen, else the
        edge's copy), verified as canonical."""
        seen = self._seen_heads.get(head_id)
        if seen is None:
            seen = self.edge.head(spec.key, head_id)
            if seen is None:
                return None
            self._network.verify_head(seen)
            self._remember(seen)
        return seen

    def _remember(self, head: HeadDescriptor) -> None:
        self._seen_heads[head.head_id] = head
        while len(self._seen_heads) > 16:
            del self._seen_heads[next(iter(self._seen_heads))]

    def _verdict(
        self,
        candidate: Candidate,
        screen: Screen,
        promoted: HeadDescriptor | None = None,
        metrics: dict[str, float] | None = None,
        *,
        credited: bool = False,
    ) -> Verdict:
        """The signed verdict; an accepting ``screen`` names the head ``promoted`` it was merged into.
        Its ``examples`` metric is the credit it vouches for: the candidate's example count (checked
        against its lease before it can be accepted) when its work is ``credited``
        (``WindowDecision.credited``: evidence it trained on its lease), else 0. The edge credits that
        once the quorum signs the same, capped by the candidate and its lease (``protocol.credit``)."""
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
            metrics={**(metrics or {}), "examples": float(candidate.examples) if credited else 0.0},
        ).signed(self.identity)

    def _record(self, verdicts: Sequence[Verdict]) -> None:
        """Record decisions (judged ids and the outbox) on disk, then publish them."""
        self.state.record(verdicts, self.config.max_judged)
        self.state.save(self._state_path)
        self._flush()

    def _flush(self) -> None:
        """Publish recorded proposals and attestations, then final verdicts, a window's in one request.

        What is published is not saved as such: after a crash it is published again, which is safe
        (the edge keeps the first copy of a head, attestation or verdict)."""
        for decision in [d for d in self.state.decisions.values() if not d.published]:
            self._publish(decision)
            decision.published = True
        while self.state.outbox:
            key, batch = next(itertools.groupby(self.state.outbox, key=lambda verdict: verdict.experiment))
            published = list(batch)
            try:
                self.edge.publish_verdicts(key, published)
            except EdgeRequestError as exc:
                if exc.status not in (404, 409):
                    raise
                self._publish_each(published)  # the edge refuses a batch whole: keep what it takes
            del self.state.outbox[: len(published)]

    def _publish_each(self, verdicts: Sequence[Verdict]) -> None:
        """Publish ``verdicts`` one by one, dropping those the edge refuses as not borne out by its
        lineage (404: a candidate it never received, 409: a contradiction), with a warning each."""
        for verdict in verdicts:
            try:
                self.edge.publish_verdict(verdict)
            except EdgeRequestError as exc:
                if exc.status not in (404, 409):
                    raise
                log.warning("verdict on %s not taken: %s", verdict.candidate_id[:19], exc)

    def _publish(self, decision: Decision) -> None:
        """Publish ``decision``'s proposal and attestation; a head the edge answers canonical is kept
        (``_answered``) for the decision's settling, which then needs no read of the current head."""
        head = decision.head
        try:
            canonical = None
            if decision.propose:
                if head.outer_state is not None:
                    state = self.storage.head_path(head.outer_state).read_bytes()
                    self.edge.publish_outer_state(head.experiment, pack_envelope(head.to_wire(), state))
                artifact = self.storage.head_path(head.head_id).read_bytes()
                canonical = self.edge.publish_head(head.experiment, pack_envelope(head.to_wire(), artifact))
            if decision.attestation is not None:
                canonical = self.edge.publish_attestation(decision.attestation) or canonical
            if canonical is not None:
                self._answered[head.experiment] = canonical
        except EdgeRequestError as exc:
            if exc.status not in (404, 409, 413, 429):  # 413, 429: past this validator's budgets for the window
                raise
            log.warning("head %s of window %d was not taken: %s", head.head_id[:19], head.window, exc)

    def run(self, specs: Sequence[ExperimentSpec] | None, stop: threading.Event) -> None:
        """Validate ``specs`` (``None``: every experiment of the network, as revisions add them) until
        ``stop`` is set or a revision retires this validator (``retired``). Between rounds the validator waits on the edge's
        activity (``EdgeClient.activity``), not on a clock: a candidate, lease, head or quorum event
        wakes it at once, an open window's deadline when it comes first, ``config.idle_s`` at most.
        The activity token is taken before each round reads anything, so no event goes unseen. An edge
        that is unavailable, or serves what the validators did not sign (another network's terms, a head
        without a quorum), is asked again after a back-off, never followed and never a reason to stop;
        what does not verify in one experiment holds only that one (``_poll_unless_held``)."""
        backoff = Backoff()
        since: str | None = None
        signed = False  # once the edge answered (took the signature or refused it)
        while not stop.is_set():
            try:
                if not signed:
                    self.sign_network()
                    signed = True
                activity = self.edge.activity(since, self._idle_s() if since is not None else 0.0)
                since = activity.since
                # another edge now (or one that does not say), or a revised network
                if (activity.edge_key, activity.network_revision) != (self.network.edge_key, self.network.revision):
                    self._follow_network()
                if (retired := self.retired) is not None:
                    log.warning("%s", retired)
                    return
                validated = (
                    specs
                    if specs is not None
                    else [s for s in self.network.experiments if s.model.name in self.learners]
                )
                polled = [spec for spec in validated if self._poll_unless_held(spec)]
                for spec in polled:  # after every head is published: what only its own window needs,
                    self.warm(spec)
                for spec in polled:  # then what decides nothing
                    self.evaluate(spec)
                backoff.reset()
            except (httpx.TransportError, EdgeRequestError) as exc:
                delay_s = backoff.next_delay_s()
                log.warning("edge unavailable (%s); retrying in %.1f s", exc, delay_s)
                stop.wait(delay_s)
            except SignatureError as exc:  # it serves what the validators did not sign: wait for one that does
                delay_s = backoff.next_delay_s()
                log.warning("edge not trusted (%s); asking again in %.1f s", exc, delay_s)
                stop.wait(delay_s)

    def _poll_unless_held(self, spec: ExperimentSpec) -> bool:
        """``poll`` ``spec`` unless it is held; whether it was polled. A ``SignatureError`` (its head or
        orders are not what its validators signed) holds this experiment alone, after a back-off of its
        own, so that the others go on being validated meanwhile."""
        now = self.clock.monotonic_s()
        until, backoff = self._held.get(spec.key, (now, Backoff()))
        if until > now:
            return False
        try:
            self.poll(spec)
        except SignatureError as exc:
            delay_s = backoff.next_delay_s()
            self._held[spec.key] = (now + delay_s, backoff)
            log.warning("%s: the edge serves what was not signed (%s); held for %.1f s", spec.key, exc, delay_s)
            return False
        self._held.pop(spec.key, None)
        return True

    def _idle_s(self) -> float:
        """How long to wait for activity: until the next grace or deadline of an open window (none when
        one passed since the poll that set it) or the end of an experiment's hold, ``idle_s`` at most
        (past its deadline, a window that did not close waits for activity: a lease or a candidate)."""
        now = self.clock.monotonic_s()
        due = [t for times in self._due.values() for t in times] + [until for until, _ in self._held.values()]
        return min([self.config.idle_s, *(max(t - now, 0.0) for t in due)])
