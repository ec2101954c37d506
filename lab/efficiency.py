"""What a network run cost, from its public records and its trainers' outcome logs: the one place the
demo summary and ``benchmarks.network_efficiency`` compute samples, utilization and bytes from.

    samples_until(candidates, heads, window, batch)  examples trainers trained on heads before
                                                     ``window``: each candidate's (rejected ones too)
                                                     leased examples plus the steps it carried
    trained_samples_until(outcomes, at_ms)           examples one native trainer trained on in one
                                                     experiment by ``at_ms``, dropped work included
    validator_samples(heads, window, per_anchor,     examples the validator trained on for those heads:
                      every)                         its anchor updates (``protocol.judging``)
    utilization(outcomes)                            a trainer's seconds in training steps / wall
                                                     seconds, from its first to its last window
    fp32_bytes(model)                                a full float32 model's tensor bytes
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from protocol.judging import anchor_window
from protocol.messages import Candidate, HeadDescriptor
from protocol.model import ModelSpec

__all__ = ["fp32_bytes", "samples_until", "trained_samples_until", "utilization", "validator_samples"]


def samples_until(
    candidates: Iterable[Candidate], heads: Sequence[HeadDescriptor], window: int, batch_size: int
) -> int:
    """Samples trainers trained on heads of windows before ``window`` (what it took to get there):
    every candidate's, accepted or not; work a trainer dropped or never published is not counted."""
    window_of = {head.head_id: head.window for head in heads}
    return sum(
        c.examples + int(c.metrics.get("carried_steps", 0.0)) * batch_size
        for c in candidates
        if window_of.get(c.base_head, window) < window
    )


def trained_samples_until(outcomes: Sequence[dict[str, Any]], at_ms: int) -> int:
    """Every example one trainer trained on in one experiment (``trained_samples`` of its outcomes in
    that experiment: its windows, work carried over or dropped) by its last outcome at or before
    ``at_ms``, summed over its process's restarts."""
    total, previous = 0, 0
    for record in outcomes:
        if record["at_ms"] > at_ms:
            break
        if record["trained_samples"] < previous:  # a restarted process counts from zero again
            total += previous
        previous = record["trained_samples"]
    return total + previous


def validator_samples(heads: Sequence[HeadDescriptor], window: int, per_anchor: int, every: int) -> int:
    """Samples the validator trained on for the heads of windows before ``window``: its own update,
    ``per_anchor`` examples for each anchor head among them (every ``every``-th window,
    ``protocol.judging.anchor_window``; 0 examples for an experiment judged without one)."""
    return per_anchor * sum(
        1 for head in heads if head.window < window and anchor_window(head.window, every) == head.window
    )


def utilization(outcomes: Sequence[dict[str, Any]]) -> float | None:
    """Compute seconds over wall seconds between a trainer's first and last window since its process
    last started (None before 3 such windows)."""
    starts = [i for i in range(1, len(outcomes)) if outcomes[i]["wall_s"] < outcomes[i - 1]["wall_s"]]
    run = outcomes[starts[-1] if starts else 0 :]
    if len(run) < 3:
        return None
    first, last = run[0], run[-1]
    return float((last["compute_s"] - first["compute_s"]) / max(last["wall_s"] - first["wall_s"], 1e-9))


def fp32_bytes(model: ModelSpec) -> int:
    return 4 * model.num_params
