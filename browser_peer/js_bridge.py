"""The browser host: the only module that imports ``js`` and ``pyodide``.

It implements ``bridge.Bridge`` with ``pyfetch`` and the worker's ``WebSocket``, posts status
objects to the page with ``postMessage``, and exposes ``start(config)`` for ``static/worker.js``.
Heads from peers go through the page, which owns the WebRTC connections (``static/head_sharing.js``;
the worker's ``dtnFetchHead``, ``dtnKeepHead`` and ``dtnNextSignal`` carry the requests).
Only plain data crosses the boundary: JSON-like dicts, strings and byte arrays.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsException, create_proxy, to_js  # type: ignore[import-not-found]
from pyodide.http import pyfetch  # type: ignore[import-not-found]

from protocol.ice import IceConfig
from protocol.model import ModelSpec

from .bridge import HttpAnswer, PeerBytes, SocketClosed
from .kernels import Kernels
from .numpy_trainer import Backend, fastest_backend
from .parts import PartRunner
from .peer import BrowserPeer, PeerConfig
from .throughput import samples_per_s

__all__ = ["JsBridge", "benchmark", "guide_parts", "run_part", "start"]


class JsSocket:
    def __init__(self, url: str) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._opened: asyncio.Future[None] = asyncio.get_event_loop().create_future()
        self._closed: tuple[int, str] | None = None
        self._ws = js.WebSocket.new(url)
        self._ws.binaryType = "arraybuffer"
        self._proxies = [
            create_proxy(self._on_open),
            create_proxy(self._on_message),
            create_proxy(self._on_close),
        ]
        self._ws.onopen, self._ws.onmessage, self._ws.onclose = self._proxies

    def _on_open(self, _event: Any) -> None:
        if not self._opened.done():
            self._opened.set_result(None)

    def _on_message(self, event: Any) -> None:
        data = event.data
        self._queue.put_nowait(data if isinstance(data, str) else bytes(js.Uint8Array.new(data).to_py()))

    def _on_close(self, event: Any) -> None:
        self._closed = (int(event.code), str(event.reason))
        if not self._opened.done():
            self._opened.set_exception(SocketClosed(*self._closed))
        self._queue.put_nowait(None)

    async def opened(self) -> JsSocket:
        await self._opened
        return self

    async def send_text(self, text: str) -> None:
        self._ws.send(text)

    async def send_bytes(self, data: bytes) -> None:
        self._ws.send(to_js(memoryview(data)))

    async def recv(self) -> str | bytes:
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)
            raise SocketClosed(*(self._closed or (1006, "closed")))
        return item  # type: ignore[no-any-return]

    async def close(self) -> None:
        if self._closed is None:
            self._ws.close(1000, "bye")
        for proxy in self._proxies:
            proxy.destroy()


class JsBridge:
    def __init__(self, shares_heads: bool = False) -> None:
        self.shares_heads = shares_heads  # the page has WebRTC (static/app.js says so at start)

    async def request(self, method: str, url: str, headers: dict[str, str], body: bytes | None = None) -> HttpAnswer:
        options = {} if body is None else {"body": to_js(body)}
        response = await pyfetch(url, method=method, headers=headers, **options)  # OSError when it fails
        try:  # the body read here: pyfetch's ``bytes()`` fails with AttributeError when the transfer breaks
            answer = (await response.js_response.arrayBuffer()).to_bytes()
        except JsException as exc:  # the edge went away mid-body: a failed transfer like any other
            raise OSError(f"{method} {url}: {exc}") from None
        return HttpAnswer(response.status, {name.lower(): value for name, value in response.headers.items()}, answer)

    async def connect(self, url: str) -> JsSocket:
        return await JsSocket(url).opened()

    def post_status(self, status: dict[str, Any]) -> None:
        js.postMessage(to_js({"type": "status", "status": status}, dict_converter=js.Object.fromEntries))

    async def load(self, key: str) -> bytes | None:
        value = await js.dtnLoad(key)  # static/worker.js: IndexedDB
        return None if value is None else bytes(value.to_bytes())

    async def save(self, key: str, data: bytes) -> None:
        await js.dtnSave(key, to_js(data))

    async def shard_keys(self) -> list[str]:
        return [str(key) for key in (await js.dtnShardKeys()).to_py()]  # static/worker.js: IndexedDB or memory

    async def shard_get(self, key: str) -> bytes | None:
        value = await js.dtnShardGet(key)
        return None if value is None else bytes(value.to_bytes())

    async def shard_put(self, key: str, data: bytes) -> bool:
        return bool(await js.dtnShardPut(key, to_js(data)))

    async def shard_delete(self, key: str) -> None:
        await js.dtnShardDelete(key)

    def part_workers(self) -> int:
        return int(js.dtnPartWorkers())  # static/worker.js: the helpers that have loaded the runtime

    async def train_part(self, index: int, payload: bytes) -> bytes:
        return bytes((await js.dtnTrainPart(index, to_js(payload))).to_bytes())

    async def fetch_head(self, head_id: str, holders: list[str], max_bytes: int) -> PeerBytes | None:
        sent = await js.dtnFetchHead(head_id, to_js(holders), max_bytes)  # the page tries the holders
        return None if sent is None else PeerBytes(bytes(sent.data.to_bytes()), str(sent.peer_id))

    def keep_head(self, head_id: str, data: bytes) -> None:
        js.dtnKeepHead(head_id, to_js(data))

    def drop_peer(self, peer_id: str, reason: str) -> None:
        self._post({"type": "peer.drop", "peer_id": peer_id, "reason": reason})

    def use_ice(self, ice: IceConfig) -> None:
        self._post({"type": "ice", **ice.to_wire()})  # static/head_sharing.js

    def signal_in(self, peer_id: str, data: dict[str, Any]) -> None:
        self._post({"type": "signal", "peer_id": peer_id, "data": json.dumps(data)})

    async def signal_out(self) -> tuple[str, dict[str, Any]]:
        message = json.loads(await js.dtnNextSignal())
        return str(message["peer_id"]), dict(message["data"])

    @staticmethod
    def _post(message: dict[str, Any]) -> None:
        js.postMessage(to_js(message, dict_converter=js.Object.fromEntries))


def start(
    edge_url: str,
    experiment: str,
    seed_hex: str,
    token: str | None = None,
    shares_heads: bool = False,
    pins: str | None = None,
) -> BrowserPeer:
    """Create the peer and schedule it on Pyodide's event loop; the worker keeps the handle to stop it.
    ``pins``: the validators the page was told to trust, comma-separated keys or fingerprints."""
    pinned = tuple(p.strip() for p in (pins or "").split(",") if p.strip())
    config = PeerConfig(edge_url, experiment, bytes.fromhex(seed_hex), token=token or None, pins=pinned)
    peer = BrowserPeer(JsBridge(shares_heads), config, backend=BACKEND)
    _RUNNING.add(asyncio.ensure_future(peer.run()))
    return peer


def linked_backend() -> Backend:
    """The trainer's backend in this worker: the kernels ``static/worker.js`` linked (``dtnKernels``:
    ``{exports, path}``, exports null where it did not), else the fastest without them; its name says
    which, and why not the kernels."""
    linked = js.dtnKernels
    if linked.exports is not None:  # named by the build linked: wasm-simd, or wasm-simd-fma (decision 0052)
        return dataclasses.replace(fastest_backend(Kernels(linked.exports)), name=str(linked.path))
    backend = fastest_backend()
    return dataclasses.replace(backend, name=f"{backend.name} ({linked.path})")


BACKEND = linked_backend()
_RUNNING: set[asyncio.Future[None]] = set()
_PARTS = PartRunner(BACKEND)  # in a part worker: the parts of windows it trains for the tab's peer


async def run_part(payload: Any) -> Any:
    """Train one encoded ``PartTask`` (a Uint8Array from the tab's peer); the encoded result."""
    return to_js(await _PARTS.run(bytes(payload.to_bytes())))


def guide_parts(paused: str | None, share: float) -> None:
    """The page's guest settings, in a part worker."""
    _PARTS.guest.set_share(share)
    if paused:
        _PARTS.guest.pause(paused)
    else:
        _PARTS.guest.resume()


def benchmark(model: str, batch_size: int, steps: int) -> float:
    """Samples per second training ``model`` (a model spec's wire form as JSON) here
    (``browser_peer.throughput``; the browser benchmark)."""
    return samples_per_s(ModelSpec.from_wire(json.loads(model)), batch_size, steps, BACKEND)
