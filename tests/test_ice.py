"""ICE servers for heads between tabs: the edge settings (checked strictly, the TURN secret read from a
file and never shown), the relay welcome's per-connection TURN credentials (coturn's TURN REST API
scheme: ``tests/test_turn.py`` has a real coturn accept them), their renewal, and a browser peer
handing them to its page."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

import pytest
from websockets.sync.client import ClientConnection, connect

import browser_peer.peer
from browser_peer.peer import BrowserPeer, PeerConfig
from protocol.clock import SystemClock
from protocol.errors import InvalidMessage
from protocol.ice import NO_ICE, IceConfig, ice_urls
from protocol.signing import PureSigner, peer_id_from_public_key
from server.serve import BackgroundEdge
from server.settings import Settings

from .native_bridge import Swarm, SwarmBridge
from .support import EXPERIMENT, edge_settings, experiment_spec, proof, write_network

TURN = "turn:turn.example.org:3478?transport=udp"
SECRET = "a-secret-shared-with-coturn"


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "turn-secret"
    path.write_text(SECRET + "\n")
    return path


def test_ice_server_urls_are_read_strictly() -> None:
    listed = "stun:stun.example.org, turns:[2001:db8::1]:5349?transport=tcp,turn:192.0.2.7,stun:stun.example.org"
    assert ice_urls(listed) == ["stun:stun.example.org", "turns:[2001:db8::1]:5349?transport=tcp", "turn:192.0.2.7"]
    for bad in (
        "turn:user:password@turn.example.org",  # credentials never go in a URL
        "http://turn.example.org",
        "turn:turn.example.org:0",
        "turn:turn.example.org:65536",
        "stun:stun.example.org?transport=udp",  # a transport is TURN's only
        "turn:turn.example.org?transport=sctp",
        "turn:turn.example.org/path",
        "turn:-bad-.example.org",
        "turn:" + "a" * 300,
    ):
        with pytest.raises(InvalidMessage) as refused:
            ice_urls(bad)
        assert "password" not in str(refused.value), bad
    with pytest.raises(InvalidMessage):
        ice_urls(",".join(f"stun:s{i}.example.org" for i in range(17)))


def test_the_ice_settings_go_together_and_the_secret_stays_in_its_file(tmp_path: Path, secret_file: Path) -> None:
    settings = Settings(ice_servers=f"stun:stun.example.org,{TURN}", turn_secret_file=str(secret_file))
    assert SECRET not in repr(settings) and SECRET not in repr(settings.ice)
    assert settings.ice.secret == SECRET.encode()
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for refused, settings_of in (
        ("go together", {"ice_servers": TURN}),
        ("go together", {"ice_servers": "stun:stun.example.org", "turn_secret_file": str(secret_file)}),
        ("ice_relay_only needs", {"ice_servers": "stun:stun.example.org", "ice_relay_only": True}),
        ("cannot be read", {"ice_servers": TURN, "turn_secret_file": str(tmp_path / "absent")}),
        ("one line", {"ice_servers": TURN, "turn_secret_file": str(empty)}),
        (
            "turn_credential_ttl_s",
            {"ice_servers": TURN, "turn_secret_file": str(secret_file), "turn_credential_ttl_s": 10.0},
        ),
        ("ice_servers", {"ice_servers": "turn:user:pw@turn.example.org"}),
    ):
        with pytest.raises(ValueError, match=refused):
            Settings(**settings_of)  # type: ignore[arg-type]
    with pytest.raises(SystemExit):  # the CLI says why and stops
        Settings.from_args(["--ice-servers", TURN])
    parsed = Settings.from_args(["--ice-servers", TURN, "--turn-secret-file", str(secret_file), "--ice-relay-only"])
    assert parsed.ice.relay_only and parsed.ice.urls == (TURN,)


def test_ice_configurations_from_the_network_are_read_strictly() -> None:
    turn = {"urls": [TURN], "username": "1:peer", "credential": "c2VjcmV0"}
    assert IceConfig.from_wire({"servers": [turn], "relay_only": True, "valid_s": 600}).urls == [TURN]
    for hostile in (
        {"servers": [turn] * 5, "relay_only": False, "valid_s": None},
        {"servers": [{"urls": [TURN], "username": "1:peer"}], "relay_only": False, "valid_s": None},
        {"servers": [{"urls": ["javascript:alert(1)"]}], "relay_only": False, "valid_s": None},
        {"servers": [{"urls": []}], "relay_only": False, "valid_s": None},
        {"servers": [{"urls": ["stun:stun.example.org"]}], "relay_only": True, "valid_s": None},
        {"servers": [turn], "relay_only": False, "valid_s": -1},
        {"servers": [turn], "relay_only": False, "valid_s": 1e12},
        {"servers": [{**turn, "credential": "x" * 600}], "relay_only": False, "valid_s": 1},
        {"servers": "turn:x", "relay_only": False, "valid_s": None},
    ):
        with pytest.raises(InvalidMessage):
            IceConfig.from_wire(hostile)


def _join(url: str, signer: PureSigner) -> tuple[ClientConnection, dict[str, object]]:
    ws = connect(url.replace("http", "ws", 1) + "/v1/relay", open_timeout=5, legacy=True)  # closed by the caller
    challenge = json.loads(ws.recv(timeout=5))
    ws.send(json.dumps({"type": "join", "proof": proof(signer, "join", challenge["nonce"], "browser")}))
    welcome = json.loads(ws.recv(timeout=5))
    assert welcome["type"] == "welcome", welcome
    return ws, welcome


def _rest_api_password(username: str) -> str:
    return base64.b64encode(hmac.new(SECRET.encode(), username.encode(), hashlib.sha1).digest()).decode()


def test_each_relay_connection_is_welcomed_with_a_turn_credential_of_its_own(
    tmp_path: Path, dataset_root: Path, secret_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_network(tmp_path / "network.json", experiment_spec())
    ice = {"ice_servers": f"stun:stun.example.org,{TURN}", "turn_secret_file": str(secret_file),
           "turn_credential_ttl_s": 600.0, "ice_relay_only": True}  # fmt: skip
    signers = [PureSigner(bytes([i]) * 32) for i in (1, 2)]
    with BackgroundEdge(edge_settings(tmp_path, dataset_root, **ice)) as edge:
        joined = [_join(edge.url, signer) for signer in signers]
        ws, _ = joined[0]
        ws.send('{"type":"ice"}')
        renewed = json.loads(ws.recv(timeout=5))
        for other, _ in joined:
            other.close()
    for (_, welcome), signer in zip(joined, signers, strict=True):
        config = IceConfig.from_wire(welcome["ice"])
        assert config.relay_only and config.valid_s == 600.0
        stun, turn = config.servers
        assert stun.urls == ("stun:stun.example.org",) and stun.username is None
        assert turn.urls == (TURN,) and turn.username is not None
        expiry, peer = turn.username.split(":")
        assert peer == peer_id_from_public_key(signer.public_key)
        assert abs(int(expiry) - (time.time() + 600)) < 30
        assert turn.credential == _rest_api_password(turn.username)
    assert renewed["type"] == "ice" and IceConfig.from_wire(renewed).servers[1].username.endswith(  # type: ignore[union-attr]
        peer_id_from_public_key(signers[0].public_key)
    )
    assert SECRET not in caplog.text


def test_without_ice_servers_pages_use_host_candidates_only(tmp_path: Path, dataset_root: Path) -> None:
    write_network(tmp_path / "network.json", experiment_spec())
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge:
        ws, welcome = _join(edge.url, PureSigner(b"\x07" * 32))
        ws.close()
    assert IceConfig.from_wire(welcome["ice"]) == NO_ICE


class _Later(SystemClock):
    """The system clock whose monotonic time can be moved ahead (the renewal is due)."""

    ahead_s = 0.0

    def monotonic_s(self) -> float:
        return super().monotonic_s() + self.ahead_s


def test_a_browser_peer_gives_its_page_the_edges_ice_servers_and_renews_them_at_half_their_life(
    tmp_path: Path, dataset_root: Path, secret_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_network(tmp_path / "network.json", experiment_spec())
    monkeypatch.setattr(browser_peer.peer, "HEARTBEAT_S", 0.05)
    ice = {"ice_servers": TURN, "turn_secret_file": str(secret_file), "turn_credential_ttl_s": 600.0}
    bridge = SwarmBridge(Swarm(), "tab")
    clock = _Later()

    async def contribute(url: str) -> None:
        peer = BrowserPeer(bridge, PeerConfig(url, str(EXPERIMENT), b"\x09" * 32), clock=clock)
        task = asyncio.ensure_future(peer.run())
        while len(bridge.ice_given) < 1:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # heartbeats: no renewal before half of 600 s
        assert len(bridge.ice_given) == 1
        clock.ahead_s = 301.0
        while len(bridge.ice_given) < 2:
            await asyncio.sleep(0.02)
        peer.stop()
        await asyncio.wait_for(task, 10)
        await bridge.aclose()

    with BackgroundEdge(edge_settings(tmp_path, dataset_root, **ice)) as edge:
        asyncio.run(asyncio.wait_for(contribute(edge.url), 30))
    for given in bridge.ice_given:
        (turn,) = given.servers
        assert turn.urls == (TURN,) and turn.credential == _rest_api_password(turn.username or "")
    statuses = [s for s in bridge.statuses if "ice_servers" in s]
    assert statuses[-1]["ice_servers"] == [TURN]  # the page may show the URLs, never a credential
    assert all(given.servers[0].credential not in json.dumps(bridge.statuses) for given in bridge.ice_given)
