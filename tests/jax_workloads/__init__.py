"""Workloads of one's own JAX code, as a user writes them (``native_peer.workloads``), for
``tests/test_jax_workloads.py``: a plain pytree MLP and the same MLP as a Flax NNX module
(the Equinox one is ``examples/equinox_mlp``)."""
