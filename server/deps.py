"""FastAPI dependencies shared by the route modules."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from protocol.errors import TooLarge
from protocol.ids import ExperimentId, ExperimentKey, RevisionId, StudyId

from .leasing import LeaseIssuer
from .state import EdgeState

__all__ = ["Experiment", "Issuer", "State", "read_body"]


def _state(request: Request) -> EdgeState:
    state: EdgeState = request.app.state.edge
    return state


def _issuer(request: Request) -> LeaseIssuer:
    issuer: LeaseIssuer = request.app.state.issuer
    return issuer


def _experiment(
    study: Annotated[str, Path(max_length=64)],
    experiment: Annotated[str, Path(max_length=64)],
    revision: Annotated[str, Path(max_length=64)],
) -> ExperimentKey:
    return ExperimentKey(StudyId(study), ExperimentId(experiment), RevisionId(revision))


State = Annotated[EdgeState, Depends(_state)]
Issuer = Annotated[LeaseIssuer, Depends(_issuer)]
Experiment = Annotated[ExperimentKey, Depends(_experiment)]


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (``TooLarge``) as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"body of {declared} bytes exceeds {limit}")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
