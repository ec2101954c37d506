"""``dtn``: the native peer's commands (``native_peer.cli``: train, validate, keys, dataset, export, control),
``dtn workload check`` (``tools.workload_check``: a model checked before a network trains it, the
browser's NumPy twin included) and ``dtn lineage export | import`` (``tools.cli``: an edge store's
lineage as one verifiable archive), which needs the edge's packages (the ``server`` extra) and runs
where the edge's store is."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["lineage"]:
        from .cli import main as tools_main  # the edge's packages: only for this command

        tools_main(args)
        return
    if args[:1] == ["workload"]:
        from .workload_check import main as workload_main

        workload_main(args[1:])
        return
    from native_peer.cli import main as peer_main

    peer_main(args)
