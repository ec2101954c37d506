"""The worked examples of ``examples/`` (examples/README.md), each run as its README says in a real
network: a uvicorn edge, 3 ``dtn validate`` processes with quorum 2 and 2 ``dtn train`` processes, until
a certified head reaches the example's stated test accuracy. The Flax NNX CNN's best head then goes out
with ``dtn export`` and back into the user's module; the layer-spec model declared in TOML is also
trained by a tab of Chromium, and one of the tab's candidates is merged into a certified head."""

from __future__ import annotations

import importlib.util
import json
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from datasets.layout import load_split
from lab.demo import CHROMIUM, CHROMIUM_FLAGS, browser_problem
from lab.stack import REPO, Fleet, LocalNetwork, free_port
from native_peer.cli import main as dtn_main
from native_peer.edge_client import EdgeClient
from native_peer.learner import Evaluator
from native_peer.workloads import load
from protocol.manifests import NetworkManifest
from protocol.messages import HeadDescriptor
from protocol.network_pins import fingerprint
from protocol.workload import WorkloadModel
from tools.cli import main as tools_main

from .support import missing, until

EXAMPLES = REPO / "examples"
VALIDATORS, QUORUM, TRAINERS = 3, 2, 2
# the test accuracy each example states in examples/README.md, and the seconds it may take to get there
STATED = {"flax_cnn": (0.90, 150), "equinox_mlp": (0.90, 150), "browser_spec": (0.85, 180)}


def _stated_in_readme(example: str) -> float:
    """The accuracy examples/README.md states for ``example``: what this test asserts."""
    target = STATED[example][0]
    line = next(line for line in (EXAMPLES / "README.md").read_text().splitlines() if f"`{example}/`" in line)
    assert f"({target:.0%} test accuracy)" in line, (example, line)
    return target


def _quorum_network(root: Path, example: str, datasets: Path) -> LocalNetwork:
    """``init-network`` of the example's config with 3 validators (``root/v0`` ...) and quorum 2."""
    storages = [arg for i in range(VALIDATORS) for arg in ("--validator-storage", str(root / f"v{i}"))]
    tools_main(["init-network", *storages, "--quorum", str(QUORUM), "--out", str(root / "network.json"),
                "--config", str(EXAMPLES / example / "network.toml"), "--datasets", str(datasets)])  # fmt: skip
    return LocalNetwork(root, datasets, NetworkManifest.from_wire(json.loads((root / "network.json").read_text())))


def _certified(edge: EdgeClient, network: NetworkManifest, target: float) -> HeadDescriptor | None:
    """The newest head measured on the test split (its validators' ``Evaluation``), if its accuracy is
    ``target`` or more, checked against the quorum."""
    key = network.experiments[0].key
    tests = edge.evaluated(key, network.validator_key_set)
    measured = [h for h in edge.heads(key) if h.head_id in tests]
    head = measured[-1] if measured and tests[measured[-1].head_id]["test_accuracy"] >= target else None
    if head is not None:
        head.verify_trusted(network.validator_key_set, network.quorum)
    return head


@pytest.mark.slow  # 6 processes (an edge, 3 validators, 2 trainers), a browser for the spec model
@pytest.mark.parametrize("example", sorted(STATED))
def test_an_example_reaches_its_stated_accuracy_in_a_network_of_three_validators(
    tmp_path: Path, dataset_root: Path, example: str
) -> None:
    browser = example == "browser_spec"
    if browser and (problem := browser_problem()) is not None:
        missing(problem)
    if not browser and importlib.util.find_spec("flax" if "flax" in example else "equinox") is None:
        missing("flax and equinox are not installed (make setup installs the `workloads` extra)")
    target, timeout_s = _stated_in_readme(example), STATED[example][1]
    local = _quorum_network(tmp_path, example, dataset_root)
    key = local.network.experiments[0].key
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with Fleet(tmp_path) as fleet:
        fleet.start("edge", local.edge_argv(port))
        fleet.wait_ready(f"{url}/healthz")
        for i in range(VALIDATORS):
            fleet.start(f"validator-{i}", [sys.executable, "-m", "native_peer", "validate", "--edge", url,
                        "--network", str(local.network_path), "--storage", str(tmp_path / f"v{i}"),
                        "--datasets", str(dataset_root)])  # fmt: skip
        for i in range(TRAINERS):
            fleet.start(f"trainer-{i}", local.trainer_argv(url, tmp_path / f"t{i}"))
        if browser:
            page = f"{url}/?contribute=1&experiment={key}"
            fleet.start("browser", [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}", page])
        with closing(EdgeClient(url)) as edge:
            head = until(f"a certified head at test accuracy {target}", lambda: _certified(edge, local.network, target),
                         timeout_s, poll_s=1.0, fleet=fleet)  # fmt: skip
            if browser:
                until("a tab's candidate merged into a certified head", lambda: _browser_merged(edge, local.network),
                      60, poll_s=1.0, fleet=fleet)  # fmt: skip
            if example == "flax_cnn":
                fleet.stop_all(keep=("edge",))
                _exported_loads_back(tmp_path, edge, local.network, dataset_root)
    assert head.window >= 1 and len(head.certificate) + 1 >= QUORUM


def _browser_merged(edge: EdgeClient, network: NetworkManifest) -> bool:
    """Whether a certified head merged a candidate of a browser peer."""
    key = network.experiments[0].key
    browsers = {p["peer_id"] for p in edge.peers()["known"] if p["kind"] == "browser"}
    theirs = {v.candidate_id for v in edge.verdicts(key) if v.accepted and v.peer_id in browsers}
    for head in edge.heads(key):
        if theirs & set(head.merged):
            head.verify_trusted(network.validator_key_set, network.quorum)
            return True
    return False


def _exported_loads_back(root: Path, edge: EdgeClient, network: NetworkManifest, datasets: Path) -> None:
    """``dtn export`` of the best certified head, loaded back into the example's own Flax NNX module:
    the module computes what the head's validation metrics say."""
    key, pin = network.experiments[0].key, fingerprint(network.validator_keys[0])
    out = root / "export"
    dtn_main(["export", "--experiment", str(key), "--edge", edge.urls[0], "--validator-key", pin,
              "--out", str(out)])  # fmt: skip
    with pytest.raises(SystemExit, match="refusing it"):  # a network without the pinned validator
        dtn_main(["export", "--experiment", str(key), "--edge", edge.urls[0], "--validator-key",
                  fingerprint(b"\x23" * 32), "--out", str(root / "other")])  # fmt: skip
    heads = edge.heads(key)
    best = min(heads, key=lambda head: (head.metrics["val_loss"], -head.window))
    config = json.loads((out / "config.json").read_text())
    assert HeadDescriptor.from_wire(config["head"]) == best
    model = WorkloadModel.from_wire(config["model"])
    assert model == network.experiments[0].model
    tensors = load_file(out / "model.safetensors")  # the official library
    assert {name: array.shape for name, array in tensors.items()} == model.shapes
    learner = load(model)  # the user's module, its pin checked, parameters by their key paths
    params = learner.from_tensors(tensors)
    assert set(params) == {"conv", "out"} and set(params["conv"]) == {"kernel", "bias"}  # nnx.to_pure_dict's tree
    x, y = load_split(datasets / "mnist", "holdout")  # what the validators measure a head's val_ metrics on
    measured = Evaluator(learner)(params, x, y)
    assert abs(measured["loss"] - best.metrics["val_loss"]) < 1e-5, (measured, best.metrics)
    assert measured["accuracy"] == best.metrics["val_accuracy"]
    from flax import nnx  # into the user's module, as docs/workloads-of-your-own.md says

    from examples.flax_cnn.model import CNN

    module = CNN(nnx.Rngs(7))
    state = nnx.state(module, nnx.Param)
    nnx.replace_by_pure_dict(state, params)
    nnx.update(module, state)
    assert np.array_equal(np.asarray(module(x[:64])), np.asarray(learner.apply(params, x[:64])))
