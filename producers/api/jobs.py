"""The job routes: submit, list, read (``?wait=`` to long-poll), heartbeat, cancel."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.datastructures import State
from starlette.types import Receive

from plumbing.retry import IN_REQUEST, retrying
from plumbing.settings import Settings
from plumbing.settings.api import ApiSettings
from producers.api import openapi
from producers.api.deps import (
    AppSettings,
    CallerOf,
    Jobs,
    Monitor,
    Tenant,
    Waits,
    Webhooks,
)
from producers.api.pools import PoolRouter
from producers.api.waiting import Waiting, wait_limit
from producers.jobs import status
from producers.jobs.group_commit import GroupCommit
from producers.jobs.submission import new_job
from producers.metrics import SUBMITTED
from schemas import constants
from schemas.api import JobList, JobView, SubmitJob, SubmitResponse
from schemas.constants import DEFAULT_MODEL
from schemas.errors import JobNotFound
from schemas.jobs import Job, JobKind, NewJob, estimate_tokens
from schemas.states import JobState
from schemas.timeline import JobTimeline

# Pages of GET /v1/jobs.
DEFAULT_PAGE = 100
MAX_PAGE = 1000
# A ?wait= that ran out before the job ended: poll again (or wait again) in this long.
WAIT_RETRY_AFTER_S = 1

_ERRORS = openapi.errors(400, 401, 403, 404, 408, 409, 413, 422, 429, 503)

WaitQuery = Annotated[
    float | None,
    Query(
        gt=0,
        description="Hold the request up to this many seconds (at most max_wait_s) for the job "
        "to end. POST: 200 with the job if it ended, else 202 with the job and Retry-After.",
    ),
]

# No prefix and no tags: the paths and the OpenAPI document are those of routes on the app.
router = APIRouter()


def _job_id(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise JobNotFound(f"no job {value}") from None


def _status_url(job_id: str) -> str:
    return f"/v1/jobs/{job_id}"


def stored_answer(job: Job, created: bool) -> tuple[int, SubmitResponse, dict[str, str]]:
    """A submit's answer once its job is stored: 202 (or 200, a replay), the body and the
    headers (Location; Idempotent-Replayed on a replay)."""
    headers = {"Location": _status_url(job.id)}
    if not created:
        headers[constants.HEADER_IDEMPOTENT_REPLAY] = "true"
    answer = SubmitResponse(
        id=job.id,
        state=job.state,
        deadline=job.deadline,
        created_at=job.created_at,
        status_url=_status_url(job.id),
    )
    return (202 if created else 200), answer, headers


async def admitted(
    pools: PoolRouter, groups: GroupCommit, new: NewJob, now: datetime
) -> tuple[Job, bool]:
    """The job stored (True) or the one stored first under its idempotency key (False),
    once its model's pool's admission let it in; the admission is told which."""
    services = pools.of(new.model)
    admission = services.admission
    prompt_tokens = estimate_tokens(new.input)
    graph = None
    if new.kind is JobKind.SUMMARIZE:  # too long for one request: judged as its graph
        graph = await services.context.graph_of(prompt_tokens, new.max_tokens)
    await admission.admit(
        tenant=new.tenant,
        priority=new.priority,
        prompt_tokens=prompt_tokens,
        max_tokens=new.max_tokens,
        deadline=new.deadline,
        now=now,
        graph=graph,
    )
    try:
        job, created = await groups.submit(new)
    except BaseException:
        admission.record_withdrawal()
        raise
    if created:
        admission.record_commit()
        SUBMITTED.labels(kind=job.kind.value, priority=job.priority.value).inc()
    else:
        admission.record_withdrawal()
    return job, created


@router.post(
    "/v1/jobs",
    status_code=202,
    response_model=SubmitResponse | JobView,
    summary="Submit a job",
    description="Admitted before anything is stored: 202 once the job is committed, or "
    "a refusal (429, or 503 while the lag is unknown) with Retry-After and the yield body. "
    "Give Idempotency-Key (or idempotency_key) so that a retry cannot make a second job.",
    responses={
        202: {
            "headers": openapi.headers(
                "Location", constants.HEADER_IDEMPOTENT_REPLAY, "Retry-After"
            )
        },
        200: {
            "model": SubmitResponse | JobView,
            "description": "An idempotent replay, or with ?wait= the job once it ended",
            "headers": openapi.headers("Location", constants.HEADER_IDEMPOTENT_REPLAY),
        },
        **_ERRORS,
    },
)
async def submit(
    body: SubmitJob,
    request: Request,
    tenant: Tenant,
    idempotency_key: Annotated[
        str | None, Header(alias=constants.HEADER_IDEMPOTENCY_KEY, max_length=255)
    ] = None,
    wait: WaitQuery = None,
) -> Response:
    return await submitted(request.app.state, body, tenant, idempotency_key, wait, request.receive)


async def submitted(
    state: State,
    body: SubmitJob,
    tenant: str,
    idempotency_key: str | None,
    wait: float | None,
    receive: Receive,
) -> Response:
    """The answer of ``POST /v1/jobs``, the route's and its fast path's
    (``producers.api.fast_submit``): ``receive`` is the request's, which a ``wait`` watches
    for the caller's leaving. The app's services come straight from its ``state``, not as
    dependencies: FastAPI's dependency solving was much of the busiest route's CPU
    (docs/performance.md)."""
    settings: Settings = state.settings
    api: ApiSettings = state.settings.api
    pools: PoolRouter = state.pools
    groups: GroupCommit = state.group_commit
    wait = wait_limit(wait, settings.max_wait_s)  # refused before anything is stored
    now = datetime.now(UTC)
    new = new_job(body, tenant=tenant, header_key=idempotency_key, now=now, api=api)
    job, created = await admitted(pools, groups, new, now)
    status, answer, headers = stored_answer(job, created)
    if wait is not None:
        waiting = Waiting(repo=state.repo, waiters=state.waiters, reads=state.reads)
        job = await waiting.job(job.tenant, job.id, wait, receive)
        if not job.state.terminal:
            headers["Retry-After"] = str(WAIT_RETRY_AFTER_S)
        return JSONResponse(
            JobView.of(job, _status_url(job.id)).model_dump(mode="json"),
            status_code=200 if job.state.terminal else 202,
            headers=headers,
        )
    return Response(
        answer.model_dump_json(),
        status_code=status,
        headers=headers,
        media_type="application/json",
    )


@router.get(
    "/v1/jobs",
    response_model=JobList,
    responses=_ERRORS,
    summary="List jobs, oldest first, by batch, state, model and tenant",
)
async def list_jobs(
    repo: Jobs,
    caller: CallerOf,
    batch_id: Annotated[uuid.UUID | None, Query()] = None,
    state: Annotated[list[JobState] | None, Query()] = None,
    model: Annotated[
        str | None,
        Query(max_length=256, description=f"The request's model ({DEFAULT_MODEL}: none named)"),
    ] = None,
    tenant: Annotated[
        str | None,
        Query(max_length=64, description="Another tenant's jobs: operator keys only (403)"),
    ] = None,
    after: Annotated[uuid.UUID | None, Query(description="next_after of the last page")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
) -> JobList:
    """The caller's jobs, oldest first; an operator key's are every tenant's (``tenant=``
    names one)."""
    page, more = await repo.page(
        caller.scope(tenant),
        batch_id=str(batch_id) if batch_id else None,
        states=state or [],
        model=model,
        after=str(after) if after else None,
        limit=limit,
    )
    return JobList(
        data=[JobView.of(job, _status_url(job.id)) for job in page],
        next_after=page[-1].id if more else None,
    )


@router.get(
    "/v1/jobs/{job_id}",
    response_model=JobView,
    summary="Read a job (?wait= to long-poll)",
    responses={
        200: {"headers": openapi.headers("ETag", "Retry-After")},
        304: {
            "description": "Not modified (If-None-Match)",
            "headers": openapi.headers("ETag", "Retry-After"),
        },
        **_ERRORS,
    },
)
async def get_job(
    job_id: str,
    request: Request,
    tenant: Tenant,
    settings: AppSettings,
    repo: Jobs,
    monitor: Monitor,
    waiting: Waits,
    wait: WaitQuery = None,
    if_none_match: Annotated[
        str | None, Header(description="An ETag from an earlier answer: 304 if unchanged")
    ] = None,
) -> Response:
    """The job, with a weak ETag (If-None-Match answers 304) and, until it is terminal,
    a Retry-After poll hint and a queue estimate. A GET renews its heartbeat lease
    (``abandon_after_s``). ``?wait=`` holds the request until the job is terminal,
    woken by the terminal write's NOTIFY."""
    owner, job_id = tenant, _job_id(job_id)
    wait = wait_limit(wait, settings.max_wait_s)
    if wait is None:
        job = await repo.poll(owner, job_id)
    else:
        job = await waiting.job(owner, job_id, wait, request.receive)
    answer = await status.view(repo, monitor.snapshot(), job, _status_url(job.id))
    tag = status.etag(job, answer)
    headers = {"ETag": tag}
    if (hint := status.retry_after_s(answer)) is not None:
        headers["Retry-After"] = str(hint)
    if status.matches(if_none_match, tag):
        return Response(status_code=304, headers=headers)
    return JSONResponse(answer.model_dump(mode="json"), headers=headers)


@router.get(
    "/v1/jobs/{job_id}/timeline",
    response_model=JobTimeline,
    responses=_ERRORS,
    summary="Read a job's timeline",
)
async def job_timeline(
    job_id: str, repo: Jobs, caller: CallerOf, webhooks: Webhooks
) -> JobTimeline:
    """When the job was accepted, dispatched, started and ended, why it ended, its tokens
    and its webhook deliveries with their attempts. Reading it does not renew the job's
    heartbeat lease. An operator key reads any tenant's job."""
    job = await repo.get(caller.owner, _job_id(job_id))
    graph = await repo.graph(job.id) if job.kind is JobKind.SUMMARIZE else None
    return JobTimeline.of(job, await webhooks.for_subject(job.tenant, job.id), graph)


@router.post(
    "/v1/jobs/{job_id}/heartbeat",
    response_model=JobView,
    responses=_ERRORS,
    summary="Renew a job's heartbeat lease",
)
async def heartbeat(job_id: str, repo: Jobs, tenant: Tenant) -> JobView:
    """Renew the job's heartbeat lease; 409 once the job has ended."""
    job = await repo.touch(tenant, _job_id(job_id))
    return JobView.of(job, _status_url(job.id))


@router.delete(
    "/v1/jobs/{job_id}",
    response_model=JobView,
    responses=_ERRORS,
    summary="Cancel a job",
    description="Writes cancelled at once; a running job is aborted in the engine within "
    "a decode step. 409 job_terminal if the job already ended; 409 job_of_document for a "
    "part of a document's graph (cancel the document: every part of it ends). An operator "
    "key may cancel any tenant's job.",
)
async def cancel_job(job_id: str, repo: Jobs, caller: CallerOf) -> JobView:
    job_key = _job_id(job_id)
    job = await retrying("job_cancel", lambda: repo.cancel(caller.owner, job_key), **IN_REQUEST)
    return JobView.of(job, _status_url(job.id))
