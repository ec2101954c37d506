"""The bootstrap / browser-edge server (FastAPI + uvicorn).

Cheap ingress for a training network; it is not the authority (only validator signatures make a
head canonical). Run it with ``python -m server`` (settings: ``python -m server --help``).

    settings       Settings: paths, limits, timeouts (CLI flags and DTN_* environment variables)
    errors         the one table mapping exceptions to HTTP status and WebSocket close codes
    blobs          content-addressed artifact files on disk (atomic, fsynced)
    store          SQLite: heads, candidates, leases, verdicts, peers, the edge's own key
    leasing        issues leases (rendezvous assignment over shards not yet taken this window)
    hub            live state: connected peers, topic fan-out with bounded queues, head waiters
    responses      orjson responses and immutable file responses (ETag = content id, Range, 304)
    dataset_routes fetch-manifest and lease-scoped shard bytes
    artifact_routes heads, candidates, verdicts, leases, artifacts
    relay          the WebSocket relay/signaling endpoint and its connection state machine
    portal         peer and experiment directories, /portal/snapshot for viewers
    metrics        Prometheus metrics
    admission      optional operator-issued bearer tokens with roles
    ratelimit      token buckets: per connection (relay) and per peer (leases, uploads)
    pyodide_runtime  prepares the self-hosted Pyodide + NumPy runtime (a setup step)
    bundle         the browser peer's Python bundle (protocol + browser_peer as a zip)
    app            create_app(settings): wires the above together
    serve          uvicorn config; BackgroundEdge runs an edge in a thread
"""
