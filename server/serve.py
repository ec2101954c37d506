"""Running the edge under uvicorn: in the foreground (``python -m server``) or in a background
thread on a pre-bound socket (``BackgroundEdge``: embedding, tests and benchmarks)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import replace
from types import TracebackType

import uvicorn

from .app import create_app
from .connections import guarded_http, limits_from
from .settings import Settings

__all__ = ["BackgroundEdge", "uvicorn_config"]


def uvicorn_config(settings: Settings, **overrides: object) -> uvicorn.Config:
    options: dict[str, object] = {
        "host": settings.host,
        "port": settings.port,
        "ws": "websockets-sansio",
        "ws_max_size": settings.max_frame_bytes,
        "ws_ping_interval": 20.0,
        "ws_ping_timeout": 20.0,
        "http": guarded_http(limits_from(settings)),
        "timeout_keep_alive": 5,
        "log_level": "info",
        **overrides,
    }
    return uvicorn.Config(create_app(settings), **options)  # type: ignore[arg-type]


class BackgroundEdge:
    """An edge serving in a daemon thread; ``url`` is ready when ``start()`` returns."""

    def __init__(self, settings: Settings, *, startup_timeout_s: float = 20.0) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((settings.host, settings.port))
        self.settings = replace(settings, port=self._socket.getsockname()[1])
        self.url = f"http://{self.settings.host}:{self.settings.port}"
        self._server = uvicorn.Server(uvicorn_config(self.settings, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)
        self._startup_timeout_s = startup_timeout_s

    def start(self) -> BackgroundEdge:
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("edge failed to start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()

    def __enter__(self) -> BackgroundEdge:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
