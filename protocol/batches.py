"""How a window's examples become batches, identically in every trainer.

The shuffle is seeded from the lease id and epoch, so the JAX and NumPy trainers (and a validator
replaying a window) see the same batches from the same lease. The remainder batch is dropped.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

__all__ = ["make_batches", "window_seed"]


def window_seed(lease_id: str, epoch: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{lease_id}/{epoch}".encode()).digest()[:8], "big")


def make_batches(
    x: npt.NDArray[np.generic], y: npt.NDArray[np.integer], batch_size: int, seed: int
) -> tuple[npt.NDArray[np.generic], npt.NDArray[np.integer]]:
    """``x`` and ``y`` shuffled and reshaped to ``[n_batches, batch_size, ...]``."""
    usable = len(x) // batch_size * batch_size
    if usable == 0:
        raise ValueError(f"{len(x)} examples do not fill one batch of {batch_size}")
    order = np.random.default_rng(seed).permutation(len(x))[:usable]
    xs, ys = np.take(x, order, axis=0), np.take(y, order, axis=0)  # whole rows: faster than ``x[order]``
    return xs.reshape(-1, batch_size, *x.shape[1:]), ys.reshape(-1, batch_size, *y.shape[1:])
