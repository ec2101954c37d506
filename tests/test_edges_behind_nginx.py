"""Two edges behind one nginx (the site ``python -m deploy render`` writes, with DTN_NGINX_UPSTREAMS
naming both), on one private PostgreSQL, one redis-server and one blob directory. A real headless
Chromium contributes on nginx's public URL (TLS, self-signed): its relay WebSocket lands on one edge,
its home; the validator judges on the other edge directly; a native trainer trains through nginx too.
The browser's home is killed (SIGKILL) mid-run: the browser reconnects through nginx to the other
edge and is merged again, the native trainer goes on, and nothing acknowledged is lost. Staged
uploads through nginx meet one edge each (nginx hashes them by stage), and start again on the other
edge when theirs dies mid-stage.

Needs nginx, openssl, PostgreSQL, redis-server, Chromium and the Pyodide runtime (``make setup``);
under CI a missing one fails the test, elsewhere it is skipped with the reason."""

from __future__ import annotations

import contextlib
import itertools
import re
import shutil
import ssl
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.host import DEPLOY, render, self_signed_certificate, standalone_nginx_conf
from lab.demo import CHROMIUM, CHROMIUM_FLAGS, browser_problem
from lab.stack import PYODIDE_DIR, Fleet, free_port, prepare_network, validating
from native_peer.identity import NodeIdentity
from native_peer.trainer import WindowOutcome
from protocol.manifests import NetworkManifest
from protocol.messages import READ_PROOF_HEADER, PeerProof
from tools.networks import BASELINE, mnist_network

from .support import browsers, metric, missing, mnist_trainer, now_ms, private_postgres, private_redis, until
from .test_scale_out import start_edge

__all__ = ["private_postgres", "private_redis"]  # fixtures, used by name

pytestmark = pytest.mark.slow  # nginx, two edge processes, PostgreSQL, Redis, Chromium

BASE = f"/v1/experiments/{BASELINE}"


def _nginx_site(root: Path, upstreams: list[str], datasets: Path) -> tuple[Path, str]:
    """The rendered site for ``upstreams`` in a standalone nginx.conf; the conf and the public URL."""
    https, http = free_port(), free_port()
    edits = {
        "DTN_PUBLIC_URL": f"https://127.0.0.1:{https}",
        "DTN_NGINX_LISTEN": f"127.0.0.1:{https}",
        "DTN_NGINX_HTTP_LISTEN": f"127.0.0.1:{http}",
        "DTN_NGINX_UPSTREAMS": ",".join(upstreams),
        "DTN_TLS_CERT": str(root / "tls" / "cert.pem"),
        "DTN_TLS_KEY": str(root / "tls" / "key.pem"),
        "DTN_ACME_ROOT": str(root / "acme"),
        "DTN_DATASETS_DIR": str(datasets),
        "DTN_PYODIDE_DIR": str(PYODIDE_DIR),
    }
    lines = []
    for line in (DEPLOY / "dtn.env.example").read_text().splitlines():
        key, equals, value = line.partition("=")
        if equals and not line.startswith("#"):
            lines.append(f"{key}={edits.pop(key, value).replace('/var/lib/dtn', str(root / 'var'))}")
    env_file = root / "dtn.env"
    env_file.write_text("\n".join([*lines, *(f"{key}={value}" for key, value in edits.items())]) + "\n")
    self_signed_certificate(root / "tls" / "cert.pem", root / "tls" / "key.pem")
    site = root / "sites" / "dtn.conf"
    render(env_file, site, root / "units")
    servers = re.findall(r"^\s*server (\S+);$", site.read_text().split("upstream dtn_edge {")[1].split("}")[0], re.M)
    assert servers == upstreams, site.read_text()
    conf = root / "nginx" / "nginx.conf"
    conf.parent.mkdir()
    conf.write_text(standalone_nginx_conf(site, conf.parent))
    return conf, f"https://127.0.0.1:{https}"


def _nginx() -> str:
    """nginx's path, where it and openssl are installed."""
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if nginx is None or shutil.which("openssl") is None:
        missing("nginx and openssl are needed (make setup: apt-get install nginx openssl)")
    return nginx


def _behind_nginx(
    fleet: Fleet, root: Path, dataset_root: Path, monkeypatch: pytest.MonkeyPatch, **shared: object
) -> tuple[dict[str, str], str]:
    """Edges ``a`` and ``b`` on the ``shared`` settings behind a started nginx whose certificate this
    process's httpx trusts (``SSL_CERT_FILE``); the edges' URLs and nginx's public URL."""
    nginx = _nginx()
    urls = {name: start_edge(fleet, name, root, dataset_root, **shared) for name in ("a", "b")}
    conf, public_url = _nginx_site(root, [url.removeprefix("http://") for url in urls.values()], dataset_root)
    fleet.start("nginx", [nginx, "-c", str(conf), "-p", str(conf.parent)])
    monkeypatch.setenv("SSL_CERT_FILE", str(root / "tls" / "cert.pem"))
    fleet.wait_ready(f"{public_url}/livez", 20)  # through nginx (SSL_CERT_FILE: its certificate)
    return urls, public_url


def test_two_edges_behind_nginx_a_browser_and_a_native_trainer_go_on_when_the_browsers_edge_dies(
    tmp_path: Path, dataset_root: Path, private_postgres: Any, private_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _nginx()
    if (problem := browser_problem()) is not None:
        missing(problem)
    local = prepare_network(tmp_path, datasets=dataset_root)
    spec = local.network.experiment(BASELINE)
    shared = {
        "store-url": private_postgres.create_database("behind_nginx"),
        "redis-url": private_redis.url,
        "blobs-dir": tmp_path / "blobs",
        "accel-prefix": "/_shards/",
        "pyodide-dir": PYODIDE_DIR,
    }
    with Fleet(tmp_path) as fleet:
        urls, public_url = _behind_nginx(fleet, tmp_path, dataset_root, monkeypatch, **shared)
        tls = ssl.create_default_context(cafile=str(tmp_path / "tls" / "cert.pem"))
        edges = {name: httpx.Client(base_url=url, timeout=30) for name, url in urls.items()}

        # the browser contributes on the public URL; its relay WebSocket lands on one edge (its home)
        fleet.start(
            "chromium",
            [
                str(CHROMIUM),
                *CHROMIUM_FLAGS,
                "--ignore-certificate-errors",  # nginx's certificate is self-signed
                f"--user-data-dir={tmp_path / 'chromium'}",
                f"{public_url}/?contribute=1&experiment={BASELINE}",
            ],
        )
        until("the browser joined the relay", lambda: any(browsers(http) for http in edges.values()), 120, fleet=fleet)
        home = next(name for name, http in edges.items() if browsers(http))
        other = next(name for name in edges if name != home)
        survivor = edges[other]
        identity = NodeIdentity.load_or_create(local.validator_storage.identity_path)

        def lineage() -> list[dict[str, Any]]:
            return list(survivor.get(f"{BASE}/heads").json())

        def candidates() -> set[str]:  # as the validator reads them: the open window's too
            path = f"{BASE}/candidates"
            proof = PeerProof.for_read(identity, "validator", path, now_ms())
            return {c["candidate_id"] for c in survivor.get(path, headers={READ_PROOF_HEADER: proof}).json()}

        def verdicts() -> list[dict[str, Any]]:
            return list(survivor.get(f"{BASE}/verdicts").json())

        with validating(local, urls[other], [spec]):  # the validator on the other edge, directly
            trainer = mnist_trainer(local.network, tmp_path / "trainer", public_url)
            trainer_id = str(trainer.peer_id)

            def browser_accepted(heads: set[str] | None = None) -> list[dict[str, Any]]:
                return [
                    v
                    for v in verdicts()
                    if v["peer_id"] != trainer_id and v["accepted"] and (heads is None or v["head_id"] in heads)
                ]

            stop = threading.Event()
            outcomes: list[WindowOutcome] = []
            thread = threading.Thread(
                target=lambda: outcomes.extend(trainer.run([trainer.experiment(*BASELINE.parts)], stop=stop, poll_s=1)),
                daemon=True,
            )
            thread.start()
            try:
                # windows through nginx: the browser's candidates merged, its edge taking native requests too
                def trained_together() -> bool:
                    served = metric(edges[home], "dtn_leases_total") + metric(edges[home], "dtn_candidates_total")
                    return len(lineage()) >= 3 and served > 0 and bool(browser_accepted())

                until(
                    "the browser and the native trainer merged through both edges", trained_together, 150, fleet=fleet
                )
                before_heads, before_candidates = lineage(), candidates()
                killed = fleet.processes[home]
                killed.kill()  # SIGKILL: no graceful shutdown, its connections just vanish
                assert killed.wait(10) < 0
                fleet.stop(home)

                def browser_merged_after_the_kill() -> bool:
                    later = {h["head_id"] for h in lineage()[len(before_heads) :]}
                    return len(later) >= 2 and browsers(survivor) >= 1 and bool(browser_accepted(later))

                until(
                    "the browser back on the other edge, merged again", browser_merged_after_the_kill, 150, fleet=fleet
                )
            finally:
                stop.set()
                thread.join(60)
            assert not thread.is_alive()
            published = {str(o.candidate_id) for o in outcomes}

            def judged() -> set[str]:
                return {
                    v["candidate_id"] for v in survivor.get(f"{BASE}/verdicts", params={"peer_id": trainer_id}).json()
                }

            until("a verdict on every published candidate", lambda: published <= judged(), 30, fleet=fleet)
            trainer.close()
        after_heads, after_candidates = lineage(), candidates()
        all_verdicts = verdicts()
        with httpx.Client(base_url=public_url, verify=tls, timeout=30) as http:  # through nginx, on the survivor
            leases = {h["head_id"]: http.get(f"{BASE}/leases", params={"base_head": h["head_id"]}) for h in after_heads}
        for http in edges.values():
            http.close()

    # training went on through nginx after the kill, on heads promoted after it, by both trainers
    assert len(after_heads) >= len(before_heads) + 2
    later = {h["head_id"] for h in after_heads[len(before_heads) :]}
    assert len({o.base_head_id for o in outcomes} & later) >= 1
    browser_ids = {v["peer_id"] for v in all_verdicts} - {trainer_id}
    assert len(browser_ids) == 1, browser_ids  # one browser identity, before and after its reconnect
    assert any(v["accepted"] and v["head_id"] in later for v in all_verdicts if v["peer_id"] in browser_ids)
    # nothing acknowledged before the kill is lost: the lineage before it is a prefix, chained
    assert [h["head_id"] for h in after_heads[: len(before_heads)]] == [h["head_id"] for h in before_heads]
    for parent, child in itertools.pairwise(after_heads):
        assert child["parent"] == parent["head_id"] and child["window"] == parent["window"] + 1
    assert before_candidates and before_candidates <= after_candidates
    assert published and published <= after_candidates
    # every candidate the native trainer published was judged; accepted ones are in the head their verdict names
    by_candidate = {v["candidate_id"]: v for v in all_verdicts}
    assert published <= by_candidate.keys()
    accepted = [v for v in all_verdicts if v["accepted"]]
    heads = {h["head_id"]: h for h in after_heads}
    assert all(v["candidate_id"] in heads[v["head_id"]]["merged"] for v in accepted)
    # no shard leased twice in any window (its leases: those granted on its head and, ahead, on its parent)
    granted = {head_id: answer.json() for head_id, answer in leases.items() if answer.status_code == 200}
    assert granted.keys() == leases.keys(), {h: a.text for h, a in leases.items() if a.status_code != 200}
    for head in after_heads:
        mine = [*granted[head["head_id"]], *granted.get(head["parent"], [])]
        shards = [shard for lease in mine if lease["window"] == head["window"] for shard in lease["shard_ids"]]
        assert len(shards) == len(set(shards)), f"a shard was leased twice in window {head['window']}"


CHUNK = 32 * 1024  # below this model's artifacts (heads about 400 kB, int8 candidates 100 kB): all are staged


class _KillsTheStagesEdge(httpx.HTTPTransport):
    """Below a client of nginx: just before the third chunk it sends, SIGKILLs the edge that holds the
    stage (the one nginx chose for it), so the rest of the upload lands on the other edge."""

    def __init__(self, fleet: Fleet, edges: dict[str, httpx.Client], **options: Any) -> None:
        super().__init__(**options)
        self.fleet, self.edges, self.chunks = fleet, edges, 0
        self.killed: str | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            self.chunks += 1
            if self.chunks == 3:
                self.killed = next(n for n, http in self.edges.items() if metric(http, "dtn_staged_upload_bytes"))
                self.fleet.processes[self.killed].kill()
                assert self.fleet.processes[self.killed].wait(10) < 0
        return super().handle_request(request)


def _judged_without_statistics(validator_key: bytes) -> NetworkManifest:
    """The demo's network with ``BASELINE`` judged by the ``minimal`` preset: a candidate is refused for
    what its bytes are (undecodable, wrong shape, not finite), never for a holdout's or a lease's noise."""
    network = mnist_network(validator_key)
    return replace(
        network,
        experiments=tuple(replace(e, screening="minimal") if e.key == BASELINE else e for e in network.experiments),
    )


def test_staged_uploads_through_nginx_meet_one_edge_and_start_again_on_the_other_when_it_dies(
    tmp_path: Path, dataset_root: Path, private_postgres: Any, private_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A native trainer and validator through nginx over two edges, in chunks of 32 KiB: genesis, every
    candidate, head and outer state is staged and published on one edge (round robin would send its
    chunks to both, which the edges refuse with 409s). The edge holding a candidate's stage dies after
    two chunks: the trainer finds no stage on the other edge, stages it there from 0 and publishes it."""
    _nginx()
    local = prepare_network(tmp_path, datasets=dataset_root, network=_judged_without_statistics)
    spec = local.network.experiment(BASELINE)
    shared = {
        "store-url": private_postgres.create_database("staged_behind_nginx"),
        "redis-url": private_redis.url,
        "blobs-dir": tmp_path / "blobs",
    }
    with Fleet(tmp_path) as fleet, contextlib.ExitStack() as opened:  # closed even when an assertion fails
        urls, public_url = _behind_nginx(fleet, tmp_path, dataset_root, monkeypatch, **shared)
        edges = {name: opened.enter_context(httpx.Client(base_url=url, timeout=30)) for name, url in urls.items()}
        validator = local.validator(public_url)
        opened.callback(validator.close)
        trainer = mnist_trainer(local.network, tmp_path / "trainer", public_url)
        opened.callback(trainer.close)
        for client in (validator.edge, trainer.edge):
            client._chunk_bytes = CHUNK  # every artifact of this model is over it: all are staged
        experiment = trainer.experiment(*BASELINE.parts)

        validator.ensure_genesis(spec)
        for _ in range(2):
            outcome = trainer.train_window_once(experiment)
            report = validator.poll(spec)
            assert report is not None and report.head.merged == (outcome.candidate_id,), report
            assert report.head.outer_state is not None
        # every chunk met its stage, every publish found it: no upload refused on either edge
        for http in edges.values():
            assert metric(http, "dtn_rejected_uploads_total") == 0 and metric(http, "dtn_staged_upload_bytes") == 0
        assert sum(metric(http, "dtn_candidates_total", via="http") for http in edges.values()) == 2

        killer = _KillsTheStagesEdge(
            fleet, edges, verify=ssl.create_default_context(cafile=str(tmp_path / "tls" / "cert.pem"))
        )
        trainer.edge._http.close()
        trainer.edge._clients[0] = httpx.Client(base_url=public_url, transport=killer, timeout=30)
        outcome = trainer.train_window_once(experiment)
        assert killer.killed is not None
        fleet.stop(killer.killed)
        survivor = edges[next(name for name in edges if name != killer.killed)]
        report = validator.poll(spec)
        assert report is not None and report.head.merged == (outcome.candidate_id,), report
        # the survivor refused the third chunk (its stage was on the dead edge) and took the whole artifact
        assert metric(survivor, "dtn_rejected_uploads_total", error="Conflict") == 1
        assert metric(survivor, "dtn_staged_upload_bytes") == 0
        heads = [h["head_id"] for h in survivor.get(f"{BASE}/heads").json()]
    assert len(heads) == 4 and heads[-1] == report.head.head_id
