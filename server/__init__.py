"""The bootstrap / browser-edge server (FastAPI + uvicorn).

Cheap ingress for a training network; it is not the authority (only validator signatures make a
head canonical). Run it with ``python -m server`` (settings: ``python -m server --help``).

    settings          Settings: paths, limits, timeouts (CLI flags and DTN_* environment variables)
    errors            the one table mapping exceptions to HTTP status and WebSocket close codes
    state             EdgeState: everything one running edge holds, built once at start-up
    store             heads, candidates, leases, verdicts, tokens, peers, run control, the edge's key, on an engine:
    store_engine      the engine interface the store runs its SQL over (a transaction, a read, close)
    store_sqlite      the embedded engine (one SQLite file)
    store_postgres    the engine for several edges sharing one state
    blobs             content-addressed artifact files on disk (atomic, fsynced)
    lineage           an experiment's lineage out of a store as an archive, and into one once verified whole
    follower          an edge following another: its heads, artifacts, candidates and verdicts, verified, mirrored
    backup            online backups of the SQLite store and artifacts, and restoring one into a new edge
    blobs_s3          artifacts in an S3-compatible bucket, for edges that share no file system
    uploads           artifacts staged in chunks until an envelope publishes them
    upload_routes     the staged uploads over HTTP
    credit            contributors' credit, tallied from the verdicts validators signed
    holders           which peers hold an experiment's current head (offered to browsers)
    ice               the ICE servers pages are given, each connection its own short-lived TURN credential
    replay            what the edge accepts only once within a while (validators' read proofs)
    leasing           issues leases and their holder-only secrets (rendezvous over untaken shards, homes first)
    intake            candidates, heads and verdicts taken in, by HTTP or WebSocket alike
    admission         optional operator-issued bearer tokens with roles, revocable
    signatures        native Ed25519 verification installed at start-up
    hub               live state: connected peers, topic fan-out with bounded queues, head waiters
    hub_redis         the hub's fan-out over Redis, for several edges of one deployment
    ratelimit         token buckets: per connection, per peer, per client address
    ratelimit_redis   the same buckets kept in Redis
    connections       header/body deadlines and connection caps for uvicorn
    budget            who may hold the edge's open connections (the bookkeeping, no I/O)
    headers           security headers on every HTTP response
    responses         orjson responses and conditional GET (ETag, 304, HEAD, Range)
    deps              FastAPI dependencies and bounded body readers shared by the routes
    dataset_routes    fetch-manifest and lease-scoped shard bytes
    experiment_routes an experiment's heads, leases, candidates and verdicts
    control_routes    run-control orders a quorum of validators signed: applied, kept, published
    revision_routes   revisions of the network's terms a quorum of validators signed: applied, kept, published
    artifact_routes   head and candidate artifacts by content id
    head_deltas       heads as deltas from their parents, made once each and kept in memory
    portal            the network manifest, directories, /portal/snapshot, /healthz, /metrics
    relay             the WebSocket relay/signaling endpoint and the viewers' event stream
    peer_runtime      what a tab loads to be a peer (Pyodide, the peer bundle) at content-addressed URLs
    metrics           Prometheus metrics
    operations        liveness, readiness and the metrics computed from the store
    app               create_app(settings): wires the above together
    serve             uvicorn config; BackgroundEdge runs an edge in a thread
"""
