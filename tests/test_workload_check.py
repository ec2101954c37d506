"""``dtn workload check`` (``tools.workload_check``; issue #23 item 3): a workload or a config's
spec model passes every check; each fault fails its own check in one line and the command exits
nonzero; bad input is one line, no traceback. Tiny models: every check compiles a few steps."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from native_peer.learner import spec_learner
from protocol.manifests import ExperimentSpec
from protocol.model import ModelSpec
from tools.dtn import main as dtn_main
from tools.networks import read_experiments
from tools.workload_check import check_learner

FAULTY = "tests.jax_workloads.faulty"
CONFIG = """
[models.tiny-cnn]
input_shape = [16]
layers = [
  { type = "reshape", name = "image", shape = [4, 4, 1] },
  { type = "conv2d", name = "conv", filters = 2, kernel_size = 3 },
  { type = "relu", name = "relu" },
  { type = "flatten", name = "flatten" },
  { type = "dense", name = "head", units = 3 },
]

[[experiments]]
key = "study/tiny/rev-1"
dataset_id = "tiny"
model = "tiny-cnn"
learning_rate = 1e-2
batch_size = 8
local_epochs = 1
shards_per_lease = 1
"""


def _check(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str]:
    """``dtn workload check`` as run from a shell: its exit status, its lines and its error output."""
    try:
        dtn_main(["workload", "check", *argv])
        status = 0
    except SystemExit as exc:
        status = int(exc.code) if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return status, out.splitlines(), err


def _config(tmp_path: Path) -> Path:
    (tmp_path / "network.toml").write_text(CONFIG)
    return tmp_path / "network.toml"


def test_a_spec_model_from_a_config_passes_every_check_browser_parity_included(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, lines, err = _check(["--config", str(_config(tmp_path))], capsys)
    assert status == 0, (lines, err)
    assert [line.split(":")[0] for line in lines[:4]] == [
        "ok    wire mapping",
        "ok    determinism",
        "ok    evaluation",
        "ok    browser parity",
    ], lines
    assert lines[-1] == "tiny-cnn: every check passed (4)"


@pytest.mark.parametrize(
    ("attribute", "check", "problem"),
    [
        ("host_noise", "determinism", "differs between two updates from the same head and batches"),
        ("nan_logits", "evaluation", "loss nan"),
    ],
)
def test_a_faulty_workload_fails_its_check_in_one_line_and_the_command_exits_nonzero(
    attribute: str, check: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, lines, _ = _check([f"{FAULTY}:{attribute}"], capsys)
    failed = [line for line in lines if line.startswith("FAIL")]
    assert status == 1 and len(failed) == 1, lines
    assert failed[0].startswith(f"FAIL  {check}: ") and problem in failed[0], failed
    assert lines[-1] == f"workload: 1 of 3 checks failed: {check}"


def _tiny(tmp_path: Path) -> tuple[ExperimentSpec, ModelSpec]:
    spec = read_experiments(_config(tmp_path))[0]
    assert isinstance(spec.model, ModelSpec)
    return spec, spec.model


def test_a_wire_mapping_that_does_not_round_trip_fails_the_wire_check(tmp_path: Path) -> None:
    spec, model = _tiny(tmp_path)
    learner = spec_learner(model)
    swapped = replace(  # a hand-written mapping that sends one tensor back reversed
        learner,
        from_tensors=lambda tensors: learner.from_tensors(
            {**tensors, "head.kernel": np.ascontiguousarray(tensors["head.kernel"][::-1])}
        ),
    )
    outcomes = {outcome.check: outcome for outcome in check_learner(swapped, spec)}
    assert outcomes["wire mapping"].problem == (
        "from the wire: leaf head.kernel is not the one sent (float32, was float32)"
    ), outcomes["wire mapping"]
    assert check_learner(learner, spec)[0].problem is None  # the mapping itself round-trips


def test_a_jax_twin_that_drifts_from_numpy_fails_browser_parity(tmp_path: Path) -> None:
    spec, model = _tiny(tmp_path)
    learner = spec_learner(model)
    drifting = replace(learner, apply=lambda params, x: learner.apply(params, x) * 1.001)
    outcomes = {outcome.check: outcome for outcome in check_learner(drifting, spec)}
    problem = outcomes["browser parity"].problem
    assert problem is not None and problem.startswith("with numpy products: logits: NumPy "), problem
    assert "beyond 1e-05 + 0.0001·|JAX|" in problem and "more)" in problem, problem  # loss and gradients too


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tests.no_such_module:learner"], "no module tests.no_such_module is installed here"),
        ([f"{FAULTY}:nothing"], "has no attribute 'nothing'"),
        ([f"{FAULTY}:not_a_workload"], "not_a_workload() returned int, not a Workload"),
        ([f"{FAULTY}:broken_factory"], "broken_factory() raised RuntimeError: the factory's own bug"),
        (["tests/jax_workloads/faulty.py"], "must be an import path module:attribute"),
        ([], "name a workload by import path (module:attribute) or pass --config"),
    ],
)
def test_bad_input_is_one_line_without_a_traceback(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, lines, err = _check(argv, capsys)
    assert status == 2 and lines == [], (lines, err)
    assert err.startswith("dtn workload check: ") and message in err and err.count("\n") == 1, err


def test_a_config_check_names_the_experiment_it_lacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = _check(["--config", str(_config(tmp_path)), "--experiment", "study/other/rev-1"], capsys)
    assert status == 2 and "has no experiment study/other/rev-1; experiments: ['study/tiny/rev-1']" in err, err
