"""Workloads of one's own JAX code (``native_peer.workloads``, ``protocol.workload``; issue #23 item 2):
wire names from key paths, Equinox and Flax NNX modules through the same adapter, the hash pin, the
browser-kind lease refusal, ``init-network`` with a workload, and one trained through a real edge."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import jax
import numpy as np
import pytest

from browser_peer.peer import BrowserPeer, PeerConfig
from lab.browser_host import NativeBridge
from lab.stack import validating
from native_peer.cli import main as dtn_main
from native_peer.edge_client import EdgeClient
from native_peer.learner import TrainEngine
from native_peer.workloads import WorkloadError, describe, load, wire_names
from protocol.codec import decode_tensors
from protocol.errors import InvalidMessage
from protocol.ids import ContentId, ExperimentKey
from protocol.manifests import NetworkManifest
from protocol.signing import PureSigner
from protocol.workload import WorkloadModel
from server.serve import BackgroundEdge
from tools.networks import NetworkConfigError, read_experiments

from .conftest import REPO
from .support import (
    edge_settings,
    experiment_spec,
    measured_accuracies,
    missing,
    network_from_config,
    proof,
    workload_config,
)

PYTREE = "tests.jax_workloads.pytree_mlp:learner"
KEY = ExperimentKey.parse("study/own-mlp/rev-1")
CONFIG = workload_config(KEY, "own-mlp", PYTREE)


def _batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((4, 16, 784), dtype=np.float32), rng.integers(0, 10, (4, 16))


# -- names on the wire ------------------------------------------------------------------------------
def test_parameters_travel_under_their_key_paths_and_round_trip_bit_for_bit() -> None:
    source = (Path(__file__).parent / "jax_workloads" / "pytree_mlp.py").read_text()
    assert source.split('"""')[2].strip() in (REPO / "docs" / "workloads-of-your-own.md").read_text()  # the example
    model = describe(PYTREE, "own-mlp")
    assert [name for name, _ in model.param_shapes] == ["hidden.b", "hidden.w", "out.0", "out.1"]
    assert model.shapes["hidden.w"] == (784, 32) and model.output == (10,)
    assert wire_names({"a": [1.0, {"b": 2.0}], "c": 3.0}) == ["a.0", "a.1.b", "c"]
    learner = load(model)
    params = learner.init(jax.random.PRNGKey(3))
    tensors = learner.to_tensors(params)
    assert {name: array.shape for name, array in tensors.items()} == model.shapes
    back = learner.from_tensors(tensors)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(params)
    assert all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(params), strict=True)
    )
    with pytest.raises(InvalidMessage, match="do not match own-mlp"):
        learner.from_tensors({**tensors, "hidden.extra": tensors["out.1"]})


@pytest.mark.slow  # imports flax and equinox and compiles two epochs: 3 s of the fast tier's 3-minute budget
@pytest.mark.parametrize(
    ("module", "framework", "names"),
    [
        ("examples.equinox_mlp.model", "equinox", ["hidden.weight", "hidden.bias", "out.weight", "out.bias"]),
        ("tests.jax_workloads.nnx_mlp", "flax", ["hidden.bias", "hidden.kernel", "out.bias", "out.kernel"]),
    ],
)
def test_equinox_and_flax_nnx_modules_train_through_the_same_adapter(
    module: str, framework: str, names: list[str]
) -> None:
    if importlib.util.find_spec(framework) is None:
        missing(f"{framework} is not installed (make setup installs the `workloads` extra)")
    model = describe(f"{module}:learner", f"{framework}-mlp")
    assert [name for name, _ in model.param_shapes] == names
    assert framework in dict(model.versions) and {"jax", "jaxlib", "optax"} <= set(dict(model.versions))
    learner = load(model)
    tensors = learner.to_tensors(learner.init(jax.random.PRNGKey(0)))
    engine = TrainEngine(learner, learner.make_optimizer(experiment_spec()))
    xb, yb = _batch()
    before = engine.evaluate(learner.from_tensors(tensors), xb.reshape(-1, 784), yb.reshape(-1))["loss"]
    trained = engine.fresh_window(tensors, xb, yb)
    after = engine.evaluate(learner.from_tensors(trained), xb.reshape(-1, 784), yb.reshape(-1))["loss"]
    assert set(trained) == set(names) and after < before, (before, after)


# -- the pin ----------------------------------------------------------------------------------------
@pytest.fixture
def own_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Path:
    """A copy of the pytree workload as a package of its own (named after the test), importable."""
    name = "own_" + request.node.name.replace("[", "_").replace("]", "").replace("-", "_")[:40]
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copy(Path(__file__).parent / "jax_workloads" / "pytree_mlp.py", package / "models.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def _refused(model: WorkloadModel) -> str:
    with pytest.raises(WorkloadError) as caught:
        load(model)
    assert "\n" not in str(caught.value) and "refusing to run it" in str(caught.value), caught.value
    return str(caught.value)


def test_the_manifest_pins_the_workloads_files_and_a_changed_file_is_refused_before_it_is_imported(
    own_package: Path,
) -> None:
    path = f"{own_package.name}.models:learner"
    model = describe(path, "own-mlp")
    assert dict(model.sources).keys() == {f"{own_package.name}/__init__.py", f"{own_package.name}/models.py"}
    load(model)  # the pinned code, as installed: runs
    del sys.modules[f"{own_package.name}.models"]
    models = own_package / "models.py"
    models.write_text(models.read_text().replace("3e-3", "5e-3"))
    message = _refused(model)
    assert f"file {own_package.name}/models.py differs from the pinned one" in message, message
    assert f"{own_package.name}.models" not in sys.modules  # checked before it was imported
    (own_package / "helpers.py").write_text("")
    models.write_text(models.read_text().replace("5e-3", "3e-3"))  # the pinned bytes again
    assert f"file {own_package.name}/helpers.py is here but not pinned" in _refused(model)
    (own_package / "helpers.py").unlink()
    assert load(model).model == model


def test_a_top_level_module_is_pinned_as_its_own_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(Path(__file__).parent / "jax_workloads" / "pytree_mlp.py", tmp_path / "own_top_level_mlp.py")
    (tmp_path / "unrelated.txt").write_text("not part of the workload")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        model = describe("own_top_level_mlp:learner", "own-mlp")
        assert [path for path, _ in model.sources] == ["own_top_level_mlp.py"]
        assert load(model).model == model
    finally:
        sys.modules.pop("own_top_level_mlp", None)


def test_a_workload_checked_with_other_package_versions_is_refused(own_package: Path) -> None:
    model = describe(f"{own_package.name}.models:learner", "own-mlp")
    versions = dict(model.versions)
    old = replace(model, versions=tuple(sorted({**versions, "jax": "0.4.30"}.items())))
    assert f"jax {versions['jax']} here, the manifest pins 0.4.30" in _refused(old)
    framework = replace(model, versions=tuple(sorted({**versions, "not-a-package-here": "1.0"}.items())))
    assert "not-a-package-here not installed here, the manifest pins 1.0" in _refused(framework)
    assert old.digest != model.digest != framework.digest


BAD_WIRE = {
    "an import path with a call": ({"workload": "pkg.models:learner()"}, "must be an import path"),
    "a parameter name with a slash": ({"params": [["a/b", [2]]]}, "parameter name 'a/b' must match"),
    "two parameters of one name": ({"params": [["a", [2]], ["a", [3]]]}, "names must be distinct"),
    "an unsorted pin": ({"sources": {"p/b.py": "0" * 64, "p/a.py": "1" * 64}}, None),
    "a short sha256": ({"sources": {"p/a.py": "abc"}}, "sha256 must be 64 lowercase hex digits"),
    "a path out of the package": ({"sources": {"../etc/passwd": "0" * 64}}, "must be a relative path"),
    "no versions": ({"versions": {}}, "pins the versions of its packages"),
    "a classifier of one class": ({"output": [1]}, "a classifier's output must be [classes >= 2]"),
    "a field of its own": ({"code": "import os"}, "has no fields ['code']"),
}


@pytest.mark.parametrize("case", sorted(BAD_WIRE))
def test_a_workload_model_on_the_wire_is_read_strictly(case: str) -> None:
    wire = describe(PYTREE, "own-mlp").to_wire()
    assert WorkloadModel.from_wire(json.loads(json.dumps(wire))) == describe(PYTREE, "own-mlp")
    change, message = BAD_WIRE[case]
    changed = {**wire, **change}
    if case == "an unsorted pin":  # a JSON object's order is the sender's: read sorted, so it is the same pin
        assert WorkloadModel.from_wire(changed).sources == tuple(sorted(change["sources"].items()))
        return
    with pytest.raises(InvalidMessage, match=message.replace("[", r"\[").replace("(", r"\(")):
        WorkloadModel.from_wire(changed)


# -- the network's config -----------------------------------------------------------------------------
def test_init_network_pins_a_workload_and_refuses_one_it_cannot_import(tmp_path: Path, dataset_root: Path) -> None:
    network = network_from_config(tmp_path, CONFIG, dataset_root).network
    model = network.experiment(KEY).model
    assert isinstance(model, WorkloadModel) and model == describe(PYTREE, "own-mlp") and model.native_only
    (tmp_path / "bad.toml").write_text(CONFIG.replace("pytree_mlp", "no_such_module"))
    with pytest.raises(NetworkConfigError, match=r"experiment study/own-mlp/rev-1: workload .*no_such_module"):
        read_experiments(tmp_path / "bad.toml")
    (tmp_path / "taken.toml").write_text(CONFIG.replace('"own-mlp"', '"mnist-mlp"'))
    with pytest.raises(NetworkConfigError, match="mnist-mlp is a declared or built-in model"):
        read_experiments(tmp_path / "taken.toml")


# -- browser peers ----------------------------------------------------------------------------------
def test_browser_peers_get_no_lease_for_a_native_only_experiment(tmp_path: Path, dataset_root: Path) -> None:
    network = NetworkManifest("n", (b"\x01" * 32,), (experiment_spec(KEY, model=describe(PYTREE, "own-mlp")),))
    (tmp_path / "network.json").write_text(json.dumps(network.to_wire()))
    signer = PureSigner(b"\x07" * 32)
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge, httpx.Client(base_url=edge.url) as http:
        browser = http.post(f"/v1/experiments/{KEY}/leases", json=proof(signer, "lease", kind="browser"))
        native = http.post(f"/v1/experiments/{KEY}/leases", json=proof(signer, "lease", kind="native"))
        bridge = NativeBridge()  # the browser peer's Python: it sees the experiment is not for it
        peer = BrowserPeer(bridge, PeerConfig(edge.url, KEY, b"\x49" * 32, max_windows=1))

        async def contribute() -> None:
            await asyncio.wait_for(peer.run(), 60)
            await bridge.aclose()

        asyncio.run(contribute())
    assert browser.status_code == 403, browser.text
    assert "is native-only: its model own-mlp is JAX code" in browser.json()["detail"], browser.text
    assert native.status_code == 404 and "no head yet" in native.text, native.text  # refused for no head only
    assert any(s["phase"].startswith(f"error: experiment {KEY} is native-only") for s in bridge.statuses)
    assert peer.status["windows_done"] == 0


# -- trained through a real edge ------------------------------------------------------------------
@pytest.mark.slow  # a trainer and a validator through a real edge, two windows
def test_a_native_trainer_trains_a_workload_a_validator_judges_through_a_real_edge(
    tmp_path: Path, dataset_root: Path
) -> None:
    local = network_from_config(tmp_path, CONFIG, dataset_root)
    spec = local.network.experiment(KEY)
    with (
        BackgroundEdge(local.edge_settings(pyodide_dir=tmp_path / "no-pyodide")) as edge,
        validating(local, edge.url, [spec]),  # its learner loaded from the pinned workload (network_learners)
    ):
        argv = ["train", "--edge", edge.url, "--network", str(local.network_path), "--storage", str(tmp_path / "t"),
                "--windows", "2", "--idle-between-windows"]  # fmt: skip
        dtn_main(argv)  # as `dtn train` runs: the learner loaded from the manifest's pin
        client = EdgeClient(edge.url)
        deadline = time.monotonic() + 60
        while (heads := client.heads(KEY))[-1].window < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the validator judges the last window after the trainer has stopped
        params, _ = decode_tensors(client.artifact(ContentId(heads[-1].head_id), tmp_path / "head"))
        first, last = measured_accuracies(client, local.network, [heads[0], heads[-1]])
        client.close()
    assert {name: array.shape for name, array in params.items()} == spec.model.shapes
    assert heads[-1].window >= 2 and all(h.merged for h in heads[1:]), [(h.window, h.merged) for h in heads]
    assert last > first + 0.3, (first, last)
