"""Workloads of one's own JAX code, as a user writes them (``native_peer.workloads``), for
``tests/test_jax_workloads.py``: a plain pytree MLP, and the same MLP as an Equinox and a Flax NNX module."""
