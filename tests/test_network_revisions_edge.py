"""Network revisions at a real edge (issue #24 item 3): a real uvicorn edge on a 2-of-3 network with
SQLite and real Ed25519 signatures. The route refuses every revision that is not the next one of a
quorum of the validators before it, or that does not fit what the edge serves, with its status and
reason; an applied revision is served, published and kept across a restart; a change of validators
applies only at the heads it hands over at; the CLI writes, signs offline and submits one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from native_peer.cli import main as dtn
from native_peer.edge_client import EdgeClient
from native_peer.export import best_head
from native_peer.network_chain import NetworkChain
from native_peer.storage import StorageConfig
from protocol.ids import ExperimentKey
from protocol.manifests import NetworkManifest
from protocol.messages import Attestation, HeadDescriptor
from protocol.network_pins import NetworkSignature, fingerprint
from protocol.network_revisions import NetworkRevision, SignedNetworkRevision
from protocol.signing import PureSigner, b64encode
from server.revision_routes import MAX_REVISION_BYTES
from server.serve import BackgroundEdge
from server.settings import Settings

from .support import EXPERIMENT, edge_settings, experiment_spec, head_envelope, proof

A, B, C, D = (PureSigner(bytes([n]) * 32) for n in (71, 72, 73, 74))
TRAINER = PureSigner(b"\x75" * 32)
ADDED = experiment_spec(ExperimentKey.parse("study/added/rev-1"))
NETWORK = NetworkManifest("revised-net", (A.public_key, B.public_key, C.public_key), (experiment_spec(),), quorum=2)
REVISIONS = "/v1/network/revisions"


@pytest.fixture
def settings(tmp_path: Path, dataset_root: Path) -> Settings:
    (tmp_path / "network.json").write_text(json.dumps(NETWORK.to_wire()))
    return edge_settings(tmp_path, dataset_root)


@contextmanager
def _edge(settings: Settings) -> Iterator[httpx.Client]:
    with BackgroundEdge(settings) as edge, httpx.Client(base_url=edge.url, timeout=10) as client:
        yield client


def _genesis(http: httpx.Client) -> HeadDescriptor:
    """The genesis of ``EXPERIMENT``, proposed by A and attested by B: canonical."""
    head, body = head_envelope(signer=A)
    assert http.post(f"/v1/experiments/{EXPERIMENT}/heads", content=body).status_code == 202
    attestation = Attestation.of(head, (), B, 1)
    assert http.post(f"/v1/experiments/{EXPERIMENT}/attestations", json=attestation.to_wire()).status_code == 201
    return head


def _served(http: httpx.Client) -> NetworkManifest:
    return NetworkManifest.from_wire(http.get("/v1/network").json())


def _refused(response: httpx.Response, status: int, error: str, reason: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"] == error
    assert reason in response.json()["detail"], response.json()["detail"]


def _submit(http: httpx.Client, signed: SignedNetworkRevision | object) -> httpx.Response:
    return http.post(REVISIONS, json=signed.to_wire() if isinstance(signed, SignedNetworkRevision) else signed)


def test_a_revision_not_a_quorums_or_not_the_next_or_not_fitting_is_refused_with_its_reason(
    settings: Settings,
) -> None:
    with _edge(settings) as http:
        network = _served(http)
        added = NetworkRevision.of(network, 1_000, experiments=[ADDED])
        _refused(_submit(http, SignedNetworkRevision.of(added, [A])), 401, "SignatureError", "signed by 1 validator")
        _refused(_submit(http, {"revision": added.body()}), 400, "InvalidMessage", "signatures")
        oversize = http.post(REVISIONS, content=b" " * (MAX_REVISION_BYTES + 1))
        _refused(oversize, 413, "TooLarge", "exceeds")
        gap = NetworkRevision.of(network.__class__(**{**network.__dict__, "revision": 1}), 1, experiments=[ADDED])
        _refused(_submit(http, SignedNetworkRevision.of(gap, [A, B])), 409, "Conflict", "does not follow revision 0")
        nowhere = experiment_spec(ExperimentKey.parse("study/nowhere/rev-1"), dataset_id="not-served")
        unserved = NetworkRevision.of(network, 1_000, experiments=[nowhere])
        _refused(_submit(http, SignedNetworkRevision.of(unserved, [A, B])), 409, "Conflict", "does not serve")
        again = NetworkRevision.of(network, 1_000, experiments=[experiment_spec()])
        _refused(_submit(http, SignedNetworkRevision.of(again, [A, B])), 400, "InvalidMessage", "never changed")
        assert http.get(REVISIONS).json() == [] and _served(http).revision == 0

        with connect(f"{str(http.base_url).replace('http', 'ws', 1)}/v1/events") as events:
            applied = _submit(http, SignedNetworkRevision.of(added, [B, C]))
            assert applied.status_code == 201, applied.text
            while (event := json.loads(events.recv(timeout=5)))["topic"] != "network":
                pass
        assert event["data"]["revision"]["number"] == 1
        assert sorted(event["data"]["signers"]) == sorted(fingerprint(s.public_key) for s in (B, C))
        _refused(_submit(http, SignedNetworkRevision.of(added, [A, B])), 409, "Conflict", "holds network revision 1")
        served = _served(http)
        assert served.revision == 1 and served.experiment(ADDED.key) == ADDED and served.edge_key == network.edge_key
        assert [e["spec"]["key"] for e in http.get("/v1/experiments").json()] == [str(EXPERIMENT), str(ADDED.key)]
        assert http.get("/v1/activity").json()["network_revision"] == 1
        lease = http.post(f"/v1/experiments/{ADDED.key}/leases", json=proof(TRAINER, "lease"))
        _refused(lease, 404, "NotFound", "has no head yet (waiting for the validator's genesis)")  # not "no experiment"
        # the validators' signatures over the first terms verify no more; over the new ones they are kept
        assert http.get("/v1/network/signatures").json() == []
        assert http.post("/v1/network/signatures", json=NetworkSignature.of(served, A).to_wire()).status_code == 200
    with _edge(settings) as http:  # restarted on its store: the revision applied again, in the chain
        assert _served(http) == served
        (held,) = http.get(REVISIONS).json()
        assert SignedNetworkRevision.from_wire(held) == SignedNetworkRevision.of(added, [B, C])
        assert len(http.get("/v1/network/signatures").json()) == 1


def test_a_change_of_validators_applies_only_at_the_heads_it_hands_over_at(settings: Settings) -> None:
    with _edge(settings) as http:
        network = _served(http)
        keys = (A.public_key, B.public_key, D.public_key)  # C replaced by D
        early = NetworkRevision.of(network, 1_000, validator_keys=keys)  # written before the genesis
        genesis = _genesis(http)
        _refused(_submit(http, SignedNetworkRevision.of(early, [A, B])), 409, "Conflict", "over at no head")
        change = NetworkRevision.of(network, 2_000, validator_keys=keys, heads={EXPERIMENT: genesis})
        _refused(_submit(http, SignedNetworkRevision.of(change, [A, D])), 401, "SignatureError", "signed by 1")
        assert _submit(http, SignedNetworkRevision.of(change, [A, C])).status_code == 201
        served = _served(http)
        assert served.validator_key_set == frozenset(keys) and served.revision == 1
        # the next head needs the new validators: C's attestation counts no more, D's does
        head, body = head_envelope(signer=A, parent=genesis.head_id, window=1)
        assert http.post(f"/v1/experiments/{EXPERIMENT}/heads", content=body).status_code == 202
        by_c = Attestation.of(head, (), C, 2).to_wire()
        assert http.post(f"/v1/experiments/{EXPERIMENT}/attestations", json=by_c).status_code == 401
        by_d = Attestation.of(head, (), D, 2).to_wire()
        assert http.post(f"/v1/experiments/{EXPERIMENT}/attestations", json=by_d).status_code == 201
        assert http.get(f"/v1/experiments/{EXPERIMENT}/head").json()["head_id"] == head.head_id


def test_export_checks_each_head_against_the_validators_of_its_era(settings: Settings, tmp_path: Path) -> None:
    """``dtn export --network <first manifest> --edge``: the revisions since that manifest are followed,
    so a head from before a change of validators (A and C) and one after it (A and D) both verify, and
    the better one is written (against the first manifest alone, the later head was refused)."""
    with _edge(settings) as http:
        genesis, body = head_envelope(signer=A, metrics={"val_loss": 0.9})
        assert http.post(f"/v1/experiments/{EXPERIMENT}/heads", content=body).status_code == 202
        by_c = Attestation.of(genesis, (), C, 1).to_wire()
        assert http.post(f"/v1/experiments/{EXPERIMENT}/attestations", json=by_c).status_code == 201
        keys = (A.public_key, B.public_key, D.public_key)  # C replaced by D, handed over at the genesis
        change = NetworkRevision.of(_served(http), 2_000, validator_keys=keys, heads={EXPERIMENT: genesis})
        assert _submit(http, SignedNetworkRevision.of(change, [A, C])).status_code == 201
        head, body = head_envelope(signer=A, parent=genesis.head_id, window=1, metrics={"val_loss": 0.4})
        assert http.post(f"/v1/experiments/{EXPERIMENT}/heads", content=body).status_code == 202
        by_d = Attestation.of(head, (), D, 2).to_wire()
        assert http.post(f"/v1/experiments/{EXPERIMENT}/attestations", json=by_d).status_code == 201
        export = ["export", "--experiment", str(EXPERIMENT), "--network", str(settings.network)]
        dtn([*export, "--edge", str(http.base_url), "--out", str(tmp_path / "latest")])
        written = json.loads((tmp_path / "latest" / "config.json").read_bytes())
        assert written["head"]["head_id"] == head.head_id  # D's attestation counts in its era
        # the genesis, attested by C, verifies in its era: no head is refused
        client = EdgeClient(str(http.base_url))
        chain = NetworkChain(NETWORK)
        chain.read(client)
        chosen, refused = best_head(client.heads(EXPERIMENT), chain.history(), EXPERIMENT)
        assert chosen.head_id == head.head_id and refused == []
        # checked against the first manifest alone (as before revisions were followed), D's head is refused
        chosen, refused = best_head(client.heads(EXPERIMENT), [NETWORK], EXPERIMENT)
        assert chosen.head_id == genesis.head_id and len(refused) == 1 and head.head_id[:19] in refused[0]
        client.close()


@pytest.fixture
def http(settings: Settings) -> Iterator[httpx.Client]:
    """The edge, started before ``capsys`` captures (a test that starts it while captured leaves pytest's
    own capture closed at teardown when it runs first in its process)."""
    with _edge(settings) as client:
        yield client


def test_the_cli_writes_signs_offline_and_submits_a_revision(
    settings: Settings, http: httpx.Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, seed in (("a", 71), ("c", 73), ("d", 74)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "identity.key").write_bytes(bytes([seed]) * 32)
    spec = tmp_path / "added.json"
    spec.write_text(json.dumps(ADDED.to_wire()))
    network, revision = str(settings.network), tmp_path / "revision.json"
    url = str(http.base_url)
    dtn(["control", "revise", str(revision), "--network", network, "--edge", url, "--add-experiment", str(spec)])
    assert "revision 1 of network revised-net, unsigned: experiments added study/added/rev-1" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="is not a validator of this network"):
        dtn(["control", "sign", str(revision), "--network", network, "--storage", str(tmp_path / "d")])
    copy = tmp_path / "copy.json"
    copy.write_bytes(revision.read_bytes())
    dtn(["control", "sign", str(revision), "--network", network, "--storage", str(tmp_path / "a")])
    dtn(["control", "sign", str(copy), "--network", network, "--storage", str(tmp_path / "c")])
    dtn(["control", "submit", str(revision), str(copy), "--edge", f"{url},{url}"])
    submitted = capsys.readouterr().out
    assert "applied; the network is at revision 1" in submitted and "already applied this one" in submitted
    assert _served(http).experiment(ADDED.key) == ADDED
    # the next one, from the terms the edge serves now: D replaces C, signed offline by A and C
    genesis = _genesis(http)
    change = [
        *("control", "revise", str(revision), "--network", network, "--edge", url),
        *("--add-validator", str(tmp_path / "d"), "--remove-validator", fingerprint(C.public_key)),
    ]
    dtn(change)
    assert "handed over where 1 experiments stand" in capsys.readouterr().out
    written = SignedNetworkRevision.from_wire(json.loads(revision.read_bytes())).revision
    assert [(h.experiment, h.head) for h in written.handover] == [(EXPERIMENT, genesis.head_id)]
    with pytest.raises(SystemExit, match="give --edge to read the revisions since"):
        dtn(["control", "sign", str(revision), "--network", network, "--storage", str(tmp_path / "a")])
    for signer in ("a", "c"):
        sign = ["control", "sign", str(revision), "--network", network, "--storage", str(tmp_path / signer)]
        dtn([*sign, "--edge", url])
    dtn(["control", "submit", str(revision), "--edge", url])
    assert "applied; the network is at revision 2" in capsys.readouterr().out
    dtn(["control", "revisions", "--network", network, "--edge", url])
    shown = capsys.readouterr().out
    assert "1: experiments added study/added/rev-1" in shown and "network revised-net: revision 2" in shown
    assert b64encode(D.public_key) in json.dumps(http.get("/v1/network").json())
    # the new validator signs an order from the same first manifest, the revisions read from the edge
    order = tmp_path / "pause.json"
    dtn(
        [
            "control",
            "new",
            str(order),
            "--network",
            network,
            "--experiment",
            str(EXPERIMENT),
            "--action",
            "pause",
            "--edge",
            url,
        ]
    )
    for signer in ("a", "d"):
        dtn(
            [
                "control",
                "sign",
                str(order),
                "--network",
                network,
                "--storage",
                str(tmp_path / signer),
                "--edge",
                url,
            ]
        )
    dtn(["control", "submit", str(order), "--edge", url])
    assert "applied; the experiment is now" in capsys.readouterr().out


def test_an_edge_that_lost_its_store_is_given_the_revisions_back_as_its_heads_reach_them(
    settings: Settings, tmp_path: Path, dataset_root: Path
) -> None:
    """A validator's chain (``NetworkChain``, kept on disk) gives a replacement edge, started from the
    first manifest, the revisions it lacks: an added experiment at once, a change of validators once
    the edge's heads reach its handover (given back as validators give heads back)."""
    chain_path = StorageConfig(tmp_path / "validator").network_revisions_path
    chain_path.parent.mkdir()
    with _edge(settings) as http:
        added = SignedNetworkRevision.of(NetworkRevision.of(_served(http), 1, experiments=[ADDED]), [A, B])
        assert _submit(http, added).status_code == 201
        genesis = _genesis(http)
        keys = (A.public_key, B.public_key, D.public_key)
        change = NetworkRevision.of(_served(http), 2, validator_keys=keys, heads={EXPERIMENT: genesis})
        assert _submit(http, SignedNetworkRevision.of(change, [A, C])).status_code == 201
        held = NetworkChain.load(NETWORK, chain_path)
        client = EdgeClient(str(http.base_url))
        assert held.read(client) is not None and held.network.revision == 2  # followed, and kept on disk
        client.close()
    replacement = edge_settings(tmp_path / "replacement", dataset_root, network=settings.network)
    with _edge(replacement) as http:
        held = NetworkChain.load(NETWORK, chain_path)  # a validator restarted with the first manifest
        assert held.network.revision == 2
        client = EdgeClient(str(http.base_url))
        try:
            assert held.read(client) is None  # revision 1 given back; 2 waits for the heads
            assert _served(http).revision == 1
            _genesis(http)  # the validators give the genesis back
            followed = held.read(client)
            assert followed is not None and followed.revision == 2 and _served(http).validator_key_set == set(keys)
        finally:
            client.close()
