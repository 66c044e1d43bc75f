"""OpenAI's synchronous routes, served by the pipeline: ``POST /v1/chat/completions`` and
``POST /v1/completions`` (not streamed) make one durable job each, of high priority (admitted
up to the hard threshold without waiting), through the same admission as ``POST /v1/jobs``
(the same 429 and Retry-After), and wait for it as ``?wait=`` does. The deadline is
``X-Sluicegate-Deadline-S`` seconds, else ``sync_deadline_s``: past it the answer is 504
``deadline_exceeded`` and the pipeline drops the job as expired. A caller that goes away
abandons its job (``disconnected``). ``GET /v1/models`` lists the served models."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from producers.api import openapi
from producers.api.deps import AppSettings, Groups, Overviews, Pools, Tenant, Waits
from producers.api.jobs import admitted
from producers.api.overview import STALE_INTERVALS
from producers.api.pools import pool_state
from producers.files.checks import validation_message
from producers.jobs.submission import new_job
from schemas import constants
from schemas.api import SubmitJob
from schemas.batches.lines import RequestLine, line_request
from schemas.batches.output import response_body
from schemas.completions import (
    CompletionFailed,
    DeadlineExceeded,
    InvalidDeadline,
    Model,
    ModelList,
    StreamUnsupported,
)
from schemas.errors import InvalidJson, InvalidRequest
from schemas.jobs import Job, Priority
from schemas.sampling import check_model
from schemas.states import JobState

# Past the job's deadline, how long the request still waits for the pipeline's end of it.
GRACE_S = 1.0
_STARTED = int(time.time())
_ERRORS = openapi.errors(400, 401, 404, 408, 413, 422, 429, 502, 503, 504)
_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {"type": "object", "description": "OpenAI's"}}},
}

router = APIRouter(tags=["openai"], responses=_ERRORS)

DeadlineHeader = Annotated[
    float | None,
    Header(
        alias=constants.HEADER_DEADLINE_S,
        description="Seconds the completion may take (at most max_wait_s); default "
        "sync_deadline_s. Past it: 504 deadline_exceeded, and the job is dropped as expired",
    ),
]


async def _json(request: Request) -> dict[str, Any]:
    try:
        value = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise InvalidJson("the body is not valid JSON") from None
    if not isinstance(value, dict):
        raise InvalidRequest("the body must be a JSON object")
    return value


def _submit(url: str, body: dict[str, Any], deadline_s: float) -> SubmitJob:
    """The job a synchronous request asks for, as a submit of high priority."""
    if body.get("stream"):
        raise StreamUnsupported(
            f"stream is not supported: Sluicegate answers {url} whole once its job ended; "
            "send it without stream (or stream: false), or many requests as a batch "
            "(POST /v1/files with purpose batch, then POST /v1/batches)"
        )
    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    try:
        asked = line_request(RequestLine(custom_id="sync", method="POST", url=url, body=body))
    except ValidationError as exc:
        raise InvalidRequest(validation_message(exc)) from None
    fields = {
        "kind": asked.kind,
        "input": asked.input,
        "max_tokens": asked.max_tokens,
        "ttl_s": deadline_s,
        "priority": Priority.HIGH,
        "abandon_on_disconnect": True,
        **(asked.params or {}),
    }
    try:
        return SubmitJob.model_validate(fields)
    except ValidationError as exc:
        raise InvalidRequest(validation_message(exc)) from None


def _deadline_s(given: float | None, default_s: float, max_wait_s: float) -> float:
    deadline_s = default_s if given is None else given
    if not 0 < deadline_s <= max_wait_s:
        raise InvalidDeadline(
            f"{constants.HEADER_DEADLINE_S} must be more than 0 and at most {max_wait_s:g} s"
        )
    return deadline_s


def _answer(url: str, job: Job) -> JSONResponse:
    headers = {constants.HEADER_JOB_ID: job.id}
    if job.state is JobState.SUCCEEDED:
        return JSONResponse(response_body(url, job), headers=headers)
    details = {"job_id": job.id, "state": job.state.value, "reason": (job.error or {}).get("code")}
    if not job.state.terminal or job.state is JobState.EXPIRED:
        raise DeadlineExceeded(
            f"the deadline passed before job {job.id} ended; the pipeline drops it as expired",
            details=details,
        )
    message = str((job.error or {}).get("message", f"the job ended {job.state.value}"))
    raise CompletionFailed(f"job {job.id} ended {job.state.value}: {message}", details=details)


async def _complete(
    url: str,
    request: Request,
    tenant: str,
    settings: AppSettings,
    pools: Pools,
    groups: Groups,
    waiting: Waits,
    deadline_header: float | None,
) -> JSONResponse:
    deadline_s = _deadline_s(deadline_header, settings.sync_deadline_s, settings.max_wait_s)
    submit = _submit(url, await _json(request), deadline_s)
    now = datetime.now(UTC)
    new = new_job(submit, tenant=tenant, header_key=None, now=now, api=settings.api)
    job, _ = await admitted(pools, groups, new, now)
    job = await waiting.job(tenant, job.id, deadline_s + GRACE_S, request.receive)
    return _answer(url, job)


@router.post(
    "/v1/chat/completions",
    summary="A chat completion, served as one durable job (not streamed)",
    openapi_extra={"requestBody": _BODY},
)
async def chat_completions(
    request: Request,
    tenant: Tenant,
    settings: AppSettings,
    pools: Pools,
    groups: Groups,
    waiting: Waits,
    deadline: DeadlineHeader = None,
) -> JSONResponse:
    """OpenAI's ``chat.completion`` with ``usage``, once the job ended; its id is in
    ``X-Sluicegate-Job-Id`` (and ``GET /v1/jobs/{id}``)."""
    args = (request, tenant, settings, pools, groups, waiting, deadline)
    return await _complete("/v1/chat/completions", *args)


@router.post(
    "/v1/completions",
    summary="A text completion, served as one durable job (not streamed)",
    openapi_extra={"requestBody": _BODY},
)
async def completions(
    request: Request,
    tenant: Tenant,
    settings: AppSettings,
    pools: Pools,
    groups: Groups,
    waiting: Waits,
    deadline: DeadlineHeader = None,
) -> JSONResponse:
    """OpenAI's ``text_completion`` with ``usage``, once the job ended."""
    args = (request, tenant, settings, pools, groups, waiting, deadline)
    return await _complete("/v1/completions", *args)


@router.get("/v1/models", response_model=ModelList, summary="List the served models")
async def list_models(
    settings: AppSettings, pools: Pools, overviews: Overviews, _: Tenant
) -> ModelList:
    """The names a request's ``model`` may give (a pool each, with ``SLUICEGATE_POOLS``;
    else setting ``models``), each with its pool's state (``pool``)."""
    workers = await overviews.workers()
    stale_s = STALE_INTERVALS * settings.worker_report_s
    return ModelList(
        data=[
            Model(id=name, created=_STARTED, pool=pool_state(pools.of(name), workers, stale_s))
            for name in settings.api.models
        ]
    )


@router.get("/v1/models/{model:path}", response_model=Model, summary="Read a served model")
async def get_model(
    model: str, settings: AppSettings, pools: Pools, overviews: Overviews, _: Tenant
) -> Model:
    check_model(model, settings.api.models)
    stale_s = STALE_INTERVALS * settings.worker_report_s
    state = pool_state(pools.of(model), await overviews.workers(), stale_s)
    return Model(id=model, created=_STARTED, pool=state)
