"""Near-duplicate updates in one window: a copy of another candidate's update is no work of its own.

Two updates (each θ − its own base) whose cosine is at least ``DUPLICATE_COSINE`` are copies of one
another: independent training on disjoint leases does not come that close (honest updates of one
window are measured far below it: ``docs/results/2026-12-judging.md``), while a copier's jitter
(another peer's update, each coordinate moved by 1 %: cosine 0.99995), a rescaled repeat or a Sybil's
scaled copies of one update are at or near 1. Of each group of copies one is kept, the others are
``near_duplicate``: the group's member of highest lease evidence z (an update fits the lease it was
trained on, a copy fits another peer's; unmeasured counts lowest), ties broken by the window's salted
``tie_keys``, so that neither arrival order nor a ground content id decides.

Linear in the window's candidates (``copies``): each update is count-sketched to ``SKETCH_DIMS`` numbers
(Charikar et al. 2002; a coordinate's bucket and sign drawn from the window's salt), hashed by the signs
of ``BANDS`` × ``BAND_BITS`` random projections of its sketch (SimHash, Charikar 2002) and compared
only with the groups' first members that share one of its bands; the cosine compared is the sketches'
(relative error of 1 − cos about √(2 / ``SKETCH_DIMS``)). A pair at cosine 0.99 shares a band with
probability 0.995, at 0.999 with 1 − 3·10⁻⁶. The salt is unknown to a submitter until the window closes,
so no copy can be shaped to miss every band. Honest updates share a band now and then and are then told
apart by the comparison. A copy blended from several peers' updates is none of theirs and passes here:
the lease evidence is what judges it (``protocol.evidence``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["BANDS", "BAND_BITS", "DUPLICATE_COSINE", "SKETCH_DIMS", "Sketcher", "copies"]

DUPLICATE_COSINE = 0.99  # updates at least this aligned are copies of one another
SKETCH_DIMS = 1024  # the numbers an update is count-sketched to
BANDS = 8  # SimHash bands; a pair is compared when one band's bits are equal
BAND_BITS = 16  # random-projection signs per band


@dataclass(frozen=True)
class Sketcher:
    """A window's count sketch and SimHash planes, drawn from its salt for updates of ``size`` numbers."""

    buckets: npt.NDArray[np.int64]
    signs: npt.NDArray[np.float64]
    planes: npt.NDArray[np.float64]

    @classmethod
    def of(cls, salt: bytes, size: int) -> Sketcher:
        seed = int.from_bytes(hashlib.sha256(b"dtn-near-duplicates\n" + salt).digest()[:8], "big")
        rng = np.random.default_rng(seed)
        buckets = rng.integers(0, SKETCH_DIMS, size, dtype=np.int64)
        signs = rng.choice(np.array([-1.0, 1.0]), size)
        return cls(buckets, signs, rng.standard_normal((BANDS * BAND_BITS, SKETCH_DIMS)))

    def sketch(self, delta: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
        """The count sketch of one update, scaled to norm 1 (zero stays zero)."""
        if len(delta) != len(self.buckets):
            raise ValueError(f"an update of {len(delta)} numbers, the sketch is for {len(self.buckets)}")
        s = np.bincount(self.buckets, weights=self.signs * np.asarray(delta, np.float64), minlength=SKETCH_DIMS)
        norm = float(np.linalg.norm(s))
        return np.asarray(s / norm if norm > 0 else s, np.float64)

    def bands(self, sketch: npt.NDArray[np.float64]) -> list[tuple[int, bytes]]:
        """The sketch's ``BANDS`` band keys: (band, its ``BAND_BITS`` projection signs)."""
        bits = (self.planes @ sketch > 0).reshape(BANDS, BAND_BITS)
        return [(band, np.packbits(row).tobytes()) for band, row in enumerate(bits)]


def copies(
    sketcher: Sketcher, deltas: Iterable[npt.NDArray[np.floating]], order: Sequence[int]
) -> dict[int, tuple[int, float]]:
    """The copies among ``deltas`` (read once, each sketched as it comes: a window's updates need not
    be held together): for each that is one, the index of the update it copies and their cosine.
    ``order`` ranks the indices (a permutation of them): of a group of copies the first in it is kept
    and is what the later ones are compared with. Zero updates are nobody's copy."""
    sketches = [sketcher.sketch(d) for d in deltas]
    buckets: dict[tuple[int, bytes], list[int]] = {}
    found: dict[int, tuple[int, float]] = {}
    for i in order:
        if not sketches[i].any():
            continue
        keys = sketcher.bands(sketches[i])
        match = _first_copied(sketches, i, {kept for key in keys for kept in buckets.get(key, ())})
        if match is not None:
            found[i] = match
            continue
        for key in keys:
            buckets.setdefault(key, []).append(i)
    return found


def _first_copied(sketches: Sequence[npt.NDArray[np.float64]], i: int, kept: set[int]) -> tuple[int, float] | None:
    """Of the kept updates ``kept`` (sharing a band with update ``i``), the first in index order that
    ``i`` copies, with their cosine."""
    for j in sorted(kept):
        cosine = float(sketches[i] @ sketches[j])
        if cosine >= DUPLICATE_COSINE:
            return j, cosine
    return None
