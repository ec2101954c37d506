"""The MNIST MLP as a ``JaxLearner`` (the built-in ``mnist-mlp``, 784 → 128 ReLU → 10), with Adam and an
optional schedule, and the release / workload a trainer of it declares (``RELEASE``, ``WORKLOAD``)."""

from __future__ import annotations

from collections.abc import Callable

import optax

from protocol.ids import DatasetId
from protocol.manifests import ExperimentSpec, ReleaseManifest, SupportedWorkload

from .learner import JaxLearner, adam, spec_learner
from .models import builtin_model

__all__ = ["RELEASE", "WORKLOAD", "mlp_learner"]

RELEASE = ReleaseManifest("dtn-0.1.0")
WORKLOAD = SupportedWorkload("mnist-mlp-cpu", "mnist-mlp", DatasetId("mnist"))


def mlp_learner(make_optimizer: Callable[[ExperimentSpec], optax.GradientTransformation] = adam) -> JaxLearner:
    """The MNIST MLP learner; pass ``make_optimizer`` to bring your own optax chain or schedule."""
    return spec_learner(builtin_model("mnist-mlp"), make_optimizer)
