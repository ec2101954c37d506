"""The shared protocol core: pure Python + NumPy, no I/O, imported unchanged everywhere.

The edge (``server``), native peers (``native_peer``) and the browser peer (``browser_peer``, in
Pyodide) all import this package; it imports only the standard library and NumPy (a test checks).

    ids          typed ids (StudyId, ExperimentId, RevisionId, HeadId, PeerId, LeaseId, ...)
    errors       the exception tree
    hashing      sha256 content ids over shipped bytes
    codec        safetensors-compatible tensor artifacts
    ed25519      pure-Python RFC 8032 signatures (what the browser signs with)
    signing      Signer interface, peer ids from keys, canonical JSON, a validator's key + signature
    fields       strict readers for decoded JSON
    messages     signed wire messages: Lease, Candidate, HeadDescriptor, Attestation, Verdict
    manifests    network / release / workload / experiment / dataset manifests
    network_pins fingerprints, validators' signatures over a network's terms, the pin rule peers apply
    quorum_signed  what a quorum of a network's validators signs: the signatures gathered, counted
    run_control  run-control orders (pause, resume, stop, pardon, rollback) a quorum of validators signs
    network_revisions  revisions of a network's terms (new experiments, new validators), each signed by
                 a quorum of the validators before it; the handover and the eras of heads and orders
    envelope     descriptor + artifact in one upload body or binary frame
    framing      a JSON header behind a length prefix (the codec's and the envelope's)
    layers       the layer set of model specs: shapes, init, wire form, NumPy forward / backward
    model        model specs (input shape, layers, objective), the reference forward and evaluation
    workload     WorkloadModel: a manifest's pinned record of JAX code of the network's own (native only)
    updates      update codecs (fp32, fp16, blockwise int8 with error feedback) and artifact layouts
    leases       rendezvous-hash lease assignment
    lease_size   how many shards a continuous trainer asks for: enough to fill the window period
    lease_work   a small proof of work per lease, bound to the peer and the head, where an experiment asks one
    batches      seeded batching of a window's examples
    shards       dataset shard encoding and verification
    head_delta   heads as deltas from their parents (exact, or on the int8 grid): encode, apply and check by content id
    head_grid    heads on their parent's int8 grid: the validators' unbiased, deterministic snap of a window's step
    content_cache  what peers keep of downloaded shards: by content, verified on use, LRU within a byte cap
    aggregation  merge rules (FedAvg and robust aggregators)
    outer        the outer optimizer: FedAvg, or DiLoCo's Nesterov step with its momentum as lineage state
    reasons      Reason: the typed accept/reject reasons, and which count as strikes
    screening    update screening presets and the promotion rule
    evidence     lease evidence: a candidate's loss gain on its lease against training shards outside it
    near_duplicates  a window's copies of one update, found in linear time (count sketch, SimHash bands)
    trust        per-peer strikes and quarantine (an immutable TrustBook)
    records      a peer's record in the lineage (heads that merged its work) and the merge weight it earns
    credit       which verdicts count toward credit and standing: borne out by the lineage or the quorum
    judging      judge_window: the whole decision for one window, pure; returns the next trust book
    deadline     when a validator closes a window: derived from recent window durations
    clock        the one injectable clock (wall time for the wire, monotonic for durations)
    backoff      retry back-off delays, for every client that retries
    uploads      staged uploads on the wire: paths, Content-Range, the stage's routing header
    transfers    sans-I/O plans for staged uploads and ranged downloads: their retry and resume rules
    window       one training window for every trainer: head and lease checks, lease_covers,
                 package_candidate
    lineage      lineage archives: an experiment's signed heads, candidates and verdicts in one
                 content-addressed tar, verified whole (signatures, quorum, parent chain, verdicts)
    edge_urls    lists of edge URLs (a peer's edges, an edge's upstreams, a page's mirrors), read strictly
    url_lists    the one reader of comma-separated URL lists that edge_urls and ice use
    ice          STUN/TURN server URIs and the ICE configuration a page is given (RTCIceServers, relay-only)
"""

from .errors import CodecError, IntegrityError, InvalidMessage, ProtocolError, SignatureError, TooLarge
from .ids import (
    ContentId,
    DatasetId,
    ExperimentId,
    ExperimentKey,
    HeadId,
    LeaseId,
    PeerId,
    RevisionId,
    ShardId,
    StudyId,
)
from .manifests import (
    ExperimentSpec,
    FetchManifest,
    NetworkManifest,
    ReleaseManifest,
    ShardEntry,
    SupportedWorkload,
)
from .messages import Candidate, HeadDescriptor, Lease, Verdict

__all__ = [
    "Candidate",
    "CodecError",
    "ContentId",
    "DatasetId",
    "ExperimentId",
    "ExperimentKey",
    "ExperimentSpec",
    "FetchManifest",
    "HeadDescriptor",
    "HeadId",
    "IntegrityError",
    "InvalidMessage",
    "Lease",
    "LeaseId",
    "NetworkManifest",
    "PeerId",
    "ProtocolError",
    "ReleaseManifest",
    "RevisionId",
    "ShardEntry",
    "ShardId",
    "SignatureError",
    "StudyId",
    "SupportedWorkload",
    "TooLarge",
    "Verdict",
]
