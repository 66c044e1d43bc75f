"""The batches' pages: the list, one batch's progress with its output and error files,
its cancel, and the files' content for the browser (the page's cookie, not a bearer key).
They call what the JSON API's routes call."""

from __future__ import annotations

import uuid
from typing import get_args
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from producers.api import batches as batches_api
from producers.api import files as files_api
from producers.api.deps import Batches, Files
from producers.ui import filters
from producers.ui.pages import PageRoute, render
from producers.ui.session import Viewing, Writing
from schemas.batches import BatchStatus
from schemas.errors import BatchNotFound, SluicegateError

router = APIRouter(route_class=PageRoute)
PAGE = 20
# A batch's status while it can still be cancelled.
OPEN = ("validating", "in_progress", "finalizing")
STATUSES: tuple[str, ...] = get_args(BatchStatus)


def batch_key(value: str) -> str:
    """A batch id as the API takes it; another string is no batch (404)."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise BatchNotFound(f"no batch {value}") from None


@router.get("/batches", response_class=HTMLResponse, summary="The batches, newest first")
async def batch_list(request: Request, viewer: Viewing, store: Batches) -> HTMLResponse:
    """As GET /v1/batches, filtered by status, model and (an operator's) tenant."""
    params = filters.multi(request.query_params.multi_items())
    chosen = filters.job_filter({k: v for k, v in params.items() if k != "state"})
    wanted = [s for s in params.get("status", ()) if s in STATUSES]
    page = await batches_api.list_batches(
        store,
        viewer.caller,
        status=wanted or None,  # type: ignore[arg-type]  # checked against STATUSES
        model=chosen.model,
        tenant=chosen.tenant,
        after=uuid.UUID(chosen.after) if chosen.after else None,
        limit=PAGE,
    )
    more = {"status": wanted, "model": chosen.model or "", "tenant": chosen.tenant or ""}
    return render(
        request,
        "batches.html",
        viewer,
        batches=page.data,
        chosen=chosen,
        wanted=wanted,
        statuses=STATUSES,
        next_query=urlencode({**more, "after": page.next_after}, doseq=True)
        if page.next_after
        else None,
    )


@router.get("/batches/{batch_id}", response_class=HTMLResponse, summary="One batch's progress")
async def batch_page(
    batch_id: str, request: Request, viewer: Viewing, store: Batches
) -> HTMLResponse:
    batch = await batches_api.get_batch(batch_key(batch_id), store, viewer.caller)
    ended = batch.status not in OPEN
    return render(
        request,
        "batch.html",
        viewer,
        batch=batch,
        done=sum(v for k, v in batch.counts.items() if k in _ENDED),
        ended=ended,
        output_file=batch.output_file_id,
        error_file=batch.error_file_id,
        error=request.query_params.get("error"),
    )


_ENDED = ("succeeded", "failed", "expired", "cancelled", "abandoned")


@router.post("/batches/{batch_id}/cancel", summary="Cancel a batch from its page")
async def cancel_batch(batch_id: str, viewer: Writing, store: Batches) -> Response:
    target = f"/ui/batches/{batch_key(batch_id)}"
    try:
        await batches_api.cancel_batch(batch_id, store, viewer.tenant)
    except SluicegateError as exc:
        if exc.status >= 500:
            raise
        return RedirectResponse(f"{target}?error={exc.code}", status_code=303)
    return RedirectResponse(target, status_code=303)


@router.get("/files/{file_id}/content", summary="A file's content, for the page's links")
async def file_content(file_id: str, viewer: Viewing, store: Files) -> StreamingResponse:
    """As GET /v1/files/{id}/content; shown as text in the browser."""
    answer = await files_api.file_content(file_id, store, viewer.tenant)
    answer.headers["content-type"] = "text/plain; charset=utf-8"
    answer.headers["x-content-type-options"] = "nosniff"
    return answer
