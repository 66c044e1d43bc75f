"""The jobs' pages: the list (filters, paging), one job's timeline with its webhook
deliveries, and its cancel. They call what the JSON API's routes call."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from producers.api import jobs as jobs_api
from producers.api.deps import Jobs, Webhooks
from producers.jobs.repository import DocumentOutline, JobRepository
from producers.ui import filters
from producers.ui.pages import PageRoute, render
from producers.ui.session import Viewing, Writing
from producers.webhooks.repository import WebhookStore
from schemas.errors import JobNotFound, SluicegateError
from schemas.jobs import GraphProgress, JobKind
from schemas.states import CANCELLABLE_STATES, JobState
from schemas.timeline import JobTimeline

router = APIRouter(route_class=PageRoute)


@router.get("/jobs", response_class=HTMLResponse, summary="The jobs, by state and model")
async def job_list(request: Request, viewer: Viewing, repo: Jobs) -> HTMLResponse:
    """As GET /v1/jobs (an operator's key sees every tenant, ``tenant=`` names one), but
    with each job's model."""
    chosen = filters.job_filter(filters.multi(request.query_params.multi_items()))
    page, more = await repo.page(
        viewer.caller.scope(chosen.tenant),  # a plain key and another tenant: 403
        batch_id=chosen.batch_id,
        states=list(chosen.states),
        model=chosen.model,
        after=chosen.after,
        limit=chosen.limit,
    )
    return render(
        request,
        "jobs.html",
        viewer,
        jobs=page,
        chosen=chosen,
        next_query=chosen.query(after=page[-1].id) if more else None,
        first_query=chosen.query(after=None) if chosen.after else None,
        states=[s.value for s in JobState],
    )


def job_key(value: str) -> str:
    """A job id as the API takes it; another string is no job (404)."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise JobNotFound(f"no job {value}") from None


@dataclass(frozen=True, kw_only=True)
class Page:
    """A job's page: its timeline, the jobs ahead of it while it waits, and for a summary
    its document (first lines, graph, summary)."""

    timeline: JobTimeline
    ahead: int | None
    document: DocumentOutline | None = None
    graph: GraphProgress | None = None
    summary: str | None = None
    part_of: str | None = None  # a part of a document's graph: its document


async def _timeline(repo: JobRepository, hooks: WebhookStore, viewer: Viewing, job_id: str) -> Page:
    """The job's timeline as GET /v1/jobs/{id}/timeline gives it, how many jobs are ahead
    of it while it has not started, and a summary's document."""
    job = await repo.get(viewer.caller.owner, job_key(job_id))
    timeline = JobTimeline.of(job, await hooks.for_subject(job.tenant, job.id))
    ahead = None
    if job.state in (JobState.QUEUED, JobState.DISPATCHED):
        ahead = await repo.queue_position(job)
    if job.kind is not JobKind.SUMMARIZE:
        return Page(timeline=timeline, ahead=ahead)
    summary = (job.result or {}).get("text")
    return Page(
        timeline=timeline,
        ahead=ahead,
        document=await repo.document(job.id),
        graph=await repo.graph(job.id),
        summary=str(summary) if summary is not None else None,
        part_of=job.parent_id,
    )


def _job_page(request: Request, viewer: Viewing, template: str, page: Page) -> HTMLResponse:
    job = page.timeline
    return render(
        request,
        template,
        viewer,
        job=job,
        ahead=page.ahead,
        page=page,
        cancellable=job.state in CANCELLABLE_STATES and page.part_of is None,
        error=request.query_params.get("error"),
    )


@router.get("/jobs/{job_id}", response_class=HTMLResponse, summary="One job's timeline")
async def job_page(
    job_id: str, request: Request, viewer: Viewing, repo: Jobs, hooks: Webhooks
) -> HTMLResponse:
    page = await _timeline(repo, hooks, viewer, job_id)
    return _job_page(request, viewer, "job.html", page)


@router.get(
    "/jobs/{job_id}/timeline",
    response_class=HTMLResponse,
    summary="One job's timeline, the fragment the page polls",
)
async def job_timeline(
    job_id: str, request: Request, viewer: Viewing, repo: Jobs, hooks: Webhooks
) -> HTMLResponse:
    page = await _timeline(repo, hooks, viewer, job_id)
    return _job_page(request, viewer, "job_timeline.html", page)


@router.post("/jobs/{job_id}/cancel", summary="Cancel a job from its page")
async def cancel_job(job_id: str, viewer: Writing, repo: Jobs) -> Response:
    """Cancel as DELETE /v1/jobs/{id} does, then back to the job's page (with the
    reason when it could not be cancelled)."""
    target = f"/ui/jobs/{job_key(job_id)}"
    try:
        await jobs_api.cancel_job(job_id, repo, viewer.caller)
    except SluicegateError as exc:
        if exc.status >= 500:
            raise
        return RedirectResponse(f"{target}?error={exc.code}", status_code=303)
    return RedirectResponse(target, status_code=303)
