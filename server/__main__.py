"""``python -m server``: run the edge with uvicorn (``--help`` lists every setting)."""

from __future__ import annotations

import logging
from pathlib import Path

from .serve import EdgeServer, bind_unix_socket
from .settings import Settings


def main(argv: list[str] | None = None) -> None:
    settings = Settings.from_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = EdgeServer(settings)
    if not settings.unix_socket:
        server.run()
        return
    # host:port (validators, Prometheus) and the unix socket (the proxy on this host), one server
    # (uvicorn ends the process with the signal that stopped it: a socket file left behind is replaced
    # at the next start, and systemd removes its RuntimeDirectory)
    sockets = [server.config.bind_socket(), bind_unix_socket(Path(settings.unix_socket))]
    logging.getLogger(__name__).info("listening on %s too", settings.unix_socket)
    server.run(sockets=sockets)


if __name__ == "__main__":
    main()
