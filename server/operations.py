"""What an operator's probes and Prometheus read: liveness, readiness, and metrics computed from the store.

    GET /livez     200 while the process answers (a supervisor restarts it otherwise)
    GET /readyz    200 once the edge can serve its traffic: the store answers and every experiment's
                   dataset is loaded; 503 with the failing checks otherwise. Its body also says whether
                   the Pyodide runtime is there and each experiment's current window.

``StoreCollector`` adds to ``/metrics``, read from the store at each scrape (so they survive restarts
and agree with what the edge serves), next to the counters of ``server.metrics``:

    dtn_window{experiment}                  window of the current head (-1: no head yet)
    dtn_head_age_seconds{experiment}        seconds since the current head was signed
    dtn_window_leases{experiment}           live leases on the current head
    dtn_verdicts_total{experiment,decision} verdicts published, accepted or rejected
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Request
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .responses import JSON
from .state import EdgeState

__all__ = ["StoreCollector", "readiness", "register_collector", "router"]

router = APIRouter(tags=["portal"])


@router.get("/livez")
async def livez() -> JSON:
    """Liveness: the process and its event loop answer."""
    return JSON({"live": True}, headers={"cache-control": "no-store"})


@router.get("/readyz", responses={503: {"description": "not ready: the failing checks"}})
async def readyz(request: Request) -> JSON:
    """Readiness: 200 when the edge can serve (store, datasets), else 503; the checks either way."""
    state: EdgeState | None = getattr(request.app.state, "edge", None)
    ready, checks = readiness(state)
    return JSON({"ready": ready, **checks}, status_code=200 if ready else 503, headers={"cache-control": "no-store"})


def readiness(state: EdgeState | None) -> tuple[bool, dict[str, object]]:
    """Whether ``state`` can serve, and what was checked: ``failing`` lists what is not."""
    if state is None:
        return False, {"failing": ["starting"]}
    failing: list[str] = []
    windows: dict[str, int | None] = {}
    try:
        for spec in state.network.experiments:
            head = state.store.current_head(spec.key)
            windows[str(spec.key)] = None if head is None else head.window
    except Exception as exc:  # any store failure means not ready
        failing.append(f"store: {type(exc).__name__}")
    missing = sorted({spec.dataset_id for spec in state.network.experiments} - set(state.datasets))
    failing += [f"dataset {dataset_id} not loaded" for dataset_id in missing]
    pyodide = (state.settings.pyodide_dir / "pyodide-lock.json").is_file()
    return not failing, {
        "failing": failing,
        "network_id": state.network.network_id,
        "public_url": state.settings.public_url,
        "pyodide_runtime": pyodide,
        "windows": windows,
    }


class StoreCollector(Collector):
    """Gauges and counters of the network's progress, read from the edge's store at each scrape."""

    def __init__(self, state: EdgeState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        window = GaugeMetricFamily("dtn_window", "Window of the current head (-1: no head yet)", labels=["experiment"])
        age = GaugeMetricFamily(
            "dtn_head_age_seconds", "Seconds since the current head was signed", labels=["experiment"]
        )
        leases = GaugeMetricFamily("dtn_window_leases", "Live leases on the current head", labels=["experiment"])
        verdicts = CounterMetricFamily(
            "dtn_verdicts", "Verdicts published, by decision", labels=["experiment", "decision"]
        )
        now_ms = self.state.clock.now_ms()
        for spec in self.state.network.experiments:
            head = self.state.store.current_head(spec.key)
            window.add_metric([spec.key], -1 if head is None else head.window)
            if head is not None:
                age.add_metric([spec.key], max(0, now_ms - head.created_at_ms) / 1000)
                live = [
                    lease for lease in self.state.store.leases(spec.key, head.head_id) if lease.expires_at_ms > now_ms
                ]
                leases.add_metric([spec.key], len(live))
            for decision, count in self.state.store.verdict_counts(spec.key).items():
                verdicts.add_metric([spec.key, decision], count)
        yield from (window, age, leases, verdicts)


def register_collector(state: EdgeState) -> None:
    """Add ``StoreCollector`` to the edge's metrics registry (once, at start-up)."""
    state.metrics.registry.register(StoreCollector(state))
