"""Networks from config files: the demo's file, ``init-network --config``, and files it refuses."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from native_peer.models import builtin_model
from protocol.ids import DatasetId, ExperimentKey
from protocol.manifests import ExperimentSpec, NetworkManifest
from tools.cli import main as tools_main
from tools.networks import BASELINE, LOW_LR, MNIST_NETWORK, NetworkConfigError, mnist_network, read_experiments

KEY = b"\x07" * 32
GOOD = """
[[experiments]]
key = "study/mine/rev-1"
dataset_id = "mnist"
model = "mnist-mlp"
learning_rate = 1e-3
batch_size = 32
local_epochs = 2
shards_per_lease = 3
"""


def _old_preset(key: bytes) -> NetworkManifest:
    """The demo's network as ``tools.networks`` wrote it in code before it became a file, but for the
    baseline's outer momentum (0.5 since windows overlap: docs/results/2026-12-pipeline.md) and its
    lease bound (16 shards since continuous trainers size their leases: decision 0014), and both on the
    int8 head grid (decision 0053)."""

    def spec(experiment: ExperimentKey, learning_rate: float) -> ExperimentSpec:
        return ExperimentSpec(
            experiment, DatasetId("mnist"), builtin_model("mnist-mlp"), learning_rate, 64, 1, 4,
            min_candidates=1, window_timeout_s=30.0, screening="balanced", head_grid="int8",
        )  # fmt: skip

    baseline = replace(
        spec(BASELINE, 2e-3), outer_optimizer="nesterov", outer_momentum=0.5, codec="int8", max_shards_per_lease=16
    )
    return NetworkManifest("demo", (key,), (baseline, spec(LOW_LR, 2e-5)))


def test_the_demo_network_file_gives_the_network_the_demo_always_ran() -> None:
    assert mnist_network(KEY) == _old_preset(KEY)
    assert mnist_network(KEY).to_wire() == _old_preset(KEY).to_wire()


def test_init_network_reads_experiments_from_a_toml_or_json_file(tmp_path: Path, dataset_root: Path) -> None:
    (tmp_path / "mine.toml").write_text(GOOD)
    storage = ["--validator-storage", str(tmp_path / "v"), "--datasets", str(dataset_root)]
    tools_main(
        ["init-network", *storage, "--out", str(tmp_path / "mine.json"), "--config", str(tmp_path / "mine.toml")]
    )
    network = NetworkManifest.from_wire(json.loads((tmp_path / "mine.json").read_text()))
    (spec,) = network.experiments
    assert (spec.key, spec.dataset_id, spec.learning_rate, spec.batch_size, spec.local_epochs) == (
        "study/mine/rev-1", "mnist", 1e-3, 32, 2,
    )  # fmt: skip
    assert (spec.codec, spec.outer_optimizer, spec.window_timeout_s) == ("fp32", "fedavg", 60.0)  # the defaults
    assert spec.model == builtin_model("mnist-mlp")  # the manifest carries the model's whole spec
    (tmp_path / "mine.config.json").write_text(json.dumps({"experiments": [spec.to_wire() | {"model": "mnist-mlp"}]}))
    assert read_experiments(tmp_path / "mine.config.json") == (spec,)
    tools_main(["init-network", *storage, "--out", str(tmp_path / "demo.json")])  # no --config: the demo's file
    demo = NetworkManifest.from_wire(json.loads((tmp_path / "demo.json").read_text()))
    assert demo.experiments == read_experiments(MNIST_NETWORK) == _old_preset(KEY).experiments


BAD = {
    "unknown field": (GOOD + 'optimizer = "adam"\n', "experiment study/mine/rev-1: unknown field(s) ['optimizer']"),
    "wrong type": (GOOD.replace("batch_size = 32", 'batch_size = "32"'), "study/mine/rev-1: field 'batch_size'"),
    "out of range": (GOOD.replace("local_epochs = 2", "local_epochs = 0"), "study/mine/rev-1: field 'local_epochs'"),
    "missing field": (GOOD.replace("learning_rate = 1e-3\n", ""), "study/mine/rev-1: missing field 'learning_rate'"),
    "unknown model": (GOOD.replace('"mnist-mlp"', '"resnet"'), "study/mine/rev-1: field 'model': unknown model"),
    "unknown preset": (GOOD + 'screening = "lenient"\n', "field 'screening': unknown preset 'lenient'"),
    "unknown codec": (GOOD + 'codec = "int3"\n', "study/mine/rev-1: unknown update codec 'int3'"),
    "bad key": (GOOD.replace("study/mine/rev-1", "mine"), "experiment mine: "),
    "listed twice": (GOOD + GOOD, "experiment study/mine/rev-1 is listed twice"),
    "no experiments": ("experiments = []\n", "`experiments` must be a non-empty list of tables"),
    "other top-level field": (GOOD + "[network]\nquorum = 2\n", "expected `experiments` and, optionally, `models`"),
    "not TOML": ("[[experiments]\n", "bad.toml: "),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_config_file_is_refused_naming_file_experiment_and_field(case: str, tmp_path: Path) -> None:
    text, message = BAD[case]
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(NetworkConfigError) as caught:
        read_experiments(tmp_path / "bad.toml")
    assert str(caught.value).startswith(f"{tmp_path / 'bad.toml'}: ") and message in str(caught.value)


def test_init_network_exits_with_the_config_error_and_creates_nothing(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text(GOOD + 'codec = "int3"\n')
    argv = ["init-network", "--validator-storage", str(tmp_path / "v"), "--out", str(tmp_path / "n.json")]
    with pytest.raises(SystemExit, match="unknown update codec 'int3'"):
        tools_main([*argv, "--config", str(tmp_path / "bad.toml")])
    assert not (tmp_path / "n.json").exists() and not (tmp_path / "v").exists()
