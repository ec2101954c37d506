"""``python -m server``: run the edge with uvicorn (``--help`` lists every setting)."""

from __future__ import annotations

import logging

import uvicorn

from .serve import uvicorn_config
from .settings import Settings


def main(argv: list[str] | None = None) -> None:
    settings = Settings.from_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.Server(uvicorn_config(settings)).run()


if __name__ == "__main__":
    main()
