"""The outer optimizer (``protocol.outer``): DiLoCo's Nesterov step at the validators.

Pure: the step's arithmetic, the state's artifact, what ``judge_window`` does with the state when a
window merges, merges nothing, or is blocked. Against a real edge with a 2-of-3 quorum: every head
names its momentum, the edge serves it, the momentum is exactly the one the heads imply, and a
validator that lost its disk reads the momentum back from the edge and still reaches the same heads.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import httpx
import jax
import numpy as np
import pytest

from native_peer import StorageConfig, Validator, ValidatorConfig
from native_peer.identity import NodeIdentity
from native_peer.mnist import mlp_learner
from native_peer.models import builtin_model
from protocol.aggregation import flatten
from protocol.clock import ManualClock
from protocol.codec import decode_tensors, encode_tensors
from protocol.envelope import pack_envelope
from protocol.errors import InvalidMessage
from protocol.hashing import content_id
from protocol.head_grid import block_of, block_starts
from protocol.ids import ContentId
from protocol.judging import Submission, judge_window
from protocol.manifests import ExperimentSpec
from protocol.messages import HeadDescriptor
from protocol.model import init_params
from protocol.outer import OuterOptimizer, decode_state, encode_state
from protocol.screening import ACCEPT, PRESETS
from server.serve import BackgroundEdge
from tools.networks import BASELINE, mnist_network

from .support import edge_settings, mnist_trainer

SPEC = builtin_model("mnist-mlp")
NESTEROV = OuterOptimizer("nesterov", 0.7, 0.9)


def _vector(seed: int, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=SPEC.num_params).astype(np.float32).astype(np.float64) * scale


def test_fedavg_takes_the_merge_as_it_is() -> None:
    base, update = _vector(0), _vector(1, 0.01)
    stepped, state = OuterOptimizer().step(base, update, None)
    assert state is None and np.array_equal(stepped, base + update)


def test_nesterov_is_dilocos_outer_step() -> None:
    base, first, second = _vector(0), _vector(1, 0.01), _vector(2, 0.01)
    after_one, m1 = NESTEROV.step(base, first, None)
    assert m1 is not None
    np.testing.assert_allclose(m1, -first, rtol=1e-6)  # m = g = −Δ from zero momentum
    np.testing.assert_allclose(after_one, base - 0.7 * (-first + 0.9 * -first), rtol=1e-6, atol=1e-9)
    after_two, m2 = NESTEROV.step(after_one, second, m1)
    assert m2 is not None
    np.testing.assert_allclose(m2, 0.9 * m1 + -second, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(after_two, after_one - 0.7 * (-second + 0.9 * m2), rtol=1e-6, atol=1e-9)
    again, _ = NESTEROV.step(after_one, second, m1)
    assert again.tobytes() == after_two.tobytes()  # deterministic: what a quorum needs


def test_the_state_is_the_models_float32_tensors() -> None:
    momentum = _vector(3).astype(np.float32).astype(np.float64)
    data = encode_state(SPEC, momentum)
    assert np.array_equal(decode_state(SPEC, data), momentum)
    wrong = encode_tensors({"dense0.kernel": np.zeros((3, 3), np.float32)})
    with pytest.raises(InvalidMessage):
        decode_state(SPEC, wrong)


def test_settings_are_checked() -> None:
    with pytest.raises(InvalidMessage):
        OuterOptimizer("adam")
    with pytest.raises(InvalidMessage):
        OuterOptimizer("nesterov", momentum=1.0)
    spec = ExperimentSpec.from_wire({**_spec_wire(), "outer_optimizer": "nesterov", "outer_learning_rate": 0.5})
    assert spec.outer == OuterOptimizer("nesterov", 0.5, 0.9)
    assert ExperimentSpec.from_wire(_spec_wire()).outer == OuterOptimizer()  # FedAvg when not named
    with pytest.raises(InvalidMessage):
        ExperimentSpec.from_wire({**_spec_wire(), "outer_optimizer": "lion"})


def _spec_wire() -> dict[str, object]:
    """An experiment as a network written before outer optimizers existed would list it."""
    wire = mnist_network(b"\0" * 32).experiment(BASELINE).to_wire()
    return {k: v for k, v in wire.items() if not k.startswith("outer_")}


def _judge(base: dict[str, np.ndarray], deltas: list[float], momentum: np.ndarray | None, *, loss: float):
    """``judge_window`` with the minimal preset over candidates base + d (one per entry), where the
    evaluation's loss is ``loss`` for anything but the base."""
    submissions = [
        Submission(
            f"sha256:{i:064x}",
            f"peer-{i}",
            "native",
            100.0,
            {k: (v + np.float32(d)).astype(np.float32) for k, v in base.items()},
            ACCEPT,
        )
        for i, d in enumerate(deltas)
    ]
    return judge_window(
        SPEC,
        base,
        {"loss": 1.0},
        submissions,
        PRESETS["minimal"],
        lambda params: {"loss": loss, "accuracy": 0.5},
        outer=NESTEROV,
        momentum=momentum,
    )


def test_judge_window_steps_keeps_or_restarts_the_momentum() -> None:
    base = init_params(SPEC, 0)
    flat_base = flatten(SPEC, base)
    momentum = np.full(SPEC.num_params, 0.001)
    decision = _judge(base, [0.01, 0.03], momentum, loss=0.9)
    assert decision.merged is not None and decision.outer_state is not None
    expected, expected_m = NESTEROV.step(flat_base, np.full(SPEC.num_params, 0.02), momentum)
    np.testing.assert_allclose(flatten(SPEC, decision.merged), expected, atol=1e-6)
    np.testing.assert_allclose(decision.outer_state, expected_m, atol=1e-7)
    nothing = _judge(base, [], momentum, loss=0.9)
    assert nothing.merged is None and nothing.outer_state is momentum  # nothing merged: the state stays
    blocked = _judge(base, [0.01], momentum, loss=2.0)  # the step raises the loss past the margin
    assert blocked.merged is None and blocked.outer_state is None  # the momentum restarts


# -- against a real edge ---------------------------------------------------------------------


def _validator(root: Path, index: int, network, edge: BackgroundEdge, clock, dataset_root: Path) -> Validator:
    storage = StorageConfig(root / f"validator-{index}")
    return Validator(mlp_learner(), network, storage, edge.url, dataset_root, ValidatorConfig(clock=clock))


def _current(edge: BackgroundEdge) -> HeadDescriptor:
    return HeadDescriptor.from_wire(httpx.get(f"{edge.url}/v1/experiments/{BASELINE}/head").json())


@pytest.mark.slow
def test_a_quorum_runs_diloco_and_a_validator_without_its_disk_rejoins(tmp_path: Path, dataset_root: Path) -> None:
    identities = [NodeIdentity.load_or_create(tmp_path / f"validator-{i}" / "identity.key") for i in range(3)]
    base_network = mnist_network(identities[0].public_key)
    nesterov = replace(base_network.experiment(BASELINE), outer_optimizer="nesterov")
    network = replace(
        base_network, validator_keys=tuple(i.public_key for i in identities), quorum=2, experiments=(nesterov,)
    )
    (tmp_path / "network.json").write_text(json.dumps(network.to_wire()))
    clock = ManualClock(wall_ms=int(time.time() * 1000))
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge, contextlib.ExitStack() as closing:
        validators = [_validator(tmp_path, i, network, edge, clock, dataset_root) for i in (0, 1)]
        closing.callback(lambda: [validator.close() for validator in validators])  # a failed check leaks none
        for validator in validators:
            validator.ensure_genesis(nesterov)
        trainer = mnist_trainer(network, tmp_path / "trainer", edge.url)
        closing.callback(trainer.close)
        experiment = trainer.experiment(*BASELINE.parts)
        heads = [_current(edge)]
        for window in range(3):
            if window == 2:  # validator 1 loses its disk (all but its key) and starts again
                validators[1].close()
                shutil.rmtree(tmp_path / "validator-1" / "heads")
                (tmp_path / "validator-1" / "validator-state.json").unlink()
                validators[1] = _validator(tmp_path, 1, network, edge, clock, dataset_root)
            trainer.train_window_once(experiment)
            for _ in range(40):
                for validator in validators:
                    validator.poll(nesterov)
                if _current(edge).window > heads[-1].window:
                    break
                clock.advance(5.0)
            head = _current(edge)
            assert head.window == heads[-1].window + 1 and head.merged, "the quorum reached no head"
            assert len(head.signers(network.validator_key_set)) == 2
            heads.append(head)
        momenta = []
        for head in heads[1:]:
            assert head.outer_state is not None
            response = httpx.get(f"{edge.url}/v1/artifacts/{head.outer_state}")
            assert response.status_code == 200
            momenta.append(decode_state(SPEC, response.content))
        params = [
            flatten(SPEC, decode_tensors(httpx.get(f"{edge.url}/v1/artifacts/{h.head_id}").content)[0]) for h in heads
        ]
        # θ₁ = θ₀ − η(g + μ m₁), m₁ = μ m₀ + g: the momentum each head names is the one its step used; the
        # head is that step on the int8 grid (``protocol.head_grid``): within its block's 2^e < 2 max|step| / 127
        assert nesterov.head_grid == "int8"
        previous = np.zeros(SPEC.num_params)
        rate, mu = nesterov.outer.learning_rate, nesterov.outer.momentum
        starts = block_starts([int(np.prod(shape)) for shape in SPEC.shapes.values()])
        for before, after, momentum in zip(params[:-1], params[1:], momenta, strict=True):
            gradient = momentum - mu * previous
            exact = before - rate * (gradient + mu * momentum)
            quantum = 2 * np.maximum.reduceat(np.abs(exact - before), starts) / 127
            assert (np.abs(after - exact) <= quantum[block_of(starts, len(before))] + 2e-5).all()
            assert not np.allclose(after, exact, rtol=0, atol=1e-7)  # on the grid, not the exact step
            previous = momentum


def test_the_edge_takes_a_head_only_after_its_outer_state(tmp_path: Path, dataset_root: Path) -> None:
    identity = NodeIdentity.load_or_create(tmp_path / "validator" / "identity.key")
    network = mnist_network(identity.public_key)
    nesterov = replace(network.experiment(BASELINE), outer_optimizer="nesterov")
    network = replace(network, experiments=(nesterov,))
    (tmp_path / "network.json").write_text(json.dumps(network.to_wire()))
    clock = ManualClock(wall_ms=int(time.time() * 1000))
    with BackgroundEdge(edge_settings(tmp_path, dataset_root)) as edge:
        validator = Validator(
            mlp_learner(),
            network,
            StorageConfig(tmp_path / "validator"),
            edge.url,
            dataset_root,
            ValidatorConfig(clock=clock),
        )
        genesis = validator.ensure_genesis(nesterov)
        state = encode_state(SPEC, np.ones(SPEC.num_params))
        params = validator.learner(nesterov).init(jax.random.PRNGKey(1))
        head, artifact = validator._sign_head(nesterov, params, genesis, (), 0, {"loss": 1.0, "accuracy": 0.1})
        named = replace(head, outer_state=ContentId(content_id(state))).signed(validator.identity)
        path = f"{edge.url}/v1/experiments/{BASELINE}"
        refused = httpx.post(f"{path}/heads", content=pack_envelope(named.to_wire(), artifact))
        assert refused.status_code == 409 and "outer state" in refused.json()["detail"]
        wrong = httpx.post(f"{path}/outer-states", content=pack_envelope(named.to_wire(), state + b"x"))
        assert wrong.status_code == 422 and wrong.json()["error"] == "IntegrityError"  # not the bytes it names
        unnamed = httpx.post(f"{path}/outer-states", content=pack_envelope(head.to_wire(), state))
        assert unnamed.status_code == 400 and "names no outer optimizer state" in unnamed.json()["detail"]
        stored = httpx.post(f"{path}/outer-states", content=pack_envelope(named.to_wire(), state))
        assert stored.status_code == 201 and stored.json() == {"outer_state": named.outer_state}
        assert httpx.post(f"{path}/heads", content=pack_envelope(named.to_wire(), artifact)).status_code == 201
        served = httpx.get(f"{edge.url}/v1/artifacts/{named.outer_state}")
        assert served.status_code == 200 and served.content == state
        validator.close()
