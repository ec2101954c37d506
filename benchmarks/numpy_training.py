"""Native baseline for the browser benchmark: the browser's NumPy trainer under CPython.

Trains ``browser_peer.numpy_trainer`` (the code the browser runs) on 4 MNIST shards, batch 64,
Adam, and prints ``{"samples_per_s": ...}``. ``benchmarks/browser.spec.ts`` runs it in the same
run as the browser measurement and prints the ratio.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from browser_peer.numpy_trainer import Adam, train_epoch
from datasets import mnist
from native_peer.models import builtin_model
from protocol.batches import make_batches
from protocol.model import init_params
from protocol.shards import decode_shard

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    datasets = REPO / "var/datasets"
    manifest = mnist.prepare(datasets)
    parts = [decode_shard((datasets / "mnist/train" / e.locator).read_bytes()) for e in manifest.shards[:4]]
    x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    spec = builtin_model("mnist-mlp")
    params, optimizer = init_params(spec, 0), Adam(2e-3)
    xb, yb = make_batches(x, y, 64, 0)
    train_epoch(spec, params, optimizer, xb[:4], yb[:4])  # warm up
    rates = []
    for epoch in range(5):
        xb, yb = make_batches(x, y, 64, epoch)
        started = time.perf_counter()
        params, _ = train_epoch(spec, params, optimizer, xb, yb)
        rates.append(xb.shape[0] * xb.shape[1] / (time.perf_counter() - started))
    print(json.dumps({"samples_per_s": float(np.median(rates))}))


if __name__ == "__main__":
    main()
