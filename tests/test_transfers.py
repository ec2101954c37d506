"""The staged-upload and ranged-download plans (``protocol.transfers``), pure: a sequence of answers in,
the sequence of requests (and waits) out. Native and browser clients drive these same plans."""

from __future__ import annotations

import json

import pytest

from protocol.errors import IntegrityError, InvalidMessage
from protocol.hashing import content_id
from protocol.ids import ExperimentKey
from protocol.transfers import (
    Done,
    Exchange,
    RangedDownload,
    Request,
    Response,
    RetryPolicy,
    StagedUpload,
    TransferFailed,
    Wait,
)
from protocol.uploads import UPLOAD_HEADER

KEY = ExperimentKey.parse("study/exp/rev-1")
ARTIFACT = bytes(range(250))  # 3 chunks of 100
CID = content_id(ARTIFACT)
STAGE = f"/v1/experiments/{KEY}/uploads/{CID}"
PUBLISH = f"/v1/experiments/{KEY}/candidates"
ENVELOPE = b"descriptor without its artifact"
BROKEN = "connection reset"  # an answer that never came


def held(offset: int, chunk_bytes: int = 100) -> Response:
    total = len(ARTIFACT)
    body = {"offset": offset, "total": total, "complete": offset == total, "chunk_bytes": chunk_bytes}
    return Response(200, {"upload-offset": str(offset)}, json.dumps(body).encode())


def refused(status: int, error: str = "Conflict") -> Response:
    return Response(status, {}, json.dumps({"error": error, "detail": "no"}).encode())


PUBLISHED = Response(201, {}, b'{"candidate_id": "c"}')


def drive(
    plan: StagedUpload | RangedDownload | Exchange, answers: list[Response | str], steps: list[str] | None = None
) -> tuple[list[str], object]:
    """Drive ``plan`` with ``answers`` (a string: the transfer broke): what it asked, in short, into
    ``steps``, and its result; every answer must be used."""
    steps = [] if steps is None else steps
    pending = list(answers)
    while True:
        step = plan.next_step()
        if isinstance(step, Done):
            assert not pending, f"answers left over: {pending}"
            return steps, step.value
        if isinstance(step, Wait):
            steps.append(f"wait {step.seconds}")
            continue
        steps.append(short(step))
        answer = pending.pop(0)
        if isinstance(answer, str):
            plan.broken(answer)
        else:
            plan.receive(answer)


def short(request: Request) -> str:
    if request.method == "PUT":
        assert request.headers[UPLOAD_HEADER] == CID and len(request.body or b"") <= 100
        return "PUT " + request.headers["content-range"].removeprefix("bytes ")
    if request.path == STAGE or request.path == PUBLISH:
        assert request.headers[UPLOAD_HEADER] == CID  # every request of a stage names it
        assert request.method != "POST" or request.body == ENVELOPE
    return f"{request.method} {request.headers.get('range', '')}".strip()


def upload(**policy: int) -> StagedUpload:
    return StagedUpload(KEY, ARTIFACT, PUBLISH, ENVELOPE, chunk_bytes=100, policy=RetryPolicy(**policy))


CHUNKS = ["PUT 0-99/250", "PUT 100-199/250", "PUT 200-249/250"]

UPLOADS = {
    "in order": (
        [held(0), held(100), held(200), held(250), PUBLISHED],
        ["GET", *CHUNKS, "POST"],
    ),
    "from what the edge holds already": (
        [held(200), held(250), PUBLISHED],
        ["GET", CHUNKS[2], "POST"],
    ),
    "in the client's chunks when the edge takes larger ones than the artifact": (
        [held(0, chunk_bytes=4 << 20), held(100), held(200), held(250), PUBLISHED],
        ["GET", *CHUNKS, "POST"],
    ),
    "in the edge's chunks when they are smaller": (
        [held(150, chunk_bytes=50), held(200), held(250), PUBLISHED],
        ["GET", "PUT 150-199/250", "PUT 200-249/250", "POST"],
    ),
    "a chunk that broke is sent again after a wait": (
        [held(0), BROKEN, held(100), held(200), held(250), PUBLISHED],
        ["GET", CHUNKS[0], "wait 0.5", CHUNKS[0], CHUNKS[1], CHUNKS[2], "POST"],
    ),
    "a lost answer: the chunk again, its 409, then on from the edge's offset": (
        [held(0), held(100), BROKEN, refused(409), held(200), held(250), PUBLISHED],
        ["GET", CHUNKS[0], CHUNKS[1], "wait 0.5", CHUNKS[1], "GET", CHUNKS[2], "POST"],
    ),
    "a balancer's 502 and 503 wait longer each time, then reset": (
        [held(0), refused(502), refused(503), held(100), BROKEN, held(200), held(250), PUBLISHED],
        ["GET", CHUNKS[0], "wait 0.5", CHUNKS[0], "wait 1.0", CHUNKS[0], CHUNKS[1], "wait 0.5", *CHUNKS[1:], "POST"],
    ),
    "a publish that finds no stage stages again where it landed": (
        [
            held(0),
            held(100),
            held(200),
            held(250),
            refused(404, "NotFound"),
            held(0),
            held(100),
            held(200),
            held(250),
            PUBLISHED,
        ],
        ["GET", *CHUNKS, "POST", "GET", *CHUNKS, "POST"],
    ),
    "a publish whose answer was lost is sent again": (
        [held(250), BROKEN, PUBLISHED],
        ["GET", "POST", "wait 0.5", "POST"],
    ),
}


@pytest.mark.parametrize("answers, asked", UPLOADS.values(), ids=UPLOADS.keys())
def test_a_staged_upload_asks_in_this_order(answers: list[Response | str], asked: list[str]) -> None:
    steps, result = drive(upload(), answers)
    assert steps == asked
    assert result == PUBLISHED


GIVING_UP = {
    "transfers failing 4 times in a row": (
        [held(0), BROKEN, BROKEN, refused(503), BROKEN],
        ["GET", CHUNKS[0], "wait 0.5", CHUNKS[0], "wait 1.0", CHUNKS[0], "wait 2.0", CHUNKS[0]],
        None,
    ),
    "a fourth 409 on one upload": (
        [held(0), refused(409), held(0), refused(409), held(0), refused(409), held(0), refused(409)],
        ["GET", CHUNKS[0], "GET", CHUNKS[0], "GET", CHUNKS[0], "GET", CHUNKS[0]],
        409,
    ),
    "a fourth publish that finds no stage": (
        [held(250), refused(409), held(250), refused(404), held(250), refused(404), held(250), refused(409)],
        ["GET", "POST"] * 4,
        409,
    ),
    "a chunk refused for good": (
        [held(0), refused(413, "TooLarge")],
        ["GET", CHUNKS[0]],
        413,
    ),
    "a publish refused for good": (
        [held(250), refused(422, "IntegrityError")],
        ["GET", "POST"],
        422,
    ),
    "an edge that takes no stages": (
        [refused(403, "Forbidden")],
        ["GET"],
        403,
    ),
}


@pytest.mark.parametrize("answers, asked, status", GIVING_UP.values(), ids=GIVING_UP.keys())
def test_a_staged_upload_gives_up_after_its_budget_or_a_refusal(
    answers: list[Response | str], asked: list[str], status: int | None
) -> None:
    steps: list[str] = []
    with pytest.raises(TransferFailed) as failed:
        drive(upload(), answers, steps)
    assert steps == asked
    assert (failed.value.response.status if failed.value.response else None) == status
    assert str(CID) in str(failed.value)


def test_the_retry_budget_is_the_policy_s() -> None:
    plan = upload(tries=1, conflicts=0, restages=0)
    with pytest.raises(TransferFailed):
        drive(plan, [held(0), BROKEN])
    with pytest.raises(TransferFailed):
        drive(upload(conflicts=0), [held(0), refused(409)])
    assert RetryPolicy.retrying(3) == RetryPolicy()  # the native client's default retries


def test_an_offset_the_artifact_cannot_have_is_invalid() -> None:
    with pytest.raises(InvalidMessage):
        drive(upload(), [held(300)])
    with pytest.raises(InvalidMessage):
        drive(upload(), [held(0, chunk_bytes=0)])
    with pytest.raises(InvalidMessage):
        drive(upload(), [Response(200, {}, b"not json")])


# -- ranged downloads ---------------------------------------------------------------------------
HEAD = bytes(range(256)) * 2  # 512 bytes
HEAD_ID = content_id(HEAD)


def part(start: int, end: int, data: bytes = HEAD) -> Response:
    """A 206 of ``data[start:end]``."""
    return Response(206, {"content-range": f"bytes {start}-{end - 1}/{len(data)}"}, data[start:end])


def download(piece_bytes: int | None = None, have: bytes = b"") -> RangedDownload:
    return RangedDownload(f"/v1/artifacts/{HEAD_ID}", HEAD_ID, have=have, piece_bytes=piece_bytes)


DOWNLOADS = {
    "whole": (None, b"", [Response(200, {}, HEAD)], ["GET"]),
    "from a partial file": (None, HEAD[:100], [part(100, 512)], ["GET bytes=100-"]),
    "a 200 to a Range request replaces what was held": (
        None,
        HEAD[:100],
        [Response(200, {}, HEAD)],
        ["GET bytes=100-"],
    ),
    "in pieces": (
        200,
        b"",
        [part(0, 200), part(200, 400), part(400, 512)],
        ["GET bytes=0-199", "GET bytes=200-399", "GET bytes=400-599"],
    ),
    "a broken piece is asked again, the pieces before it kept": (
        200,
        b"",
        [part(0, 200), BROKEN, part(200, 400), part(400, 512)],
        ["GET bytes=0-199", "GET bytes=200-399", "wait 0.5", "GET bytes=200-399", "GET bytes=400-599"],
    ),
    "an answer cut short resumes after its last byte": (
        None,
        b"",
        [part(0, 300), part(300, 512)],
        ["GET", "GET bytes=300-"],
    ),
}


@pytest.mark.parametrize("piece, have, answers, asked", DOWNLOADS.values(), ids=DOWNLOADS.keys())
def test_a_ranged_download_resumes_and_checks_the_content_id(
    piece: int | None, have: bytes, answers: list[Response | str], asked: list[str]
) -> None:
    steps, data = drive(download(piece, have), answers)
    assert steps == asked and data == HEAD


def test_a_stream_that_breaks_resumes_from_the_bytes_that_arrived() -> None:
    plan = download()
    assert plan.next_step() == Request("GET", f"/v1/artifacts/{HEAD_ID}", {})
    assert plan.begin(200, {}) == 0
    plan.feed(HEAD[:64])
    plan.feed(HEAD[64:128])
    plan.broken("read timeout")
    assert plan.next_step() == Wait(0.5, "read timeout") and plan.have == 128
    assert plan.next_step().headers == {"range": "bytes=128-"}  # type: ignore[union-attr]
    assert plan.begin(206, {"content-range": "bytes 128-511/512"}) == 128  # appended where it starts
    plan.feed(HEAD[128:])
    plan.end()
    assert plan.next_step() == Done(HEAD)


def test_a_download_whose_bytes_are_not_its_content_id_fails_and_keeps_nothing() -> None:
    plan = download(have=b"\xff" * 100)
    with pytest.raises(IntegrityError):
        drive(plan, [part(100, 512)])
    assert plan.have == 0  # a partial file of wrong bytes is not resumed


def test_a_download_gives_up_after_its_budget_or_a_refusal() -> None:
    with pytest.raises(TransferFailed) as failed:
        drive(download(), [BROKEN, BROKEN, refused(504), BROKEN])
    assert failed.value.response is None and "4 tries in a row" in str(failed.value)
    with pytest.raises(TransferFailed) as failed:
        drive(download(), [refused(404, "NotFound")])
    assert failed.value.response is not None and failed.value.response.status == 404
    with pytest.raises(InvalidMessage):  # bytes from elsewhere than asked
        drive(download(200), [part(0, 200), part(300, 400)])


def test_an_exchange_retries_only_failed_transfers() -> None:
    request = Request("POST", "/v1/leases", {}, b"{}")
    steps, answer = drive(Exchange(request), [BROKEN, refused(502), refused(409)])
    assert steps == ["POST", "wait 0.5", "POST", "wait 1.0", "POST"]
    assert answer == refused(409)  # a refusal is the driver's to read
    with pytest.raises(TransferFailed):
        drive(Exchange(request, RetryPolicy(tries=2)), [BROKEN, BROKEN])
