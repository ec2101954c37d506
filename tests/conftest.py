"""Shared fixtures: the prepared MNIST dataset (real data, prepared once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from datasets import mnist
from datasets.layout import read_train_manifest
from protocol.manifests import FetchManifest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def dataset_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<tmp>/datasets`` with MNIST prepared in it (``mnist/train``, ``mnist/validation``, ...)."""
    out = tmp_path_factory.mktemp("datasets")
    mnist.prepare(out)
    return out


@pytest.fixture(scope="session")
def train_manifest(dataset_root: Path) -> FetchManifest:
    return read_train_manifest(dataset_root / "mnist")
