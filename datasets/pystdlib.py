"""A text corpus that is always there offline: the running Python's standard-library sources.

The ``.py`` files under ``sysconfig.get_path("stdlib")`` (outside ``site-packages``, test folders and
caches), in sorted path order, joined into one byte stream: the same corpus for the same Python
(CPython 3.11: about 730 files, 12 MB). ``prepare`` writes it as the next-token dataset ``pystdlib``
through ``datasets.sources.text_source`` and ``datasets.sharding`` (byte tokens, vocabulary 256).

The held-out splits are a fresh random draw per preparation, as for MNIST: validators of one
network must share one prepared copy (and trainers the train manifest that comes with it).

    python -m datasets.pystdlib --out var/datasets [--context 128] [--max-bytes N]
"""

from __future__ import annotations

import argparse
import logging
import sysconfig
from collections.abc import Mapping
from pathlib import Path

from protocol.ids import DatasetId
from protocol.manifests import FetchManifest

from .sharding import DEFAULT_FRACTIONS, shard, verified_copy
from .sources import text_source

__all__ = ["DATASET_ID", "prepare", "stdlib_sources"]

DATASET_ID = DatasetId("pystdlib")
_SKIPPED = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


def stdlib_sources(root: Path | None = None) -> list[Path]:
    """The corpus's files under ``root`` (default: this interpreter's stdlib), in sorted path order."""
    root = root or Path(sysconfig.get_path("stdlib"))
    files = (p for p in root.rglob("*.py") if not _SKIPPED & set(p.relative_to(root).parts[:-1]))
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def prepare(
    out: Path,
    *,
    context: int = 128,
    max_bytes: int | None = None,
    shard_size: int = 1000,
    fractions: Mapping[str, float] = DEFAULT_FRACTIONS,
) -> FetchManifest:
    """Write the corpus (its first ``max_bytes`` bytes, if given) as ``out/pystdlib``; a no-op when a
    verified copy with the same ``context`` is there."""
    existing = verified_copy(out / DATASET_ID)
    if existing is not None and existing.feature_shape == (context,):
        return existing
    corpus = b"".join(path.read_bytes() for path in stdlib_sources())[:max_bytes]
    source = text_source(corpus, context, "the standard library")
    return shard(source, out, DATASET_ID, fractions=fractions, shard_size=shard_size, force=True).manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("var/datasets"))
    parser.add_argument("--context", type=int, default=128, help="tokens (bytes) per example")
    parser.add_argument("--max-bytes", type=int, default=None, help="use only the corpus's first bytes")
    parser.add_argument("--shard-size", type=int, default=1000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    manifest = prepare(args.out, context=args.context, max_bytes=args.max_bytes, shard_size=args.shard_size)
    print(
        f"{len(manifest.shards)} shards, {sum(s.examples for s in manifest.shards)} examples of {args.context} tokens"
    )


if __name__ == "__main__":
    main()
