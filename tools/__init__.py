"""Operator set-up tools: what an edge host or validator runs once, never on the serving path.

    pyodide_runtime  assemble the self-hosted Pyodide runtime from the package registries
    networks         the MNIST network preset and writing a network manifest with a validator identity
    cli              ``python -m tools pyodide-runtime | token issue | lineage export | lineage import | backup |
                     restore | init-network``
    parity           the NumPy (browser) and JAX (native) twins of a model spec agree: tolerances, comparison
    workload_check   ``dtn workload check``: a workload or spec model checked before a network trains it
    dtn              the ``dtn`` command: ``native_peer.cli``'s commands, ``dtn workload`` from
                     ``workload_check`` and ``dtn lineage`` from ``cli``

Imports point down only: ``tools`` uses ``server``, ``native_peer``, ``browser_peer``, ``datasets`` and
``protocol``;
nothing below imports ``tools``.
"""
