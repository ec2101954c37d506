"""Update codecs in one run: bytes per candidate and final test accuracy, fp16 and int8 vs fp32.

The same federated run is repeated once per codec, from the same seeds: ``--peers`` trainers (the
browser's NumPy trainer, Adam 2e-3, batch 64, each keeping its optimizer state) train one epoch on
``--shards`` fresh MNIST shards per window, encode their update with the codec (error feedback kept
per peer, as trainers do), and the merge is the example-weighted mean of the decoded parameters
(FedAvg), as a validator merges an honest window. Prints per codec: bytes per candidate and its
ratio to fp32, final test accuracy and its difference to fp32.

    python -m benchmarks.update_codecs [--windows 12 --peers 4 --shards 2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from browser_peer.numpy_trainer import Adam, train_epoch
from datasets import mnist
from datasets.layout import load_split
from native_peer.models import builtin_model
from protocol.aggregation import merge_params
from protocol.batches import make_batches
from protocol.codec import encode_tensors
from protocol.model import Params, evaluate, init_params
from protocol.shards import decode_shard
from protocol.updates import CODECS, decode_update, encode_update

REPO = Path(__file__).resolve().parent.parent
SPEC = builtin_model("mnist-mlp")


def run(codec: str, shards: list[tuple[np.ndarray, np.ndarray]], args: argparse.Namespace) -> tuple[float, float]:
    """Final test accuracy and mean artifact bytes of one federated run with ``codec``."""
    head: Params = init_params(SPEC, 0)
    optimizers = [Adam(2e-3) for _ in range(args.peers)]
    residuals: list[Params | None] = [None] * args.peers
    sizes = []
    for window in range(args.windows):
        candidates = []
        for peer in range(args.peers):
            x, y = shards[(window * args.peers + peer) % len(shards)]
            xb, yb = make_batches(x, y, 64, window * 1000 + peer)
            trained, _ = train_epoch(SPEC, {k: v.copy() for k, v in head.items()}, optimizers[peer], xb, yb)
            tensors, residuals[peer] = encode_update(SPEC, head, trained, codec, residuals[peer])
            artifact = encode_tensors(tensors)
            sizes.append(len(artifact))
            candidates.append((f"{peer}", decode_update(SPEC, head, tensors, codec), float(len(x))))
        head = merge_params(SPEC, head, candidates)
    test_x, test_y = load_split(REPO / "var/datasets/mnist", "test")
    return evaluate(SPEC, head, test_x, test_y)["accuracy"], float(np.mean(sizes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--shards", type=int, default=2, help="shards per peer per window")
    args = parser.parse_args()
    manifest = mnist.prepare(REPO / "var/datasets")
    raw = [decode_shard((REPO / "var/datasets/mnist/train" / e.locator).read_bytes()) for e in manifest.shards]
    per = args.shards
    shards = [
        (np.concatenate([x for x, _ in raw[i : i + per]]), np.concatenate([y for _, y in raw[i : i + per]]))
        for i in range(0, len(raw) - per + 1, per)
    ]
    results = {}
    for codec in CODECS:
        started = time.perf_counter()
        results[codec] = run(codec, shards, args)
        accuracy, size = results[codec]
        print(f"  {codec}: {args.windows} windows x {args.peers} peers in {time.perf_counter() - started:.1f} s")
    base_accuracy, base_size = results["fp32"]
    print(f"update codecs ({args.windows} windows, {args.peers} peers, {per} shards each, FedAvg, same seeds):")
    print("codec  bytes/candidate  vs fp32  test accuracy  vs fp32 (points)")
    for codec, (accuracy, size) in results.items():
        print(
            f"{codec:<6} {size:>15,.0f}  {size / base_size:>7.3f}  {accuracy:>13.4f}  "
            f"{100 * (accuracy - base_accuracy):>+8.2f}"
        )


if __name__ == "__main__":
    main()
