"""The liveness and abuse suite (issue #27 item 9): an experiment keeps making heads and the edge keeps
answering while hostile clients attack it from a few addresses at once, against a real edge, a real
validator and an honest trainer. Each attacker counts what it got, so the test also fails if an attack
did not happen."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import httpx
import pytest

from lab.hostile import IdleHolder, Squatter, StageSquatter
from lab.stack import LocalNetwork, prepare_network, validating
from native_peer.edge_client import EdgeClient
from server.serve import BackgroundEdge
from tools.networks import BASELINE

from .support import metric, mnist_trainer

HEADS = 6  # heads the experiment must promote under attack
CAP = 96  # the edge's connection cap here; the idle holder asks for more


@pytest.mark.slow  # a real network under attack for about a minute
def test_an_experiment_keeps_making_heads_while_clients_squat_hold_connections_and_stall_uploads(
    tmp_path: Path, dataset_root: Path
) -> None:
    local: LocalNetwork = prepare_network(tmp_path, datasets=dataset_root)
    spec = local.network.experiment(BASELINE)
    artifact = spec.model.max_artifact_bytes
    settings = local.edge_settings(
        max_connections=CAP,
        max_connections_per_address=40,
        reserved_connections=8,
        header_timeout_s=3.0,
        upload_chunk_bytes=64 * 1024,  # a stage counts at least one chunk: smaller than the artifact here
        upload_stage_bytes=4 * artifact,
        upload_address_bytes=2 * artifact,
        upload_grace_s=2.0,
    )
    with BackgroundEdge(settings) as edge, validating(local, edge.url, [spec]):
        edge_client = EdgeClient(edge.url)
        start = len(edge_client.heads(BASELINE))
        attackers = [
            Squatter(edge.url, BASELINE, identities=10),
            IdleHolder(settings.host, edge.settings.port, connections=160),
            StageSquatter(edge.url, BASELINE, size=artifact),
        ]
        for attacker in attackers:
            attacker.start()
        trainer = mnist_trainer(local.network, tmp_path / "honest", edge.url, continuous=True)
        stop = threading.Event()
        training = threading.Thread(
            target=trainer.run, args=([trainer.experiment(*BASELINE.parts)],), kwargs={"stop": stop}, daemon=True
        )
        training.start()
        probes: list[int] = []
        deadline = time.monotonic() + 150
        try:
            while len(edge_client.heads(BASELINE)) < start + HEADS and time.monotonic() < deadline:
                try:
                    probes.append(httpx.get(f"{edge.url}/healthz", timeout=5).status_code)
                except httpx.TransportError:
                    probes.append(0)
                time.sleep(0.5)
            heads = edge_client.heads(BASELINE)
            staged = metric(httpx.get(f"{edge.url}/metrics").text, "dtn_staged_upload_bytes")
            accepted = [v for v in edge_client.verdicts(BASELINE, trainer.peer_id) if v.accepted]
        finally:
            stop.set()
            training.join(60)
            trainer.close()
            for attacker in attackers:
                attacker.close()
            edge_client.close()
    squatter, idle, stager = attackers
    assert isinstance(squatter, Squatter) and isinstance(idle, IdleHolder) and isinstance(stager, StageSquatter)
    assert len(heads) >= start + HEADS, f"{len(heads) - start} heads under attack"
    gaps = [(b.created_at_ms - a.created_at_ms) / 1000 for a, b in itertools.pairwise(heads[start:])]
    assert max(gaps) <= 2 * spec.window_timeout_s  # every window ends within two deadlines
    assert probes and all(status == 200 for status in probes), probes  # health answered throughout
    assert len(accepted) >= 2  # honest work still gets through
    assert staged <= settings.upload_stage_bytes
    # the attacks happened: leases squatted, more connections opened than the cap, stages opened
    assert squatter.granted > 0 and idle.opened > CAP and stager.opened > 0
