"""Native peers: JAX + optax trainers and validators that join a network through its edge.

trainer      Project → TrainerBuilder → Trainer: the user-facing trainer API
head_follower  following an experiment's head in the background (long poll, download)
lease_sizer  LeaseSizer: how many shards a continuous trainer's next lease asks for (protocol.lease_size)
learner      JaxLearner (the user's model and optimizer), spec_learner, BatchLoader, TrainEngine, Evaluator
jax_layers   the JAX side of protocol.layers: any model spec applied to flat parameters
mnist        the MNIST MLP as a JaxLearner, its release and workload
models       models from config: [models.<name>] tables, the built-in models (networks/models.toml)
workloads    your own JAX code as a learner (pytree, Equinox, Flax NNX), pinned by hash; network_learners
validator    Validator: genesis, screening, evaluation, merge, signed promotion
anchor       Anchor: the validator's own update, trained once per anchor head
lineage_journal  the canonical heads a validator holds, given back to an edge that lost them
evidence     LeaseEvidence: each candidate's evidence that it trained on its lease (protocol.evidence)
edge_client  HTTP client for the edge
shard_cache  lease-scoped shard downloads, verified and cached (memory and disk, capped)
compile_cache  JAX's persistent compilation cache, shared by the machine's peers
identity     Ed25519 node identity (cryptography)
storage      StorageConfig: a node's directory layout
export       the best head a quorum vouches for, written as safetensors plus its model config
cli          ``python -m native_peer train | validate | keys | dataset | export | control``
control_cli  ``dtn control new | revise | sign | submit | show | revisions``: run-control orders and
             network revisions validators sign offline
network_chain  the network a peer trusts, followed through replaced edges and signed revisions
"""

from protocol.ids import ExperimentId, RevisionId, StudyId
from protocol.manifests import NetworkManifest, ReleaseManifest, SupportedWorkload

from .learner import BatchLoader, JaxLearner
from .storage import StorageConfig
from .trainer import Experiment, Project, Trainer, WindowOutcome, WindowUnavailable
from .validator import Validator, ValidatorConfig

__all__ = [
    "BatchLoader",
    "Experiment",
    "ExperimentId",
    "JaxLearner",
    "NetworkManifest",
    "Project",
    "ReleaseManifest",
    "RevisionId",
    "StorageConfig",
    "StudyId",
    "SupportedWorkload",
    "Trainer",
    "Validator",
    "ValidatorConfig",
    "WindowOutcome",
    "WindowUnavailable",
]
