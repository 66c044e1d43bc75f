"""The batch routes (OpenAI Batch format): create, read, list, results, cancel.

POST /v1/batches takes the requests as JSON (``{"requests": [...], ...}`` or, as OpenAI's,
``{"input_file_id": ..., "endpoint": ...}``), as an uploaded JSONL file (multipart/form-data,
field ``file``, options as form fields), or as a raw JSONL body (``application/jsonl`` or
``application/x-ndjson``, options in the query). A batch is accepted whole or refused
whole; its jobs are held and metered into the queue (``producers.batches.meter``). A batch
of an uploaded file (``input_file_id``) is stored ``validating`` and its lines are checked in
the batch (``producers.batches.lifecycle``), as OpenAI's Batch API does.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from plumbing.retry import IN_REQUEST, retrying
from producers.api import openapi
from producers.api.deps import (
    AppSettings,
    Batches,
    CallerOf,
    Files,
    Lifecycle,
    Pools,
    Tenant,
)
from producers.api.pools import PoolRouter
from producers.batches.input import (
    RequestChecker,
    check_all,
    chunked,
    create_body,
    jsonl_lines,
    new_batch,
    parse_create,
)
from producers.batches.meter import held_ahead
from producers.batches.results import result_lines
from producers.files.repository import FileStore
from producers.metrics import SUBMITTED
from schemas import constants
from schemas.batches import (
    ENDPOINTS,
    BatchList,
    BatchStatus,
    BatchView,
    CreateBatch,
    InvalidMultipart,
    UnsupportedMediaType,
)
from schemas.constants import DEFAULT_MODEL
from schemas.errors import BatchNotFound, InvalidJson, InvalidRequest
from schemas.jobs import model_of

DEFAULT_PAGE = 20
MAX_PAGE = 100
JSONL = "application/jsonl"
JSONL_TYPES = (JSONL, "application/x-ndjson", "application/json-lines")

_ERRORS = openapi.errors(400, 401, 403, 404, 408, 409, 413, 415, 422, 429, 503)
_OPTIONS = {
    "completion_window": {"type": "string", "default": "24h"},
    "metadata": {"type": "string", "description": "a JSON object of strings"},
    "callback_url": {"type": "string"},
    "priority": {"type": "string", "enum": ["low", "normal", "high"]},
}
_REQUEST_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": CreateBatch.model_json_schema()},
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file"],
                "properties": {
                    "file": {"type": "string", "format": "binary"},
                    **_OPTIONS,
                },
            }
        },
        JSONL: {"schema": {"type": "string", "description": "OpenAI Batch input lines"}},
    },
}

router = APIRouter(prefix="/v1/batches", tags=["batches"], responses=_ERRORS)


def _batch_id(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise BatchNotFound(f"no batch {value}") from None


async def _body(request: Request) -> CreateBatch:
    """The batch from whichever of the three forms the request is in."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media == "application/json":
        try:
            value = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise InvalidJson("the body is not valid JSON") from None
        except RecursionError:
            raise InvalidJson("the body is not valid JSON: nested too deeply") from None
        return parse_create(value)
    if media == "multipart/form-data":
        try:
            form = await request.form(max_files=1, max_fields=8)
        except HTTPException as exc:
            if exc.status_code != 400:  # a body over its limit, or too slow
                raise
            raise InvalidMultipart(f"the multipart body cannot be read: {exc.detail}") from None
        try:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise InvalidRequest("the upload has no file field")
            lines = jsonl_lines(await upload.read())
            options = {k: form.get(k) for k in _OPTIONS}
        finally:
            await form.close()
        if any(v is not None and not isinstance(v, str) for v in options.values()):
            raise InvalidRequest("form fields other than file must be text")
        return create_body(lines, **{k: v for k, v in options.items() if isinstance(v, str)})
    if media in JSONL_TYPES:
        lines = jsonl_lines(await request.body())
        return create_body(lines, **{k: request.query_params.get(k) for k in _OPTIONS})
    raise UnsupportedMediaType(
        "send application/json, multipart/form-data (a JSONL file) or application/jsonl"
    )


async def _file_lines(body: CreateBatch, files: FileStore, tenant: str) -> int:
    """The lines of the batch's uploaded file (404 ``file_not_found``): as many jobs as
    it may make, for admission; its lines are checked in the batch (``validating``)."""
    assert body.input_file_id is not None
    found, lines = await files.with_lines(tenant, body.input_file_id)
    if found.purpose != "batch":
        raise InvalidRequest(f"file {found.id} has purpose {found.purpose!r}, not 'batch'")
    if body.endpoint is not None and body.endpoint not in ENDPOINTS:
        raise InvalidRequest(f"endpoint {body.endpoint!r} is not one of {', '.join(ENDPOINTS)}")
    return max(1, lines)


async def _first_model(files: FileStore, tenant: str, file_id: str) -> str | None:
    """The model the file's first line names (None: none, or no line that says one)."""
    lines = files.lines(tenant, file_id)
    try:
        async for _, line in lines:
            with contextlib.suppress(ValueError):
                found = json.loads(line)
                body = found.get("body") if isinstance(found, dict) else None
                return model_of(body) if isinstance(body, dict) else None
            return None
    finally:
        await lines.aclose()
    return None


def _admitting(
    pools: PoolRouter,
    tenant: str,
    deadline: datetime,
    now: datetime,
    models: Callable[[], Mapping[str | None, int]],
    max_tokens: int | Callable[[], int],
) -> Callable[[int, Mapping[str, int]], None]:
    """A batch's admission, once its jobs are counted: the lines of each model (``models``;
    none counted: all of them) on that model's pool (no model: the first)."""

    def admit(jobs: int, held: Mapping[str, int]) -> None:
        tokens = max_tokens if isinstance(max_tokens, int) else max_tokens()
        for model, count in (dict(models()) or {None: jobs}).items():
            pools.of(model).admission.admit_batch(
                tenant=tenant,
                jobs=count,
                ahead=held_ahead(held, tenant, count),
                max_tokens=tokens,
                deadline=deadline,
                now=now,
            )

    return admit


@router.post(
    "",
    status_code=201,
    response_model=BatchView,
    summary="Create a batch from OpenAI Batch request lines",
    responses={
        201: {"headers": openapi.headers("Location")},
        200: {
            "model": BatchView,
            "description": "An idempotent replay",
            "headers": openapi.headers("Location", constants.HEADER_IDEMPOTENT_REPLAY),
        },
    },
    openapi_extra={"requestBody": _REQUEST_BODY},
)
async def create_batch(
    request: Request,
    tenant: Tenant,
    settings: AppSettings,
    pools: Pools,
    store: Batches,
    files: Files,
    lifecycle: Lifecycle,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias=constants.HEADER_IDEMPOTENCY_KEY,
            max_length=255,
            description="A replay with the same key (and the same request) answers what the "
            "first stored; with a different request, 409 idempotency_key_reused",
        ),
    ] = None,
) -> JSONResponse:
    """Accepted whole (201) and metered into the queue as the lag allows, or refused whole
    (429 ``deadline_unreachable`` when it cannot end within its window at the measured
    speed, 503 while the lag is unknown); an idempotent replay answers 200 with the batch
    stored first."""
    body = await _body(request)
    now = datetime.now(UTC)
    new = new_batch(body, tenant=tenant, idempotency_key=idempotency_key, now=now, api=settings.api)
    if body.input_file_id is not None:  # OpenAI's flow: validating, checked in the batch
        lines = await _file_lines(body, files, tenant)

        # Each line's max_tokens and model are known once it is checked: the least (1)
        # here, and the pool of the file's first line's model (OpenAI's batch files hold
        # one model; a line of another is still split to its own pool when checked).
        first = await _first_model(files, tenant, body.input_file_id)
        admit_file = _admitting(pools, tenant, new.deadline, now, lambda: {first: lines}, 1)
        view, created = await store.create_validating(new, lines=lines, admit=admit_file)
        if created:
            lifecycle.wake()
        return _created(view, created)
    checker = RequestChecker(settings.api, endpoint=body.endpoint)
    assert body.requests is not None
    chunks = chunked(check_all(body.requests, checker))

    # Each model's lines on its own pool's lag and speed.
    admit = _admitting(
        pools, tenant, new.deadline, now, lambda: checker.models, lambda: checker.max_tokens
    )
    view, created = await store.create(new, chunks, endpoint=checker.finish, admit=admit)
    if created:
        pools.wake_meters()
        for kind, n in checker.kinds.items():
            SUBMITTED.labels(kind=kind, priority=new.priority.value).inc(n)
    return _created(view, created)


def _created(view: BatchView, created: bool) -> JSONResponse:
    headers = {"Location": f"/v1/batches/{view.id}"}
    if not created:
        headers[constants.HEADER_IDEMPOTENT_REPLAY] = "true"
    return JSONResponse(
        view.model_dump(mode="json"), status_code=201 if created else 200, headers=headers
    )


@router.get("", response_model=BatchList, summary="List batches, newest first")
async def list_batches(
    store: Batches,
    caller: CallerOf,
    status: Annotated[list[BatchStatus] | None, Query(description="OpenAI's statuses")] = None,
    model: Annotated[
        str | None,
        Query(max_length=256, description=f"Batches with a job of this model ({DEFAULT_MODEL})"),
    ] = None,
    tenant: Annotated[
        str | None,
        Query(max_length=64, description="Another tenant's batches: operator keys only (403)"),
    ] = None,
    after: Annotated[
        uuid.UUID | None, Query(description="last_id (or next_after) of the last page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
) -> BatchList:
    """The caller's batches; an operator key's are every tenant's (``tenant=`` names one)."""
    page, more = await store.page(
        caller.scope(tenant),
        after=str(after) if after else None,
        limit=limit,
        statuses=status or (),
        model=model,
    )
    first, last = (page[0].id, page[-1].id) if page else (None, None)
    return BatchList(
        data=page,
        first_id=first,
        last_id=last,
        has_more=more,
        next_after=last if more else None,
    )


@router.get("/{batch_id}", response_model=BatchView, summary="Read a batch")
async def get_batch(batch_id: str, store: Batches, caller: CallerOf) -> BatchView:
    """OpenAI's batch object, with the jobs counted by state (``counts``); an operator key
    reads any tenant's."""
    return await store.get(caller.owner, _batch_id(batch_id))


@router.get(
    "/{batch_id}/results",
    summary="Read a batch's results as OpenAI Batch output lines",
    response_class=StreamingResponse,
    responses={200: {"content": {JSONL: {}}, "description": "OpenAI Batch output lines"}},
)
async def batch_results(
    batch_id: str,
    store: Batches,
    tenant: Tenant,
    after: Annotated[
        uuid.UUID | None, Query(description="the sluicegate.job_id of the last line read")
    ] = None,
) -> StreamingResponse:
    """OpenAI Batch output, one line per request in submission order, up to the first
    request that has not ended yet. Pass the last line's ``sluicegate.job_id`` as
    ``after`` to go on from there: a finished batch gives every line in one call."""
    owned = _batch_id(batch_id)
    endpoint = await store.endpoint(tenant, owned)  # 404 before the stream starts
    lines = result_lines(store, owned, endpoint, after=str(after) if after else None)
    return StreamingResponse(lines, media_type=JSONL)


@router.post("/{batch_id}/cancel", response_model=BatchView, summary="Cancel a batch")
async def cancel_batch(batch_id: str, store: Batches, tenant: Tenant) -> BatchView:
    """Cancel every job of the batch that has not ended (running ones are aborted within
    a decode step); 409 ``batch_terminal`` once the batch has completed or expired."""
    batch = _batch_id(batch_id)
    return await retrying("batch_cancel", lambda: store.cancel(tenant, batch), **IN_REQUEST)
