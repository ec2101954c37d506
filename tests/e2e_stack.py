"""The stack the browser tests run against: a real edge (uvicorn) and a real validator.

``python -m tests.e2e_stack --port 8765 --out var/e2e`` prepares MNIST, writes a network
manifest, serves the edge with the self-hosted Pyodide runtime, and validates in a thread until
terminated. Started by ``playwright.config.ts``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import threading
from pathlib import Path

from datasets import mnist
from native_peer import StorageConfig, Validator, ValidatorConfig
from native_peer.identity import NodeIdentity
from native_peer.mnist import mlp_learner
from native_peer.networks import demo_network
from server.serve import BackgroundEdge
from server.settings import Settings

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--out", type=Path, default=REPO / "var/e2e")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    shutil.rmtree(args.out, ignore_errors=True)
    datasets = REPO / "var/datasets"
    mnist.prepare(datasets)
    storage = StorageConfig(args.out / "validator")
    network = demo_network(NodeIdentity.load_or_create(storage.identity_path).public_key, "e2e")
    (args.out / "network.json").write_text(json.dumps(network.to_wire()))
    settings = Settings(
        port=args.port,
        data_dir=args.out / "edge",
        datasets_dir=datasets,
        network=args.out / "network.json",
        pyodide_dir=REPO / "var/pyodide",
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with BackgroundEdge(settings) as edge:
        validator = Validator(mlp_learner(), network, storage, edge.url, datasets, ValidatorConfig(poll_s=0.2))
        try:
            validator.run(network.experiments, stop)
        finally:
            validator.close()


if __name__ == "__main__":
    main()
