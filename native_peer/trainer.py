"""Native trainers: the builder API and the train-window loop.

    project = Project(mlp_learner(), train_loader=BatchLoader(64))
    trainer = (project.trainer(release, workload)
               .with_network(network).with_storage(StorageConfig("./node"))
               .with_bootstrap_peer("http://127.0.0.1:8000").spawn())
    experiment = trainer.experiment(StudyId("study"), ExperimentId("mnist"), RevisionId("rev-1"))
    outcome = trainer.train_window_once(experiment)
    print(outcome.candidate_id)

One window follows ``protocol.window``, the routine the browser peer runs too: read the current
head (``head_to_train``: signed by a validator of the network, not trained on yet), lease shards
from the edge (``check_lease``: edge-signed, for this head, this peer and experiment), fetch the
shards in the background while the head artifact downloads (or read them from a prepared copy on
disk: ``TrainerBuilder.with_sharded_dataset``), train ``local_epochs`` over the leased
examples in ``epoch_seed`` order with the user's optimizer (its state stays on this machine, saved
in the storage dir), then sign and publish the candidate (``package_candidate``). If the head of
its own window appeared while training (the window closed without it), the candidate is still
published, one head late: validators judge it in the next window as a delayed update
(``protocol.window.lease_covers``: a lease of the window on its base head), so a trainer slower than
the network's windows contributes instead of starting over forever. If two or more heads appeared,
the work is dropped and the next window starts from the newest head.
``Trainer.run`` keeps going across windows, backing off (``protocol.backoff``) while the edge is
unreachable. A lease signed by another edge key than the trainer knows (the edge was replaced, its
store lost: a new store makes a new key), or a wait of a whole window timeout for a newer head, makes
the trainer read the network manifest again and go on with the new key if the edge still serves the
same network terms (validators, quorum, experiments), the trust root (``native_peer.network_chain``); it
refuses the lease otherwise. The terms themselves change only by revisions a quorum of the validators
signed (``protocol.network_revisions``): an experiment this trainer does not know, or a head its
validators did not certify, makes it read the network again and follow the revisions from the terms it
trusts (a new experiment; new validators that took over at a head the old ones vouched for). Given several edges, the client moves to the next when one is
unreachable; the new edge's key is taken the same way, at its first lease. A window whose candidate was not published is not counted
(``_deliver``): its head is trained again.
Timestamps come from an injectable ``protocol.clock.Clock``.

Continuous training (``TrainerBuilder.with_continuous_training``, the CLI's default): a trainer
never waits for validators to judge its window. As head h arrives it asks for the next window's
lease (``after`` h: a lease granted before that window's head exists, ``server.leasing``; asked in
a lease thread, so the request travels while the window on h is packaged) and, once it has
published on h, trains it from where its published window stopped, on that lease's fresh examples. When the
next head arrives it reconciles by carrying that progress over (training goes on from
head + (θ_now − θ_published), or from θ_now where that head merged its candidate alone:
``protocol.window.carried_onto``), finishes the lease's epochs and publishes an update from that head
which carries it: a delayed update in the sense of Streaming DiLoCo's overlapped outer steps
(Douillard et al. 2025) and async local SGD. Once the next window's lease is trained it waits
for that head (never two windows ahead). After ``protocol.evidence.AHEAD_CHAIN`` windows in a row
trained ahead, where validators measure its lease evidence, the next lease is trained from its head
instead (granted ahead, trained once the head is there; ``restarts_from_head``, decision 0041). Work
on a head two or more heads behind when its training ends is carried over the same way instead of
dropped. A candidate
claims only the examples of its own lease. A continuous trainer sizes its leases to that wait
(``protocol.lease_size``): more shards while it waits for heads, within the experiment's
``max_shards_per_lease``, fewer when its work comes late. Each outcome records the trainer's compute
and wall seconds, so its utilization can be measured.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np

from protocol.backoff import Backoff
from protocol.clock import SYSTEM_CLOCK, Clock
from protocol.codec import decode_tensors, encode_tensors
from protocol.errors import SignatureError
from protocol.evidence import restarts_from_head
from protocol.ids import ContentId, ExperimentId, ExperimentKey, HeadId, RevisionId, StudyId
from protocol.lease_work import lease_work
from protocol.manifests import PROTOCOL_VERSION, ExperimentSpec, NetworkManifest, ReleaseManifest, SupportedWorkload
from protocol.messages import HeadDescriptor, LeaseGrant
from protocol.screening import PRESETS
from protocol.shards import feature_scale
from protocol.updates import encode_update
from protocol.window import (
    NoWindow,
    carried_onto,
    check_lease,
    epoch_seed,
    head_to_train,
    lease_window,
    package_candidate,
)

from .edge_client import EdgeClient, EdgeRequestError
from .head_follower import FollowedHead, HeadFollower
from .identity import NodeIdentity
from .learner import BatchLoader, JaxLearner, TrainEngine, at_learning_rate
from .lease_sizer import LeaseSizer
from .network_chain import NetworkChain
from .shard_cache import ShardCache
from .storage import StorageConfig, write_atomic

__all__ = ["Experiment", "Project", "Trainer", "TrainerBuilder", "WindowOutcome", "WindowUnavailable"]

log = logging.getLogger(__name__)


WindowUnavailable = NoWindow
"""No window to train right now (no head yet, no newer head in time, or the head moved on): the
trainer API's name for ``protocol.window.NoWindow``."""


@dataclass(frozen=True)
class Experiment:
    key: ExperimentKey
    spec: ExperimentSpec


@dataclass(frozen=True)
class WindowOutcome:
    """What one train window produced. ``candidate_id`` is the candidate it published, trained on ``base_head_id``."""

    experiment: str
    window: int
    base_head_id: HeadId
    candidate_id: ContentId
    lease_id: str
    shard_ids: tuple[str, ...]
    examples: int
    steps: int
    train_loss: float
    samples_per_s: float
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def head_id(self) -> ContentId:
        return self.candidate_id


@dataclass(frozen=True)
class ExperimentProgress:
    """A trainer's progress in one experiment, kept in its storage dir as ``state.json``: how many
    windows it published, and the head the last one was trained on (not trained on again)."""

    windows_done: int = 0
    last_base_head: HeadId | None = None

    def after(self, head: HeadDescriptor) -> ExperimentProgress:
        """The progress once a window on ``head`` is published."""
        return ExperimentProgress(self.windows_done + 1, head.head_id)

    def to_json(self) -> bytes:
        return json.dumps({"windows_done": self.windows_done, "last_base_head": self.last_base_head}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ExperimentProgress:
        """Raise ``ValueError`` naming what is wrong unless ``data`` is a saved progress."""
        value = json.loads(data)
        if not isinstance(value, dict):
            raise ValueError(f"not a trainer's saved progress: {data[:200]!r}")
        windows, head = value.get("windows_done"), value.get("last_base_head")
        if not isinstance(windows, int) or windows < 0 or not (head is None or isinstance(head, str)):
            raise ValueError(f"not a trainer's saved progress: {data[:200]!r}")
        return cls(windows, None if head is None else HeadId(head))


@dataclass
class _Ahead:
    """The next window's lease, granted before its head existed, and the epochs trained on it."""

    grant: LeaseGrant
    x: np.ndarray
    y: np.ndarray
    epochs: int = 0
    steps: int = 0
    seconds: float = 0.0  # in its training steps
    loss: float = float("nan")  # of its last epoch
    trained_at: float = 0.0  # when its last epoch ended (``time.perf_counter``)


@dataclass
class _Carry:
    """Progress a continuous trainer made past its last published (or overtaken) window on ``after``:
    training stands at ``params`` after ``steps`` optimizer steps; what it carries to the next head is
    ``params − origin``, unless that head did not merge ``published``: then the progress, made from a
    point the network turned down, is dropped and the lease trained again from the head.
    ``ahead``: the next window's lease, once granted (``next_lease``: its request, under way;
    ``refused``: none was free, so it waits for the next head)."""

    after: HeadDescriptor
    origin: dict[str, np.ndarray]
    params: Any
    steps: int = 0
    ahead: _Ahead | None = None
    refused: bool = False
    published: ContentId | None = None  # the candidate published on ``after`` (None: overtaken, unpublished)
    next_lease: Future[_Ahead | None] | None = None
    restarts: bool = False  # the next lease trains from the next head, not ahead (``restarts_from_head``)


@dataclass(frozen=True)
class Project:
    """A user's project: learner plus loaders. ``eval_loader`` gives local (x, y) for self-reports."""

    learner: JaxLearner
    train_loader: BatchLoader = field(default_factory=lambda: BatchLoader(64))
    eval_loader: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None

    def trainer(self, release: ReleaseManifest, workload: SupportedWorkload) -> TrainerBuilder:
        if release.protocol_version != PROTOCOL_VERSION:
            raise ValueError(f"release speaks protocol {release.protocol_version}, this code {PROTOCOL_VERSION}")
        if workload.model != self.learner.model.name:
            raise ValueError(f"workload {workload.workload_id} needs model {workload.model}")
        return TrainerBuilder(self, release, workload)


@dataclass(frozen=True)
class TrainerBuilder:
    project: Project
    release: ReleaseManifest
    workload: SupportedWorkload
    network: NetworkManifest | None = None
    storage: StorageConfig | None = None
    bootstrap_url: str | Sequence[str] | None = None
    admission_token: str | None = None
    train_ahead: bool = False
    local_datasets: Path | None = None

    def with_network(self, network: NetworkManifest) -> TrainerBuilder:
        return replace(self, network=network)

    def with_storage(self, storage: StorageConfig) -> TrainerBuilder:
        return replace(self, storage=storage)

    def with_bootstrap_peer(self, url: str | Sequence[str]) -> TrainerBuilder:
        """The edge, or the edges tried in order (``EdgeClient``: the next one when one is unreachable)."""
        return replace(self, bootstrap_url=url)

    def with_admission_token(self, token: str) -> TrainerBuilder:
        """For networks with ``admission_required``: a token the edge operator issued."""
        return replace(self, admission_token=token)

    def with_continuous_training(self, enabled: bool = True) -> TrainerBuilder:
        """Never wait for a window to be judged: lease and train the next window at once, carried over
        to its head when it arrives (``Trainer.run``)."""
        return replace(self, train_ahead=enabled)

    def with_sharded_dataset(self, datasets_dir: Path) -> TrainerBuilder:
        """Read leased shards from a prepared copy of the network's datasets under ``datasets_dir``
        (``<dir>/<dataset>/train/``, the layout ``dtn dataset shard`` writes; the train folder is all it
        needs) instead of downloading them. Leases still come from the edge and only their shards are
        read, each verified against the fetch-manifest the edge serves; one that is missing or differs
        is downloaded from the edge instead."""
        return replace(self, local_datasets=datasets_dir)

    def spawn(self) -> Trainer:
        if self.network is None or self.storage is None or self.bootstrap_url is None:
            raise ValueError("a trainer needs with_network(), with_storage() and with_bootstrap_peer() before spawn()")
        return Trainer(
            self.project,
            self.workload,
            self.network,
            self.storage,
            self.bootstrap_url,
            self.admission_token,
            train_ahead=self.train_ahead,
            local_datasets=self.local_datasets,
        )


class Trainer:
    peer_kind = "native"

    def __init__(
        self,
        project: Project,
        workload: SupportedWorkload,
        network: NetworkManifest,
        storage: StorageConfig,
        bootstrap_url: str | Sequence[str],
        admission_token: str | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        train_ahead: bool = False,
        local_datasets: Path | None = None,
    ) -> None:
        self.project = project
        self.clock = clock
        self.train_ahead = train_ahead
        self.workload = workload
        self.storage = storage
        self.identity = NodeIdentity.load_or_create(storage.identity_path)
        self.edge = EdgeClient(bootstrap_url, token=admission_token)
        self._network = NetworkChain(network)
        try:
            self._network.read(self.edge)  # its key, and the revisions its validators signed since
        except SignatureError as exc:
            raise ValueError(f"the bootstrap edge serves another network than the manifest given: {exc}") from None
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fetch")
        self._leaser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease")  # next windows' leases
        self._write_behind = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deliver")  # in order
        self._followers: dict[str, HeadFollower] = {}
        self._asked: dict[
            str, tuple[HeadId, Future[_Ahead | None]]
        ] = {}  # experiment -> lease asked on a head's arrival
        self._progress: dict[str, ExperimentProgress] = {}  # experiment -> as last published (state.json)
        self._residuals: dict[str, dict[str, np.ndarray] | None] = {}  # experiment -> codec error feedback
        self.shards = ShardCache(self.edge, storage, self._pool, local_datasets)
        self._engines: dict[str, TrainEngine] = {}
        self._opt_states: dict[str, Any] = {}
        # experiment -> (a head whose shards were all leased, when to ask again: its leases lapse then)
        self._full_windows: dict[str, tuple[HeadId, float]] = {}
        self.restored_optimizers: set[str] = set()  # experiments whose optimizer state came from disk
        self._carry: dict[str, _Carry] = {}  # experiment -> progress past its last published window
        self._chain: dict[str, int] = {}  # experiment -> windows in a row trained from its own last candidate
        self._sizers: dict[str, LeaseSizer] = {}  # experiment -> its next lease's size (continuous)
        self._idle_since: dict[str, float] = {}  # experiment -> when it began to wait for a newer head (run)
        self._spawned_at = time.perf_counter()
        self.compute_s = 0.0  # seconds spent in training steps since spawn (windows and work ahead)
        self.waited_s = {"head": 0.0, "lease": 0.0}  # seconds waited for a newer head, for a lease asked ahead
        # every example trained on since spawn, by experiment, whatever became of the work
        self.trained_samples: dict[ExperimentKey, int] = {}
        log.info("trainer %s spawned (storage %s)", self.peer_id, storage.root)

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def close(self) -> None:
        """Finish delivering published windows, then stop following heads, let a lease request under
        way end (its shard fetches not begun are cancelled), and close the connections: a request still
        running on a closed client would leave its socket open."""
        self._write_behind.shutdown(wait=True)
        for follower in self._followers.values():
            follower.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._leaser.shutdown(wait=True, cancel_futures=True)
        self.edge.close()

    def experiment(self, study: StudyId, experiment: ExperimentId, revision: RevisionId) -> Experiment:
        key = ExperimentKey(study, experiment, revision)
        try:
            spec = self.network.experiment(key)
        except KeyError:
            if not self._follow_network() or key not in {s.key for s in self.network.experiments}:
                raise ValueError(f"the network runs no experiment {key}") from None
            spec = self.network.experiment(key)
        if not self.workload.supports(spec):
            raise ValueError(f"experiment {key} needs {spec.model.name} on {spec.dataset_id}; workload cannot run it")
        if spec.model != self.project.learner.model:
            raise ValueError(f"experiment {key} declares model {spec.model.name} other than this trainer's learner")
        return Experiment(key, spec)

    # -- state kept in the storage dir ------------------------------------------------------
    def _state_path(self, key: ExperimentKey) -> Any:
        return self.storage.experiment_dir(key) / "state.json"

    def progress(self, key: ExperimentKey) -> ExperimentProgress:
        """This trainer's progress in ``key``: read from disk once, then kept here (the disk copy is
        written behind, in order, by ``_write_behind``)."""
        if key not in self._progress:
            path = self._state_path(key)
            self._progress[key] = (
                ExperimentProgress.from_json(path.read_bytes()) if path.exists() else ExperimentProgress()
            )
        return self._progress[key]

    def _engine(self, experiment: Experiment) -> TrainEngine:
        if experiment.key not in self._engines:
            optimizer = self.project.learner.make_optimizer(experiment.spec)
            features = self.edge.fetch_manifest(experiment.spec.dataset_id).features
            self._engines[experiment.key] = TrainEngine(
                self.project.learner, optimizer, feature_scale=feature_scale(features)
            )
        return self._engines[experiment.key]

    def _optimizer_state(self, experiment: Experiment, params: Any) -> Any:
        if experiment.key in self._opt_states:
            return self._opt_states[experiment.key]
        fresh = self._engine(experiment).init_optimizer(params)
        path = self.storage.experiment_dir(experiment.key) / "optimizer.safetensors"
        if path.exists():
            leaves, treedef = jax.tree_util.tree_flatten(fresh)
            saved, _ = decode_tensors(path.read_bytes())
            if len(saved) == len(leaves) and all(
                saved[f"leaf{i:05d}"].shape == np.shape(leaf) for i, leaf in enumerate(leaves)
            ):
                log.info("resuming optimizer state for %s from %s", experiment.key, path)
                self.restored_optimizers.add(experiment.key)
                return jax.tree_util.tree_unflatten(treedef, [saved[f"leaf{i:05d}"] for i in range(len(leaves))])
        return fresh

    def _save(self, key: ExperimentKey, opt_state: Any, progress: ExperimentProgress) -> None:
        """Write the optimizer state and the progress (in the write-behind thread, in order)."""
        leaves = jax.tree_util.tree_leaves(opt_state)
        directory = self.storage.experiment_dir(key)
        write_atomic(
            directory / "optimizer.safetensors",
            encode_tensors({f"leaf{i:05d}": np.asarray(leaf) for i, leaf in enumerate(leaves)}),
        )
        write_atomic(self._state_path(key), progress.to_json())

    # -- one window -------------------------------------------------------------------------
    def _follower(self, key: ExperimentKey) -> HeadFollower:
        if key not in self._followers:
            on_head = partial(self._on_head, key) if self.train_ahead else None
            self._followers[key] = HeadFollower(self.edge, key, self.storage, on_head=on_head)
        return self._followers[key]

    def _on_head(self, key: ExperimentKey, head: HeadDescriptor) -> None:
        """A new head arrived (``HeadFollower``'s ``on_head``: before the trainer is handed it). A continuous
        trainer asks for the lease after it at once, so the lease travels while the window's candidate
        is packaged, or while that window's lease still trains (``_ask_ahead`` takes it): one whose lease
        is trained and waits sizes it by that wait now (``LeaseSizer``); one still training asks for
        the size it has. The edge gives a peer its lease again when it asks again in that window, so no
        lease asked for here is left unused."""
        work = self._carry.get(key)
        if work is None:
            return
        experiment = Experiment(key, self.network.experiment(key))
        ahead = work.ahead
        if ahead is not None and ahead.epochs >= experiment.spec.local_epochs:  # trained: it waited since
            waited_s = time.perf_counter() - ahead.trained_at  # counted now: not again when the trainer wakes
            self._sizer(experiment).size(
                head.head_id, len(ahead.grant.lease.shard_ids), ahead.seconds, waited_s=waited_s
            )
        self._asked[key] = (head.head_id, self._submit_ahead(experiment, head))

    def _head_to_train(self, experiment: Experiment, wait_s: float, refresh: bool) -> FollowedHead:
        done = {self.progress(experiment.key).last_base_head}
        full, retry_at = self._full_windows.get(experiment.key, (None, 0.0))
        if full is not None and time.monotonic() < retry_at:
            done.add(full)
            wait_s = min(wait_s, retry_at - time.monotonic())
        follower = self._follower(experiment.key)
        followed = follower.refresh() if refresh else follower.current()
        if wait_s > 0 and (followed is None or followed.head.head_id in done):  # no head yet, or trained on
            waited = time.perf_counter()
            followed = follower.newer(None if followed is None else followed.head.head_id, wait_s)
            self.waited_s["head"] += time.perf_counter() - waited
            work = self._carry.get(experiment.key)
            if work is not None and work.ahead is not None:  # idle: a larger lease would fit
                until = None if followed is None else followed.head.head_id
                self._sizer(experiment).waited(time.perf_counter() - waited, until=until)
        head = followed.head if followed is not None else None
        last = head.head_id if head is not None and head.head_id in done else None
        try:
            head_to_train(head, self.network, last)
        except SignatureError:  # certified by validators a revision brought in?
            if not self._follow_network():
                raise
            head_to_train(head, self.network, last)
        assert followed is not None  # head_to_train raised otherwise
        return followed

    def _residual(self, experiment: Experiment) -> dict[str, np.ndarray] | None:
        """What the experiment's lossy codec dropped from this trainer's last update (error feedback):
        read from disk once, then kept here."""
        if experiment.spec.codec == "fp32":
            return None
        if experiment.key not in self._residuals:
            path = self.storage.experiment_dir(experiment.key) / "residual.safetensors"
            saved = decode_tensors(path.read_bytes())[0] if path.exists() else None
            shapes = self.project.learner.model.shapes
            fits = saved is not None and {k: v.shape for k, v in saved.items()} == shapes
            self._residuals[experiment.key] = saved if fits else None
        return self._residuals[experiment.key]

    def _lease(self, experiment: Experiment, head: HeadDescriptor) -> LeaseGrant:
        """A lease in the window on ``head``; ``WindowUnavailable`` when every shard of it is leased
        (asked again at the next head, or when the edge says its leases lapse)."""
        try:
            return self.edge.request_lease(
                experiment.key,
                self.identity,
                self.peer_kind,
                shards=self._sizer(experiment).shards,
                cache_bytes=self.shards.capacity_bytes,
                work=lease_work(experiment.spec.lease_work_bits, experiment.key, self.peer_id, head.head_id),
            )
        except EdgeRequestError as exc:
            if exc.status != 409:
                raise
            retry_s = exc.retry_after_s if exc.retry_after_s is not None else float("inf")
            self._full_windows[experiment.key] = (head.head_id, time.monotonic() + retry_s)
            raise WindowUnavailable(exc.detail) from None

    def _reach(self, experiment: Experiment, grant: LeaseGrant) -> FollowedHead:
        """The head ``grant``'s lease was granted on, newer than the head followed when it was asked for
        (a follower behind a slow link lags fast windows): fetched now and checked like any head to train
        on, so the lease is trained where it was granted (its candidate judged at worst one head late)
        instead of asked for again on a head that will have moved on again by then. ``WindowUnavailable``
        when that head is gone or overtaken here already."""
        followed = self._follower(experiment.key).reach(grant.lease.base_head)
        if followed is None:
            raise WindowUnavailable("the head moved on while leasing")
        head_to_train(followed.head, self.network, None)
        return followed

    def _check_lease(self, grant: LeaseGrant, head: HeadDescriptor, *, ahead: bool = False) -> None:
        """``check_lease`` of ``grant`` on ``head``; when its signature is not the known edge key's, once
        more with the key the edge serves now, if it serves the same network (``_follow_network``)."""
        try:
            check_lease(grant.lease, head, peer_id=self.peer_id, edge_key=self.network.edge_key, ahead=ahead)
        except SignatureError:
            if not self._follow_network():
                raise
            check_lease(grant.lease, head, peer_id=self.peer_id, edge_key=self.network.edge_key, ahead=ahead)

    @property
    def network(self) -> NetworkManifest:
        """The network this trainer trusts now (``native_peer.network_chain``)."""
        return self._network.network

    def _follow_network(self) -> bool:
        """Take the network as the edge serves it now when its key or revision moved and it follows from
        the terms this trainer trusts (``NetworkChain.read``; ``SignatureError`` when it serves other
        terms). A new key is a replaced edge: what this trainer delivered to the old one since its last
        canonical head may be lost with its store, so no head counts as trained any more. True when
        anything moved."""
        key = self.network.edge_key
        if self._network.read(self.edge) is None:
            return False
        if self.network.edge_key != key:
            log.warning("the edge signs with a new key (a replaced edge); network %s re-read", self.network.network_id)
            self._progress = {k: replace(p, last_base_head=None) for k, p in self._progress.items()}
        return True

    def _idle(self, experiment: Experiment) -> None:
        """Count a wait for a head newer than the one trained: after a whole ``window_timeout_s`` of it,
        ask whether the edge was replaced (``_follow_network``): a window whose only lease the old edge
        held is reopened by no one else."""
        since = self._idle_since.setdefault(experiment.key, time.monotonic())
        if time.monotonic() - since >= experiment.spec.window_timeout_s:
            del self._idle_since[experiment.key]
            self._follow_network()

    def train_window_once(self, experiment: Experiment, *, wait_s: float = 0.0) -> WindowOutcome:
        """Train one window on the current head and publish the candidate (published when this returns).

        If this trainer already trained on the current head, waits up to ``wait_s`` for a newer one;
        raises ``WindowUnavailable`` when there is none. When publishing fails, its error is raised and
        the window is not counted: a retry may train on the same head again."""
        residuals = dict(self._residuals)
        outcome, delivered = self._window(experiment, wait_s, refresh=True)
        try:
            delivered.result()
        except BaseException:
            self._residuals = residuals
            raise
        return outcome

    def _window(
        self, experiment: Experiment, wait_s: float, *, refresh: bool = False
    ) -> tuple[WindowOutcome, Future[None]]:
        """One window, its candidate published and its state saved behind it (``_deliver``, in order,
        in a thread of its own): the returned future says when. The head is the one followed in the
        background (``refresh``: asked of the edge first). Continuous, the next window's lease is asked
        for before the candidate is packaged."""
        started = time.perf_counter()
        followed = self._head_to_train(experiment, wait_s, refresh)
        head = followed.head
        engine = self._engine(experiment)
        if not engine.warmed:  # compiled before a lease is held, not while the window waits on it
            params = self.project.learner.from_tensors(followed.tensors)
            engine.warm(params, experiment.spec.batch_size, experiment.spec.learning_rate_at(head.window))
        carried = self._carry.pop(experiment.key, None)
        ahead = self._next_lease(carried) if carried is not None else None
        if carried is not None and carried.published is not None and carried.published not in head.merged:
            carried = None  # trained on from a candidate the network turned down: start again at the head
        if carried is not None and carried.restarts:
            carried = None  # its lease, granted ahead and not trained: from the head (``restarts_from_head``)
        chain = 0 if carried is None else self._chain.get(experiment.key, 0) + 1
        self._chain[experiment.key] = chain
        if ahead is not None and lease_window(ahead.grant.lease, head):  # leased and begun before this head
            grant, (x, y) = ahead.grant, (ahead.x, ahead.y)
            done = ahead if carried is not None else _Ahead(grant, x, y)
        else:
            grant, ahead = self._lease(experiment, head), None
            if grant.lease.window > head.window:  # granted on a newer head than the one followed here
                followed = self._reach(experiment, grant)
                head = followed.head
                if carried is not None and carried.published is not None and carried.published not in head.merged:
                    carried = None
            self._check_lease(grant, head)
            pending, done = self.shards.prefetch(grant), _Ahead(grant, np.empty(0), np.empty(0))
        lease = grant.lease
        next_lease: Future[_Ahead | None] | None = None
        if self.train_ahead and done.epochs >= experiment.spec.local_epochs:  # nothing left to train here
            next_lease = self._ask_next(experiment, head, len(lease.shard_ids), done.seconds)
        base = followed.tensors
        start = base if carried is None else self._reconciled(base, carried, head)
        params = self.project.learner.from_tensors(start)
        opt_state = at_learning_rate(
            self._optimizer_state(experiment, params), experiment.spec.learning_rate_at(head.window)
        )
        if ahead is None:
            x, y = ShardCache.assemble(pending)
        loader = self._loader(experiment)
        train_started = time.perf_counter()
        steps, loss = 0, done.loss
        for epoch in range(done.epochs, experiment.spec.local_epochs):
            xb, yb = loader.batches(x, y, epoch_seed(lease, epoch))
            params, opt_state, loss = engine.train_epoch(params, opt_state, xb, yb)
            steps += len(xb)
        train_seconds = time.perf_counter() - train_started
        self.compute_s += train_seconds
        self._count_trained(experiment.key, steps * loader.batch_size)
        examples = (done.steps + steps) * loader.batch_size  # this lease's epochs, those trained ahead too
        metrics = {"train_loss": loss, "samples_per_s": examples / max(done.seconds + train_seconds, 1e-9)}
        if carried is not None:
            metrics["carried_steps"] = float(carried.steps - done.steps)  # steps that trained no example of it
        if self.project.eval_loader is not None:
            ex, ey = self.project.eval_loader()
            metrics.update({f"self_{k}": v for k, v in engine.evaluate(params, ex, ey).items()})
        all_steps = steps + (0 if carried is None else carried.steps)  # every optimizer step in the update
        latest = self._follower(experiment.key).current()
        late = latest is not None and latest.head.parent == head.head_id  # its window closed while it trained
        if latest is None or (latest.head.head_id != head.head_id and not late):  # two heads on: stale there
            self._opt_states[experiment.key] = opt_state
            if self.train_ahead:  # nothing of it reached the network: carry all of it over
                next_lease = next_lease or self._ask_next(experiment, head, len(lease.shard_ids), 0.0, late=True)
                self._carry[experiment.key] = _Carry(head, base, params, all_steps, next_lease=next_lease)
                raise WindowUnavailable("newer heads were promoted while training; carrying this work over")
            raise WindowUnavailable("newer heads were promoted while training; dropping this window")
        if self.train_ahead and next_lease is None:
            next_lease = self._ask_next(experiment, head, len(lease.shard_ids), done.seconds + train_seconds, late=late)
        codec = experiment.spec.codec
        trained = self.project.learner.to_tensors(params)
        tensors, residual = encode_update(self.project.learner.model, base, trained, codec, self._residual(experiment))
        candidate, envelope = package_candidate(
            lease,
            head,
            tensors,
            self.identity,
            peer_kind=self.peer_kind,
            model=experiment.spec.model.name,
            codec=codec,
            examples=examples,
            steps=all_steps,
            created_at_ms=self.clock.now_ms(),
            metrics=metrics,
        )
        if codec != "fp32":
            self._residuals[experiment.key] = residual
        before = self.progress(experiment.key)
        progress = before.after(head)
        self._progress[experiment.key], self._opt_states[experiment.key] = progress, opt_state
        delivered = self._write_behind.submit(
            self._deliver, experiment, envelope, opt_state, (before, progress), residual
        )
        if self.train_ahead:
            restarts = self._restarts(experiment, chain, len(y))
            self._carry[experiment.key] = _Carry(
                head, trained, params, published=candidate.candidate_id, next_lease=next_lease, restarts=restarts
            )
        outcome = WindowOutcome(
            experiment=experiment.key,
            window=head.window,
            base_head_id=head.head_id,
            candidate_id=candidate.candidate_id,
            lease_id=lease.lease_id,
            shard_ids=lease.shard_ids,
            examples=examples,
            steps=steps,
            train_loss=loss,
            samples_per_s=metrics["samples_per_s"],
            seconds=time.perf_counter() - started,
            metrics=metrics,
        )
        self.storage.append_outcome(
            {
                **asdict(outcome),
                "peer_id": self.peer_id,
                "windows_done": progress.windows_done,
                "shard_cache_hits": self.shards.hits,
                "shard_memory_hits": self.shards.memory_hits,
                "shard_local_reads": self.shards.local_reads,
                "shard_downloads": self.shards.downloads,
                "optimizer_restored": experiment.key in self.restored_optimizers,
                "candidate_bytes": len(envelope),
                "compute_s": self.compute_s,
                "head_wait_s": self.waited_s["head"],
                "lease_wait_s": self.waited_s["lease"],
                "trained_samples": self.trained_samples.get(experiment.key, 0),
                "wall_s": time.perf_counter() - self._spawned_at,
                "at_ms": self.clock.now_ms(),
            }
        )
        log.info(
            "%s window %d: candidate %s (%d examples, loss %.4f)",
            experiment.key,
            head.window,
            candidate.candidate_id[:19],
            examples,
            loss,
        )
        return outcome, delivered

    def _deliver(
        self,
        experiment: Experiment,
        envelope: bytes,
        opt_state: Any,
        progresses: tuple[ExperimentProgress, ExperimentProgress],
        residual: dict[str, np.ndarray],
    ) -> None:
        """Publish a window's candidate, then save what it leaves behind (residual, optimizer, progress).
        ``progresses``: the experiment's progress before the window and after it. A window whose
        candidate was not published is not counted: unless a later window counted already, the
        progress goes back to before it, so its head is trained again (the edge may have lost its
        lease: a replaced edge, and no other lease would reopen that window)."""
        before, progress = progresses
        try:
            self.edge.publish_candidate(experiment.key, envelope)
        except BaseException:
            if self._progress.get(experiment.key) is progress:
                self._progress[experiment.key] = before
            raise
        if experiment.spec.codec != "fp32":
            write_atomic(self.storage.experiment_dir(experiment.key) / "residual.safetensors", encode_tensors(residual))
        self._save(experiment.key, opt_state, progress)

    def _ask_next(
        self, experiment: Experiment, head: HeadDescriptor, shards: int, train_s: float, *, late: bool = False
    ) -> Future[_Ahead | None]:
        """The lease after ``head``, asked for once a lease of ``shards`` shards trained in ``train_s``
        seconds on it (``late``: after its window closed) sized it, unless that head's arrival sized it
        already (``_on_head``; ``LeaseSizer.size`` sizes once per head): it travels while this window's
        candidate is packaged."""
        self._sizer(experiment).size(head.head_id, shards, train_s, late=late)
        return self._ask_ahead(experiment, head)

    def _ask_ahead(self, experiment: Experiment, after: HeadDescriptor) -> Future[_Ahead | None]:
        """The next window's lease (``after`` the head just trained on) with its shards assembled, in
        the background: asked for when ``after`` arrived (``_on_head``), or now."""
        asked = self._asked.pop(experiment.key, None)
        if asked is not None and asked[0] == after.head_id:
            return asked[1]
        return self._submit_ahead(experiment, after)

    def _submit_ahead(self, experiment: Experiment, after: HeadDescriptor) -> Future[_Ahead | None]:
        """Ask for the lease after ``after`` in the lease thread, at the size last sized."""
        return self._leaser.submit(self._lease_ahead, experiment, after, self._sizer(experiment).shards)

    def _lease_ahead(self, experiment: Experiment, after: HeadDescriptor, shards: int | None) -> _Ahead | None:
        """The next window's lease with its examples; ``None`` when none is to be had: no shard of that
        window is free (the trainer waits for its head, then asks again), or heads moved on by more
        than one window while asking."""
        try:
            grant = self.edge.request_lease(
                experiment.key,
                self.identity,
                self.peer_kind,
                after=after.head_id,
                shards=shards,
                cache_bytes=self.shards.capacity_bytes,
                work=lease_work(experiment.spec.lease_work_bits, experiment.key, self.peer_id, after.head_id),
            )
        except EdgeRequestError as exc:
            if exc.status != 409:
                raise
            return None
        try:
            self._check_lease(grant, after, ahead=True)
        except NoWindow:
            return None
        return _Ahead(grant, *ShardCache.assemble(self.shards.prefetch(grant)))

    def _next_lease(self, work: _Carry) -> _Ahead | None:
        """``work``'s next-window lease, once its request (``_ask_ahead``) has an answer; ``None``, and
        ``work`` marked refused, when it got none. The request's error, if any, is raised here."""
        if work.ahead is None and work.next_lease is not None:
            future, work.next_lease = work.next_lease, None
            waited = time.perf_counter()
            work.ahead = future.result()
            work.refused = work.ahead is None
            self.waited_s["lease"] += time.perf_counter() - waited
            key = work.after.experiment  # waiting for the lease is idle too: a larger lease would hide it
            self._sizer(Experiment(key, self.network.experiment(key))).waited(time.perf_counter() - waited)
        return work.ahead

    def _count_trained(self, key: ExperimentKey, examples: int) -> None:
        self.trained_samples[key] = self.trained_samples.get(key, 0) + examples

    def _sizer(self, experiment: Experiment) -> LeaseSizer:
        """The experiment's lease sizer, shared with the follower's thread (``_on_head``)."""
        if experiment.key not in self._sizers:  # setdefault: the follower's thread may make it at the same time
            self._sizers.setdefault(experiment.key, LeaseSizer(*experiment.spec.lease_bounds))
        return self._sizers[experiment.key]

    def _loader(self, experiment: Experiment) -> BatchLoader:
        return replace(self.project.train_loader, batch_size=experiment.spec.batch_size)

    def _reconciled(self, base: dict[str, np.ndarray], carried: _Carry, head: HeadDescriptor) -> dict[str, np.ndarray]:
        """Where a window on ``head`` (parameters ``base``) starts when work was carried over
        (``protocol.window.carried_onto``)."""
        now = self.project.learner.to_tensors(carried.params)
        return carried_onto(head, base, now, carried.origin, carried.published)

    def train_ahead_once(self, experiment: Experiment) -> bool:
        """One epoch of the next window's lease while the network judges the last one: the lease, asked
        for when the last window was published (``after`` its head), and its shards assembled. False when
        there is nothing to do (no window published yet, no shard free in the next window, or every
        epoch of its lease trained: the trainer then waits for the next head)."""
        if not self._can_train_ahead(experiment):
            return False
        work = self._carry[experiment.key]
        if work.ahead is None and work.next_lease is None:  # its request failed: ask again
            work.next_lease = self._ask_ahead(experiment, work.after)
        ahead = self._next_lease(work)
        if ahead is None:  # the next window is full: wait for its head, then ask again
            return False
        current = self._follower(experiment.key).current()
        if current is not None and current.head.window > ahead.grant.lease.window:  # its window closed without it
            work.refused = True
            return False
        xb, yb = self._loader(experiment).batches(ahead.x, ahead.y, epoch_seed(ahead.grant.lease, ahead.epochs))
        started = time.perf_counter()
        opt_state = at_learning_rate(
            self._opt_states[experiment.key], experiment.spec.learning_rate_at(ahead.grant.lease.window)
        )
        work.params, self._opt_states[experiment.key], ahead.loss = self._engine(experiment).train_epoch(
            work.params, opt_state, xb, yb
        )
        seconds = time.perf_counter() - started
        self.compute_s += seconds
        self._count_trained(experiment.key, xb.shape[0] * xb.shape[1])
        ahead.seconds += seconds
        ahead.trained_at = time.perf_counter()
        ahead.epochs += 1
        ahead.steps += len(xb)
        work.steps += len(xb)
        return True

    def run(
        self,
        experiments: Sequence[Experiment],
        *,
        max_windows: int | None = None,
        stop: threading.Event | None = None,
        poll_s: float = 2.0,
    ) -> list[WindowOutcome]:
        """Keep training across windows, round-robin over ``experiments``, following newer heads
        (continuous: training the next window's lease while no new head is there); while the edge is
        unavailable, or serves what the validators did not sign (another network's terms, a head or lease
        that does not verify), wait 0.5 s, doubling per failure up to 30 s, and ask again. A window's candidate is published
        while the next one trains (a failed publication is logged); all are published on return."""
        outcomes: list[WindowOutcome] = []
        stop = stop or threading.Event()
        backoff = Backoff(initial_s=0.5, max_s=30.0)
        while not stop.is_set() and (max_windows is None or len(outcomes) < max_windows):
            for experiment in experiments:
                if stop.is_set():
                    break
                busy = self._can_train_ahead(experiment)
                try:
                    try:
                        wait_s = 0.0 if busy else poll_s / len(experiments)
                        outcome, delivered = self._window(experiment, wait_s)
                        delivered.add_done_callback(_log_undelivered)
                        outcomes.append(outcome)
                        self._idle_since.pop(experiment.key, None)
                        backoff.reset()
                    except WindowUnavailable as exc:
                        log.debug("%s: %s", experiment.key, exc)
                        if busy:
                            self.train_ahead_once(experiment)
                        else:
                            self._idle(experiment)
                except (httpx.TransportError, EdgeRequestError) as exc:
                    delay_s = backoff.next_delay_s()
                    log.warning("edge unavailable (%s); retrying in %.1f s", exc, delay_s)
                    stop.wait(delay_s)
                except SignatureError as exc:  # what the edge serves is not the validators': never trained on
                    delay_s = backoff.next_delay_s()
                    log.warning("edge not trusted (%s); asking again in %.1f s", exc, delay_s)
                    stop.wait(delay_s)
        self._write_behind.submit(lambda: None).result()  # every window's delivery has ended
        return outcomes

    def _can_train_ahead(self, experiment: Experiment) -> bool:
        work = self._carry.get(experiment.key)
        if work is None or work.refused or work.restarts:
            return False
        return work.ahead is None or work.ahead.epochs < experiment.spec.local_epochs

    def _restarts(self, experiment: Experiment, chain: int, examples: int) -> bool:
        """Whether the next lease, after ``chain`` windows in a row trained ahead and a lease of
        ``examples``, is trained from its head (``restarts_from_head``)."""
        manifest = self.edge.fetch_manifest(experiment.spec.dataset_id)
        pool = sum(s.examples for s in manifest.shards)
        return restarts_from_head(chain, PRESETS[experiment.spec.screening].asks_lease_evidence, examples, pool)


def _log_undelivered(delivered: Future[None]) -> None:
    if (exc := delivered.exception()) is not None:
        log.warning("a window's candidate was not published (its head may be trained again): %s", exc)
