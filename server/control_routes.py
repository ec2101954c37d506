"""Run control over HTTP: an order a quorum of the network's validators signed
(``protocol.run_control``), submitted by anyone, applied, kept in the store and published.

    POST {experiment}/control   a ``SignedRunControl`` (JSON, at most ``MAX_CONTROL_BYTES``)
    GET  {experiment}/control   the experiment's ``RunState`` and every order applied to it

The edge enforces an order but cannot originate one: its key is not a validator's. Refusals, each
with its reason: 400 a malformed order or one for another experiment than the path's, 401 fewer than
``quorum`` valid validator signatures or an order for another network, 404 an experiment this network
does not have or a rollback to a head it never made canonical, 409 a replayed sequence, an order
after ``stop`` or a rollback of an experiment not paused, 413 a body over the limit.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from protocol.errors import InvalidMessage, SignatureError, TooLarge
from protocol.ids import ExperimentKey
from protocol.run_control import SignedRunControl

from .deps import Experiment, State, body_doc, read_json
from .errors import Conflict, NotFound, documented
from .experiment_routes import EXPERIMENT
from .intake import accept_order, applied_order
from .responses import JSON
from .state import EdgeState

__all__ = ["MAX_CONTROL_BYTES", "control_view", "router"]

router = APIRouter(prefix="/v1", tags=["run control"])

MAX_CONTROL_BYTES = 64 << 10  # an order and 64 signatures take about 10 KiB


@router.post(
    f"{EXPERIMENT}/control",
    status_code=201,
    responses=documented(InvalidMessage, SignatureError, NotFound, Conflict, TooLarge),
    openapi_extra=body_doc("application/json", "a SignedRunControl: the order and its validators' signatures"),
)
async def submit_order(key: Experiment, state: State, request: Request) -> JSON:
    """Apply a run-control order signed by a quorum of the network's validators
    (``server.intake.accept_order``); answers the state it leaves and publishes the order on the
    ``control`` topic."""
    state.experiment(key)
    signed = SignedRunControl.from_wire(await read_json(request, MAX_CONTROL_BYTES))
    return JSON(await accept_order(state, signed, route=key), status_code=201)


@router.get(f"{EXPERIMENT}/control", responses=documented(InvalidMessage, NotFound))
async def run_control(key: Experiment, state: State) -> JSON:
    """``control_view``: whether the experiment is paused or stopped, and the orders applied to it."""
    state.experiment(key)
    return JSON(control_view(state, key))


def control_view(state: EdgeState, key: ExperimentKey) -> dict[str, Any]:
    """``{"state": RunState, "orders": [applied_order, ...]}`` of ``key``, the orders in sequence."""
    orders = [applied_order(state, signed, at) for signed, at in state.store.run_orders(key)]
    return {"state": state.store.run_state(key).to_wire(), "orders": orders}
