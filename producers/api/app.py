"""The HTTP API: submit, status, cancel, health and metrics."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated

from fastapi import FastAPI, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.ext.asyncio import AsyncEngine

from producers.admission.controller import AdmissionController, Policy
from producers.admission.flow import report_flow
from producers.admission.limits import BodyLimit
from producers.admission.ratelimit import TenantLimits
from producers.api import errors, openapi
from producers.api.waiting import Reads, Waiters, wait_for_terminal, wait_limit
from producers.batches import service as batches
from producers.batches.repository import BatchStore
from producers.jobs import status
from producers.jobs.group_commit import GroupCommit
from producers.jobs.repository import JobRepository
from producers.jobs.submission import new_job
from producers.lag.monitor import KafkaLagSource, LagMonitor, LagSource
from producers.metrics import SUBMITTED
from producers.tenancy import KeyStore, Tenant
from producers.webhooks import deliveries
from schemas import constants
from schemas.api import JobList, JobView, SubmitJob, SubmitResponse
from schemas.errors import JobNotFound
from schemas.jobs import Job, estimate_tokens
from schemas.states import JobState
from sluicegate.db import make_engine
from sluicegate.notify import Listener
from sluicegate.settings import Settings

# Pages of GET /v1/jobs.
DEFAULT_PAGE = 100
MAX_PAGE = 1000
# A ?wait= that ran out before the job ended: poll again (or wait again) in this long.
WAIT_RETRY_AFTER_S = 1

_ERRORS = openapi.errors(400, 401, 404, 408, 409, 413, 422, 429, 503)

WaitQuery = Annotated[
    float | None,
    Query(
        gt=0,
        description="Hold the request up to this many seconds (at most max_wait_s) for the job "
        "to end. POST: 200 with the job if it ended, else 202 with the job and Retry-After.",
    ),
]


def _job_id(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise JobNotFound(f"no job {value}") from None


def _status_url(job_id: str) -> str:
    return f"/v1/jobs/{job_id}"


def create_app(
    settings: Settings, *, engine: AsyncEngine | None = None, lag_source: LagSource | None = None
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own = engine is None
        db = engine if engine is not None else make_engine(settings.require_database_url())
        # The submits' own connections: autocommit, one statement per group of submits.
        submit_db = make_engine(
            db.url.render_as_string(hide_password=False),
            pool_size=settings.submit_batch_writers,
            autocommit=True,
        )
        repo = JobRepository(
            db,
            dispatch_topic=settings.dispatch_topic,
            events_topic=settings.events_topic,
            autocommit=submit_db,
        )
        source = lag_source or KafkaLagSource(
            db=db,
            bootstrap=settings.require_kafka(),
            topic=settings.dispatch_topic,
            group_id=settings.consumer_group,
            partitions=settings.partitions,
            count_open=settings.lag_measure == "open",
        )
        monitor = LagMonitor(
            source, interval_s=settings.lag_interval_s, stale_after_s=settings.lag_stale_after_s
        )
        app.state.repo = repo
        groups = GroupCommit.of(repo, settings)
        app.state.group_commit = groups
        app.state.batches = BatchStore(
            db, dispatch_topic=settings.dispatch_topic, events_topic=settings.events_topic
        )
        app.state.keys = KeyStore(db, cache_s=settings.api_key_cache_s)
        app.state.admission = AdmissionController(
            Policy.of(settings),
            monitor,
            TenantLimits(rpm=settings.tenant_rpm, tpm=settings.tenant_tpm),
        )
        app.state.monitor = monitor
        waiters = Waiters(limit=settings.api_max_connections)
        app.state.waiters = waiters
        app.state.reads = Reads(repo)
        listener = Listener(
            db.url.render_as_string(hide_password=False),
            constants.JOBS_CHANNEL,
            on_notice=waiters.on_notice,
            on_connect=waiters.on_connect,
        )
        await monitor.refresh()  # serve with a reading, not with "unknown"
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(monitor.run(stop), name="lag-monitor"),
            asyncio.create_task(
                report_flow(repo, monitor, stop, app.state.admission.observe), name="flow"
            ),
            asyncio.create_task(listener.run(stop), name="jobs-listener"),
            asyncio.create_task(groups.run(stop), name="submit-groups"),
        ]
        try:
            yield
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            if isinstance(source, KafkaLagSource):
                await source.close()
            await submit_db.dispose()
            if own:
                await db.dispose()

    app = FastAPI(title="Sluicegate", version="0.1.0", lifespan=lifespan)
    app.state.auth = settings.auth
    app.state.settings = settings
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.max_body_bytes,
        paths={"/v1/batches": settings.max_batch_bytes},
        read_timeout_s=settings.request_read_timeout_s,
        min_rate=settings.request_min_rate,
    )
    errors.install(app)

    def repo(request: Request) -> JobRepository:
        repository: JobRepository = request.app.state.repo
        return repository

    def group_commit(request: Request) -> GroupCommit:
        groups: GroupCommit = request.app.state.group_commit
        return groups

    async def wait_for(request: Request, tenant: str, job_id: str, wait_s: float) -> Job:
        waited = await wait_for_terminal(
            repo(request),
            request.app.state.waiters,
            request.app.state.reads,
            tenant=tenant,
            job_id=job_id,
            wait_s=wait_s,
            receive=request.receive,
        )
        return waited.job

    @app.post(
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
        wait = wait_limit(wait, settings.max_wait_s)  # refused before anything is stored
        now = datetime.now(UTC)
        new = new_job(body, tenant=tenant, header_key=idempotency_key, now=now, settings=settings)
        admission: AdmissionController = request.app.state.admission
        await admission.admit(
            tenant=new.tenant,
            priority=new.priority,
            prompt_tokens=estimate_tokens(new.input),
            max_tokens=new.max_tokens,
            deadline=new.deadline,
            now=now,
        )
        try:
            job, created = await group_commit(request).submit(new)
        except BaseException:
            admission.withdrawn()
            raise
        if created:
            admission.settled()
        else:
            admission.withdrawn()
        if created:
            SUBMITTED.labels(kind=job.kind.value, priority=job.priority.value).inc()
        headers = {"Location": _status_url(job.id)}
        if not created:
            headers[constants.HEADER_IDEMPOTENT_REPLAY] = "true"
        if wait is not None:
            job = await wait_for(request, job.tenant, job.id, wait)
            if not job.state.terminal:
                headers["Retry-After"] = str(WAIT_RETRY_AFTER_S)
            return JSONResponse(
                JobView.of(job, _status_url(job.id)).model_dump(mode="json"),
                status_code=200 if job.state.terminal else 202,
                headers=headers,
            )
        answer = SubmitResponse(
            id=job.id,
            state=job.state,
            deadline=job.deadline,
            created_at=job.created_at,
            status_url=_status_url(job.id),
        )
        return Response(
            answer.model_dump_json(),
            status_code=202 if created else 200,
            headers=headers,
            media_type="application/json",
        )

    @app.get(
        "/v1/jobs",
        response_model=JobList,
        responses=_ERRORS,
        summary="List the caller's jobs, oldest first, by batch and state",
    )
    async def list_jobs(
        request: Request,
        tenant: Tenant,
        batch_id: Annotated[uuid.UUID | None, Query()] = None,
        state: Annotated[list[JobState] | None, Query()] = None,
        after: Annotated[uuid.UUID | None, Query(description="next_after of the last page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
    ) -> JobList:
        page, more = await repo(request).page(
            tenant,
            batch_id=str(batch_id) if batch_id else None,
            states=state or [],
            after=str(after) if after else None,
            limit=limit,
        )
        return JobList(
            data=[JobView.of(job, _status_url(job.id)) for job in page],
            next_after=page[-1].id if more else None,
        )

    @app.get(
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
            job = await repo(request).poll(owner, job_id)
        else:
            job = await wait_for(request, owner, job_id, wait)
        answer = await status.view(
            repo(request), request.app.state.monitor.snapshot(), job, _status_url(job.id)
        )
        tag = status.etag(job)
        headers = {"ETag": tag}
        if (hint := status.retry_after_s(answer)) is not None:
            headers["Retry-After"] = str(hint)
        if status.matches(if_none_match, tag):
            return Response(status_code=304, headers=headers)
        return JSONResponse(answer.model_dump(mode="json"), headers=headers)

    @app.post(
        "/v1/jobs/{job_id}/heartbeat",
        response_model=JobView,
        responses=_ERRORS,
        summary="Renew a job's heartbeat lease",
    )
    async def heartbeat(job_id: str, request: Request, tenant: Tenant) -> JobView:
        """Renew the job's heartbeat lease; 409 once the job has ended."""
        job = await repo(request).touch(tenant, _job_id(job_id))
        return JobView.of(job, _status_url(job.id))

    @app.delete(
        "/v1/jobs/{job_id}",
        response_model=JobView,
        responses=_ERRORS,
        summary="Cancel a job",
        description="Writes cancelled at once; a running job is aborted in the engine within "
        "a decode step. 409 job_terminal if the job already ended.",
    )
    async def cancel_job(job_id: str, request: Request, tenant: Tenant) -> JobView:
        job = await repo(request).cancel(tenant, _job_id(job_id))
        return JobView.of(job, _status_url(job.id))

    @app.get(
        "/healthz",
        summary="Health",
        description="200 while the database answers; 503 database_unavailable otherwise.",
        responses=openapi.errors(503),
    )
    async def healthz(request: Request) -> dict[str, str]:
        await repo(request).ping()
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    # After the job routes: a request is matched against the routes in order, and the
    # single submit is the busiest of them.
    app.include_router(batches.router)
    app.include_router(deliveries.router)
    return app
