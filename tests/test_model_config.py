"""Models declared in network config files: ``[models.<name>]`` tables read strictly, the built-in models
as config, ``init-network`` checking each experiment's model against its prepared dataset, and a model no
built-in has trained by a native and a browser peer through a real edge, both built from the manifest."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from browser_peer.peer import BrowserPeer, PeerConfig
from datasets.sharding import shard
from datasets.sources import read_npz
from lab.stack import validating
from native_peer import Project, StorageConfig
from native_peer.edge_client import EdgeClient
from native_peer.learner import spec_learner
from native_peer.mnist import RELEASE
from native_peer.models import builtin_model, builtin_models
from protocol.codec import decode_tensors
from protocol.errors import InvalidMessage
from protocol.ids import ContentId, DatasetId, ExperimentKey, PeerId
from protocol.layers import Dense
from protocol.manifests import ExperimentSpec, NetworkManifest, SupportedWorkload
from protocol.messages import Verdict
from server.serve import BackgroundEdge
from tools.cli import main as tools_main
from tools.networks import NetworkConfigError, read_experiments

from .conftest import REPO
from .native_bridge import NativeBridge
from .support import experiment_spec, init_network_argv, measured_accuracies, network_from_config

DIGITS_MLP = """
[models.digits-mlp]
input_shape = [64]
layers = [
  { type = "dense", name = "dense0", units = 32 },
  { type = "relu", name = "relu0" },
  { type = "dense", name = "dense1", units = 10 },
]
"""
EXPERIMENT = """
[[experiments]]
key = "study/digits/rev-1"
dataset_id = "digits"
model = "digits-mlp"
learning_rate = 1e-3
batch_size = 32
local_epochs = 1
shards_per_lease = 1
"""
DIGITS = ExperimentKey.parse("study/digits/rev-1")


def _read(tmp_path: Path, text: str) -> NetworkManifest:
    (tmp_path / "net.toml").write_text(text)
    return NetworkManifest("n", (b"\x01" * 32,), read_experiments(tmp_path / "net.toml"))


def test_a_model_declared_in_the_config_travels_whole_in_the_manifest(tmp_path: Path) -> None:
    network = _read(tmp_path, DIGITS_MLP + EXPERIMENT)
    model = network.experiment(DIGITS).model
    assert (model.name, model.input_shape, model.objective) == ("digits-mlp", (64,), "classify")
    assert model.shapes == {"dense0.kernel": (64, 32), "dense0.bias": (32,), "dense1.kernel": (32, 10),
                            "dense1.bias": (10,)}  # fmt: skip
    wire = json.loads(json.dumps(network.to_wire()))
    assert wire["experiments"][0]["model"]["layers"][0] == {"type": "dense", "name": "dense0", "units": 32}
    assert NetworkManifest.from_wire(wire) == network


def test_the_built_in_models_are_config_and_the_specs_the_code_registry_held() -> None:
    models = builtin_models()
    assert sorted(models) == ["char-lm", "mnist-cnn", "mnist-mlp"]
    assert {name: m.num_params for name, m in models.items()} == {
        "mnist-mlp": 101_770, "mnist-cnn": 105_194, "char-lm": 137_216,
    }  # fmt: skip
    # the wire form of each, digested as protocol.model.MODELS wrote it before the models became a file:
    # heads of existing networks keep loading, parameter for parameter
    digests = {
        name: hashlib.sha256(json.dumps(m.to_wire(), sort_keys=True).encode()).hexdigest()[:16]
        for name, m in models.items()
    }
    assert digests == {"mnist-mlp": "3ce1d7fb0b557a51", "mnist-cnn": "daa807a78f8aeb64", "char-lm": "8619fdebc16d3e1a"}
    with pytest.raises(KeyError, match="no built-in model 'resnet'"):
        builtin_model("resnet")


def _layer(old: str, new: str) -> str:
    assert old in DIGITS_MLP
    return DIGITS_MLP.replace(old, new) + EXPERIMENT


BAD = {
    "unknown model field": (DIGITS_MLP + "hidden = 32\n" + EXPERIMENT, "model digits-mlp: unknown field(s) ['hidden']"),
    "missing input shape": (_layer("input_shape = [64]\n", ""), "model digits-mlp: missing field 'input_shape'"),
    "input shape not sizes": (_layer("[64]", '["64"]'), "model digits-mlp: field 'input_shape' must be a list of"),
    "unknown layer type": (_layer('"relu"', '"relu6"'), "model digits-mlp: layers[1]: unknown layer type 'relu6'"),
    "unknown layer field": (
        _layer("units = 32", "units = 32, activation = 'tanh'"),
        "model digits-mlp: layers[0]: layer type 'dense' has no fields ['activation']",
    ),
    "size out of range": (_layer("units = 32", "units = 0"), "layers[0]: field 'units' must be an integer in [1, "),
    "layer name": (_layer('name = "relu0"', 'name = "ReLU"'), "model digits-mlp: layers[1]: layer name 'ReLU'"),
    "names repeat": (_layer('name = "relu0"', 'name = "dense0"'), "model digits-mlp: layer names repeat"),
    "shapes do not chain": (
        _layer('{ type = "relu", name = "relu0" }', '{ type = "reshape", name = "image", shape = [5, 5] }'),
        "model digits-mlp: layer 'image': cannot reshape [32] to [5, 5]",
    ),
    "nested layer": (
        _layer('{ type = "relu", name = "relu0" }', '{ type = "residual", name = "block", layers = [{ type = "x" }] }'),
        "model digits-mlp: layers[1]: layers[0]: unknown layer type 'x'",
    ),
    "unknown objective": (_layer("input_shape", 'objective = "regress"\ninput_shape'), "unknown objective 'regress'"),
    "output not classes": (
        _layer("units = 10", "units = 1"),
        "model digits-mlp: a classifier's output must be [classes >= 2], not [1]",
    ),
    "model name": (_layer("digits-mlp]", "Digits]").replace('"digits-mlp"', '"Digits"'), "model Digits: model name"),
    "model not a table": ("models = 3\n" + EXPERIMENT, "`models` must hold one table per model"),
    "a built-in's name": (
        _layer("digits-mlp]", "mnist-mlp]"),
        "model mnist-mlp: a built-in model",
    ),
    "experiment names no model": (
        DIGITS_MLP + EXPERIMENT.replace('"digits-mlp"', "3"),
        "experiment study/digits/rev-1: field 'model' must name a model",
    ),
    "unknown model": (
        DIGITS_MLP + EXPERIMENT.replace('"digits-mlp"', '"digits-cnn"'),
        "study/digits/rev-1: field 'model': unknown model 'digits-cnn'; models: ['char-lm', 'digits-mlp', ",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_model_table_is_refused_in_one_line_naming_model_and_field(case: str, tmp_path: Path) -> None:
    text, message = BAD[case]
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(NetworkConfigError) as caught:
        read_experiments(tmp_path / "bad.toml")
    error = str(caught.value)
    assert error.startswith(f"{tmp_path / 'bad.toml'}: ") and message in error and "\n" not in error, error


def test_a_manifest_holds_a_models_spec_not_a_name_and_one_spec_per_name() -> None:
    with pytest.raises(InvalidMessage, match=r"field 'model' names a model \('mnist-mlp'\).*init-network"):
        ExperimentSpec.from_wire(experiment_spec().to_wire() | {"model": "mnist-mlp"})
    with pytest.raises(InvalidMessage, match=r"field 'model': layers\[0\]: unknown layer type 'dens'"):
        wire = experiment_spec().to_wire()
        ExperimentSpec.from_wire(wire | {"model": wire["model"] | {"layers": [{"type": "dens", "name": "d"}]}})
    second = ExperimentKey.parse("study/b/rev-1")
    assert len(NetworkManifest("n", (), (experiment_spec(), experiment_spec(second))).experiments) == 2
    other = replace(builtin_model("mnist-mlp"), layers=(Dense("dense0", 10),))  # another 784 -> 10, same name
    with pytest.raises(InvalidMessage, match="experiments declare two different models named mnist-mlp"):
        NetworkManifest("n", (), (experiment_spec(), experiment_spec(second, model=other)))


# -- init-network against the prepared dataset --------------------------------------------------
@pytest.fixture(scope="module")
def digits_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared 64-feature, 10-class dataset ``digits`` (8x8 images, flattened), written from an .npz
    file by the dataset writer users run (``dtn dataset shard --from npz``)."""
    rng = np.random.default_rng(8)
    folder = tmp_path_factory.mktemp("digits")
    np.savez(folder / "digits.npz", x=rng.integers(0, 17, (400, 64), dtype=np.uint8) * 15, y=np.arange(400) % 10)
    shard(read_npz(folder / "digits.npz"), folder / "datasets", DatasetId("digits"), shard_size=100)
    return folder / "datasets"


MISMATCH = {
    "input features": (
        EXPERIMENT.replace('"digits-mlp"', '"mnist-mlp"'),
        "experiment study/digits/rev-1: model input 784 features, dataset digits has 64 features",
    ),
    "classes": (
        _layer("units = 10", "units = 12"),
        "experiment study/digits/rev-1: model output 12 classes, dataset digits has 10",
    ),
    "feature kind": (  # char-lm takes 64 inputs too, but token ids
        EXPERIMENT.replace('"digits-mlp"', '"char-lm"'),
        "experiment study/digits/rev-1: model reads token ids (an embedding first), dataset digits holds pixels",
    ),
    "dataset not prepared": (
        DIGITS_MLP + EXPERIMENT.replace('dataset_id = "digits"', 'dataset_id = "faces"'),
        "experiment study/digits/rev-1: dataset faces is not prepared under ",
    ),
}


@pytest.mark.parametrize("case", sorted(MISMATCH))
def test_init_network_refuses_a_model_that_does_not_fit_its_dataset(
    case: str, tmp_path: Path, digits_root: Path
) -> None:
    text, message = MISMATCH[case]
    with pytest.raises(SystemExit) as caught:
        tools_main(init_network_argv(tmp_path, text, digits_root))
    assert message in str(caught.value) and "\n" not in str(caught.value), caught.value
    assert not (tmp_path / "network.json").exists() and not (tmp_path / "validator").exists()


def test_init_network_writes_a_network_whose_model_fits_its_dataset(tmp_path: Path, digits_root: Path) -> None:
    assert (DIGITS_MLP + EXPERIMENT).strip() in (REPO / "docs" / "models.md").read_text()  # the example there
    network = network_from_config(tmp_path, DIGITS_MLP + EXPERIMENT, digits_root).network
    assert network.experiment(DIGITS).model.shapes["dense0.kernel"] == (64, 32)


# -- a declared model trained through a real edge -----------------------------------------------
NARROW = (  # the digits network's MLP on MNIST: 784 -> 32 ReLU -> 10, a width no built-in model has
    (DIGITS_MLP + EXPERIMENT)
    .replace("[64]", "[784]")
    .replace("digits-mlp", "mnist-narrow")
    .replace('dataset_id = "digits"', 'dataset_id = "mnist"')
    .replace("study/digits", "study/narrow")
    # 4 shards: an honest lease's evidence z 6-9 after one window, where 2 shards drew 3.7-5.7 and now and
    # then one below the refusal bound of 2 (``protocol.screening.screen_lease_evidence``)
    .replace("shards_per_lease = 1", "shards_per_lease = 4")
)
NARROW_KEY = ExperimentKey.parse("study/narrow/rev-1")


def _verdicts(edge: EdgeClient, peer_id: str, timeout_s: float = 60.0) -> list[Verdict]:
    """The verdicts on ``peer_id``'s candidates once there is one (waiting up to ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not (verdicts := edge.verdicts(NARROW_KEY, PeerId(peer_id))) and time.monotonic() < deadline:
        time.sleep(0.2)
    return verdicts


@pytest.mark.slow  # two peers train windows through a real edge: 9 s of the fast tier's 3-minute budget
def test_native_and_browser_peers_train_a_model_declared_in_the_network_config(
    tmp_path: Path, dataset_root: Path
) -> None:
    local = network_from_config(tmp_path, NARROW, dataset_root)
    spec = local.network.experiment(NARROW_KEY)
    with (
        BackgroundEdge(local.edge_settings(pyodide_dir=tmp_path / "no-pyodide")) as edge,
        validating(local, edge.url, [spec]),  # its learner built from the manifest's spec (network_learners)
    ):
        client = EdgeClient(edge.url)
        trainer = (
            Project(spec_learner(spec.model))  # as `dtn train` builds it from the manifest
            .trainer(RELEASE, SupportedWorkload("narrow-cpu", "mnist-narrow", DatasetId("mnist")))
            .with_network(local.network)
            .with_storage(StorageConfig(tmp_path / "trainer"))
            .with_bootstrap_peer(edge.url)
            .spawn()
        )
        outcome = trainer.train_window_once(trainer.experiment(*NARROW_KEY.parts))
        native = _verdicts(client, trainer.peer_id)
        trainer.close()
        bridge = NativeBridge()  # the browser peer's Python (NumPy layers), under CPython
        peer = BrowserPeer(bridge, PeerConfig(edge.url, NARROW_KEY, b"\x49" * 32, max_windows=1))

        async def contribute() -> None:
            await asyncio.wait_for(peer.run(), 120)
            await bridge.aclose()

        asyncio.run(contribute())
        browser = _verdicts(client, peer.peer_id)
        heads = client.heads(NARROW_KEY)
        params, _ = decode_tensors(client.artifact(ContentId(heads[-1].head_id), tmp_path / "head"))
        first, last = measured_accuracies(client, local.network, [heads[0], heads[-1]])
        client.close()
    assert [v.accepted for v in native] == [True] and native[0].candidate_id == outcome.candidate_id, native
    assert [v.accepted for v in browser] == [True], [(str(v.reason), v.detail, v.metrics) for v in browser]
    assert {name: array.shape for name, array in params.items()} == spec.model.shapes
    assert spec.model.shapes["dense0.kernel"] == (784, 32)
    assert heads[-1].window >= 2 and last > first + 0.3
