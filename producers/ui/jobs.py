"""The jobs' pages: the list (filters, paging), one job's timeline with its webhook
deliveries, and its cancel. They call what the JSON API's routes call."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from producers.api import jobs as jobs_api
from producers.api.deps import Jobs, Monitor, Webhooks
from producers.jobs import status
from producers.jobs.repository import JobRepository
from producers.ui import filters
from producers.ui.pages import PageRoute, render
from producers.ui.session import Viewing, Writing
from producers.webhooks.repository import WebhookStore
from schemas.api import JobView
from schemas.errors import JobNotFound, SluicegateError
from schemas.states import CANCELLABLE_STATES, JobState
from schemas.webhooks import DeliveryDetail

router = APIRouter(route_class=PageRoute)
# A job's deliveries shown on its page, the newest last.
MAX_DELIVERIES = 20


@router.get("/jobs", response_class=HTMLResponse, summary="The jobs, by state and model")
async def job_list(request: Request, viewer: Viewing, repo: Jobs) -> HTMLResponse:
    chosen = filters.job_filter(filters.multi(request.query_params.multi_items()))
    page = await jobs_api.list_jobs(
        repo,
        viewer.tenant,
        batch_id=uuid.UUID(chosen.batch_id) if chosen.batch_id else None,
        state=list(chosen.states),
        after=uuid.UUID(chosen.after) if chosen.after else None,
        limit=chosen.limit,
    )
    return render(
        request,
        "jobs.html",
        viewer,
        jobs=page.data,
        chosen=chosen,
        next_query=chosen.query(after=page.next_after) if page.next_after else None,
        first_query=chosen.query(after=None) if chosen.after else None,
        states=[s.value for s in JobState],
    )


def job_key(value: str) -> str:
    """A job id as the API takes it; another string is no job (404)."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise JobNotFound(f"no job {value}") from None


async def _timeline(
    repo: JobRepository, monitor: Monitor, hooks: WebhookStore, tenant: str, job_id: str
) -> tuple[JobView, list[DeliveryDetail]]:
    """The job (with its place in the queue until it starts) and its webhook deliveries,
    each with its attempts."""
    job = await repo.get(tenant, job_key(job_id))
    view = await status.view(repo, monitor.snapshot(), job, f"/v1/jobs/{job.id}")
    found, _ = await hooks.deliveries(
        tenant, state=None, subject=job.id, after=None, limit=MAX_DELIVERIES
    )
    return view, [await hooks.delivery(tenant, d.id) for d in found]


def _job_page(
    request: Request, viewer: Viewing, template: str, job: JobView, hooks: list[DeliveryDetail]
) -> HTMLResponse:
    return render(
        request,
        template,
        viewer,
        job=job,
        deliveries=hooks,
        cancellable=job.state in CANCELLABLE_STATES,
        error=request.query_params.get("error"),
    )


@router.get("/jobs/{job_id}", response_class=HTMLResponse, summary="One job's timeline")
async def job_page(
    job_id: str,
    request: Request,
    viewer: Viewing,
    repo: Jobs,
    monitor: Monitor,
    hooks: Webhooks,
) -> HTMLResponse:
    job, deliveries = await _timeline(repo, monitor, hooks, viewer.tenant, job_id)
    return _job_page(request, viewer, "job.html", job, deliveries)


@router.get(
    "/jobs/{job_id}/timeline",
    response_class=HTMLResponse,
    summary="One job's timeline, the fragment the page polls",
)
async def job_timeline(
    job_id: str, request: Request, viewer: Viewing, repo: Jobs, monitor: Monitor, hooks: Webhooks
) -> HTMLResponse:
    job, deliveries = await _timeline(repo, monitor, hooks, viewer.tenant, job_id)
    return _job_page(request, viewer, "job_timeline.html", job, deliveries)


@router.post("/jobs/{job_id}/cancel", summary="Cancel a job from its page")
async def cancel_job(job_id: str, viewer: Writing, repo: Jobs) -> Response:
    """Cancel as DELETE /v1/jobs/{id} does, then back to the job's page (with the
    reason when it could not be cancelled)."""
    target = f"/ui/jobs/{job_key(job_id)}"
    try:
        await jobs_api.cancel_job(job_id, repo, viewer.tenant)
    except SluicegateError as exc:
        if exc.status >= 500:
            raise
        return RedirectResponse(f"{target}?error={exc.code}", status_code=303)
    return RedirectResponse(target, status_code=303)
