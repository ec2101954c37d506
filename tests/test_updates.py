"""Update codecs (fp32, fp16, blockwise int8 with error feedback): numerics, layouts, and a real
network training on int8 updates."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from native_peer import StorageConfig, Validator
from native_peer.identity import NodeIdentity
from native_peer.mnist import mlp_learner
from native_peer.models import builtin_model
from protocol.codec import decode_tensors, encode_tensors
from protocol.errors import InvalidMessage, TooLarge
from protocol.manifests import ExperimentSpec
from protocol.model import init_params
from protocol.updates import INT8_BLOCK, decode_update, encode_update, layout, read_artifact
from server.serve import BackgroundEdge
from tools.networks import BASELINE, mnist_network

from .support import edge_settings, mnist_trainer

SPEC = builtin_model("mnist-mlp")


def _trained(seed: int, scale: float = 0.01) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    base = init_params(SPEC, 0)
    rng = np.random.default_rng(seed)
    return base, {k: (v + scale * rng.standard_normal(v.shape)).astype(np.float32) for k, v in base.items()}


@pytest.mark.parametrize(("codec", "bound"), [("fp32", 0.0), ("fp16", 1e-3), ("int8", 1.0 / 127)])
def test_each_codec_decodes_within_its_precision(codec: str, bound: float) -> None:
    base, params = _trained(1)
    tensors, residual = encode_update(SPEC, base, params, codec)
    decoded = decode_update(SPEC, base, tensors, codec)
    for name in SPEC.shapes:
        delta = params[name] - base[name]
        error = np.abs(decoded[name] - params[name])
        assert error.max() <= bound * max(np.abs(delta).max(), 1e-12) + 1e-7, name
        np.testing.assert_allclose(
            residual[name], (params[name] - base[name]) - (decoded[name] - base[name]), atol=1e-6
        )


def test_int8_scales_are_per_block() -> None:
    base = {k: np.zeros_like(v) for k, v in init_params(SPEC, 0).items()}
    params = {k: np.zeros_like(v) for k, v in base.items()}
    kernel = params["dense0.kernel"].ravel()
    kernel[:INT8_BLOCK] = 1e-4  # a quiet block next to a loud one keeps its own resolution
    kernel[INT8_BLOCK : 2 * INT8_BLOCK] = 10.0
    tensors, _ = encode_update(SPEC, base, params, "int8")
    decoded = decode_update(SPEC, base, tensors, "int8")["dense0.kernel"].ravel()
    np.testing.assert_allclose(decoded[:INT8_BLOCK], 1e-4, rtol=1e-2)
    np.testing.assert_allclose(decoded[INT8_BLOCK : 2 * INT8_BLOCK], 10.0, rtol=1e-2)


def test_error_feedback_delivers_what_quantization_dropped() -> None:
    """Over many windows the sum of what was sent tracks the sum of the true updates to within one
    window's quantization error; without feedback the small components are lost every time."""
    base = {k: np.zeros_like(v) for k, v in init_params(SPEC, 0).items()}
    rng = np.random.default_rng(3)
    truth = {k: np.zeros_like(v) for k, v in base.items()}
    sent = {k: np.zeros_like(v) for k, v in base.items()}
    plain = {k: np.zeros_like(v) for k, v in base.items()}
    residual = None
    for _ in range(20):
        step = {k: (rng.standard_normal(v.shape) * 1e-3).astype(np.float32) for k, v in base.items()}
        step["dense1.bias"][:] = 1e-3  # a steady small push ...
        step["dense1.bias"][0] = 2.0  # ... next to a loud coordinate of its block: it rounds to zero alone
        params = {k: base[k] + step[k] for k in base}
        tensors, residual = encode_update(SPEC, base, params, "int8", residual)
        without, _ = encode_update(SPEC, base, params, "int8")
        for k in base:
            truth[k] += step[k]
            sent[k] += decode_update(SPEC, base, tensors, "int8")[k]
            plain[k] += decode_update(SPEC, base, without, "int8")[k]
    drift = np.abs(sent["dense1.bias"][1:] - truth["dense1.bias"][1:]).max()
    lost = np.abs(plain["dense1.bias"][1:] - truth["dense1.bias"][1:]).max()
    assert drift <= 1.0 / 127 + 1e-6  # at most half a quantization step behind, whatever the window count
    assert lost == pytest.approx(20 * 1e-3, rel=1e-3)  # without feedback all of it is gone


def test_native_and_browser_encodings_are_the_same_bytes() -> None:
    """The JAX trainer hands device arrays (via ``to_tensors``), the browser NumPy ones: one codec."""
    base, params = _trained(5)
    from_jax = {k: np.asarray(jnp.asarray(v)) for k, v in params.items()}
    for codec in ("fp16", "int8"):
        native, _ = encode_update(SPEC, base, from_jax, codec)
        browser, _ = encode_update(SPEC, base, params, codec)
        assert encode_tensors(native) == encode_tensors(browser)


def test_artifacts_must_match_the_codecs_layout_and_size() -> None:
    base, params = _trained(2)
    sizes = {}
    for codec in ("fp32", "fp16", "int8"):
        tensors, _ = encode_update(SPEC, base, params, codec)
        data = encode_tensors(tensors)
        assert set(read_artifact(SPEC, data, codec)) == set(layout(SPEC, codec))
        sizes[codec] = len(data)
    assert sizes["fp16"] / sizes["fp32"] < 0.501 and sizes["int8"] / sizes["fp32"] < 0.253
    fp32, _ = encode_update(SPEC, base, params, "fp32")
    with pytest.raises(TooLarge):
        read_artifact(SPEC, encode_tensors(fp32), "int8")  # an fp32 artifact is too large for int8
    fp16, _ = encode_update(SPEC, base, params, "fp16")
    with pytest.raises(InvalidMessage):
        read_artifact(SPEC, encode_tensors(fp16), "fp32")
    with pytest.raises(InvalidMessage):
        replace(ExperimentSpec(BASELINE, "mnist", SPEC, 1e-3, 64, 1, 2), codec="int4")  # type: ignore[arg-type]


def test_a_network_trains_on_int8_updates(tmp_path: Path, dataset_root: Path) -> None:
    storage = StorageConfig(tmp_path / "validator")
    identity = NodeIdentity.load_or_create(storage.identity_path)
    base_network = mnist_network(identity.public_key)
    network = replace(base_network, experiments=tuple(replace(s, codec="int8") for s in base_network.experiments))
    (tmp_path / "network.json").write_text(json.dumps(network.to_wire()))
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge:
        validator = Validator(mlp_learner(), network, storage, edge.url, dataset_root)
        spec = network.experiment(BASELINE)
        genesis = validator.ensure_genesis(spec)
        trainer = mnist_trainer(network, tmp_path / "trainer", edge.url)
        experiment = trainer.experiment(*BASELINE.parts)
        accuracies = [genesis.metrics["val_accuracy"]]
        for _ in range(3):
            outcome = trainer.train_window_once(experiment)
            report = validator.poll(spec)
            artifact = trainer.edge.artifact(outcome.candidate_id, tmp_path / "check" / outcome.candidate_id[7:])
            assert len(artifact) < 0.26 * SPEC.num_params * 4  # the window is closed: anyone may read it
            _, metadata = decode_tensors(artifact)
            assert metadata["codec"] == "int8"
            assert report is not None
            assert report.head.merged == (outcome.candidate_id,), [(v.reason, v.detail) for v in report.verdicts]
            accuracies.append(report.head.metrics["val_accuracy"])
        assert list((tmp_path / "trainer").rglob("residual.safetensors"))  # error feedback kept on disk
        assert accuracies[-1] > accuracies[0] + 0.3  # it learns: from chance to a working model
        trainer.close()
        validator.close()
