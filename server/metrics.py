"""Prometheus metrics of one edge (a registry per app, so tests can run several edges)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

__all__ = ["EdgeMetrics"]


class EdgeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.connections = Gauge("dtn_ws_connections", "Joined WebSocket peers", ["kind"], registry=self.registry)
        self.relay_messages = Counter(
            "dtn_relay_messages_total", "Messages queued to subscribers", ["topic"], registry=self.registry
        )
        self.closes = Counter("dtn_ws_closes_total", "WebSocket closes by code", ["code"], registry=self.registry)
        self.shard_bytes = Counter("dtn_shard_bytes_total", "Shard bytes served (full files)", registry=self.registry)
        self.head_bytes = Counter(
            "dtn_head_bytes_total", "Head artifact bytes served over HTTP (full bodies)", registry=self.registry
        )
        self.head_delta_bytes = Counter(
            "dtn_head_delta_bytes_total", "Head deltas served over HTTP (bytes)", registry=self.registry
        )
        self.leases = Counter("dtn_leases_total", "Leases issued", registry=self.registry)
        self.leases_released = Counter(
            "dtn_leases_released_total", "Leases given back undelivered when their holder left", registry=self.registry
        )
        self.candidates = Counter("dtn_candidates_total", "Candidates stored", ["via"], registry=self.registry)
        self.heads = Counter("dtn_heads_total", "Heads promoted", registry=self.registry)
        self.attestations = Counter(
            "dtn_attestations_total", "Validator attestations of proposed heads", registry=self.registry
        )
        self.quorum_conflicts = Counter(
            "dtn_quorum_conflicts_total",
            "Validators disagreeing: rival heads on one parent, or an attestation of another merge",
            registry=self.registry,
        )
        self.staged_bytes = Gauge(
            "dtn_staged_upload_bytes",
            "Bytes counted against the staging budget by partial or unpublished staged uploads",
            registry=self.registry,
        )
        self.rejected_uploads = Counter(
            "dtn_rejected_uploads_total", "Uploads refused", ["error"], registry=self.registry
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
