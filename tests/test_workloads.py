"""The workloads run's pieces (``python -m lab workloads`` itself trains for many minutes and is run by
hand; its figures are in docs/results/): its network file, the language model's sampler and the summary."""

from __future__ import annotations

import numpy as np

from lab.workloads import CNN, LM, WORKLOADS_NETWORK, sample_text, summary_markdown
from native_peer.models import builtin_model
from protocol.model import init_params
from tools.networks import read_experiments


def test_the_workloads_network_runs_the_cnn_and_the_language_model() -> None:
    specs = {spec.key: spec for spec in read_experiments(WORKLOADS_NETWORK)}
    assert (specs[CNN].model, specs[CNN].dataset_id) == (builtin_model("mnist-cnn"), "mnist")
    assert (specs[LM].model, specs[LM].dataset_id) == (builtin_model("char-lm"), "pystdlib")


def test_the_sampler_continues_the_prompt_and_is_reproducible() -> None:
    model = builtin_model("char-lm")
    params = init_params(model, 3)
    text = sample_text(model, params, b"def ", 80, seed=1)
    assert text.startswith("def ") and text == sample_text(model, params, b"def ", 80, seed=1)
    assert text != sample_text(model, params, b"def ", 80, seed=2)
    # a prompt longer than the context (64 bytes) still works: the window slides over its end
    long_prompt = bytes(np.random.default_rng(0).integers(32, 127, 200, dtype=np.uint8))
    assert sample_text(model, params, long_prompt, 10).startswith(long_prompt.decode())


def test_the_summary_reports_accuracy_and_bits_per_character() -> None:
    summary = {
        "all_checks_passed": False,
        "wall_time_s": 600.0,
        "browser": True,
        "experiments": {
            str(CNN): {
                "model": "mnist-cnn",
                "params": 105_000,
                "windows": 20,
                "final": {"test_accuracy": 0.9912},
                "accepted": 40,
                "rejected": 1,
                "rejected_by_reason": {"stale_base": 1},
                "accepted_against_reference": 3,
                "browser_accepted": 9,
            },
            str(LM): {
                "model": "char-lm",
                "params": 137_000,
                "windows": 20,
                "final": {"val_bits_per_char": 2.71, "test_bits_per_char": 2.75},
                "accepted": 30,
                "rejected": 2,
                "rejected_by_reason": {"untrusted_direction": 2},
                "accepted_against_reference": 0,
                "browser_accepted": 5,
            },
        },
        "checks": {"cnn_reached_target": True, "lm_bits_per_char_fell": False},
        "lm_sample": "def f(x):\n    return x",
    }
    text = summary_markdown(summary)
    assert "CHECKS FAILED" in text and "| lm_bits_per_char_fell | FAIL |" in text
    assert "test accuracy 0.9912" in text and "val 2.710 / test 2.750 bits per char" in text
    assert "40 / 1 (3 accepted against the reference) | 1 stale_base |" in text and "| 2 untrusted_direction |" in text
    assert "def f(x):" in text
    # the CNN alone (``--workloads cnn``): no language model, no sample
    del summary["experiments"][str(LM)]
    summary.update(lm_sample=None, checks={"cnn_reached_target": True}, all_checks_passed=True, target_accuracy=0.99)
    summary["experiments"][str(CNN)].update(best_test_accuracy=0.9921, first_window_at_target=17)
    text = summary_markdown(summary)
    assert "all checks passed" in text and "char-lm" not in text and "language model" not in text
    assert "test accuracy 0.9912 (best 0.9921; 0.99 from window 17)" in text
