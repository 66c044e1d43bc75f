"""``POST /v1/jobs/bulk``: many single submits in one request, each answered as ``POST
/v1/jobs`` would have answered it (its status, body and headers), in the request's order.

Each job is validated, admitted (its own admission decision: blocked, refused or let in)
and stored on its own, concurrently, so the submit groups write them together; one job's
refusal or error is its answer alone. It is what the Python client sends when callers
submit concurrently (``client.coalesce``): one request's routing, parsing and answer for
many jobs. A request that is not valid as a whole (not a list of objects, too many jobs,
over ``max_body_bytes``) is answered 4xx for all, and nothing is stored."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.requests import HTTPConnection

from plumbing.settings.api import ApiSettings
from producers.api import openapi
from producers.api.deps import AppSettings, Groups, Pools, Tenant
from producers.api.errors import answer_for
from producers.api.jobs import admitted, stored_answer
from producers.api.pools import PoolRouter
from producers.jobs.group_commit import GroupCommit
from producers.jobs.submission import new_job
from schemas import constants
from schemas.api import BulkAnswers, BulkSubmit, SubmitJob
from schemas.errors import InvalidRequest

router = APIRouter()

# Headers of a single submit's answer that a bulk answer carries for each job.
_HEADERS = ("location", constants.HEADER_IDEMPOTENT_REPLAY.lower(), "retry-after")


@router.post(
    "/v1/jobs/bulk",
    response_model=BulkAnswers,
    summary="Submit many jobs, one answer each",
    description="Each job is a POST /v1/jobs body (its idempotency key in the body) and is "
    "validated, admitted and stored on its own: `data` holds, in order, the status, body "
    "and headers that POST /v1/jobs would have answered for it (202, 200 replay, 409, 422, "
    "429 or 503 with Retry-After). 200 whenever the request as a whole is valid.",
    responses=openapi.errors(400, 401, 403, 413, 422),
)
async def submit_bulk(
    body: BulkSubmit,
    request: Request,
    tenant: Tenant,
    settings: AppSettings,
    pools: Pools,
    groups: Groups,
) -> Response:
    api = settings.api
    if len(body.jobs) > api.max_bulk_jobs:
        raise InvalidRequest(f"{len(body.jobs)} jobs is over the limit of {api.max_bulk_jobs}")
    now = datetime.now(UTC)
    answers = await asyncio.gather(
        *(answer_of(request, job, tenant, api, pools, groups, now) for job in body.jobs)
    )
    content = json.dumps({"object": "list", "data": answers}, separators=(",", ":"))
    return Response(content, media_type="application/json")


async def answer_of(
    conn: HTTPConnection,
    raw: Any,
    tenant: str,
    api: ApiSettings,
    pools: PoolRouter,
    groups: GroupCommit,
    now: datetime,
) -> dict[str, Any]:
    """What ``POST /v1/jobs`` would answer for the job ``raw``: its status, JSON body and
    the headers of a single submit's answer (a bulk request's item, a channel's frame)."""
    try:
        try:
            body = SubmitJob.model_validate(raw)
        except ValidationError as exc:
            located = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
            raise RequestValidationError(located) from None
        new = new_job(body, tenant=tenant, header_key=None, now=now, api=api)
        job, created = await admitted(pools, groups, new, now)
    except Exception as exc:
        answer = await answer_for(conn, exc)
        if answer is None:
            raise
        return item_of(answer)
    status, stored, headers = stored_answer(job, created)
    return {
        "status": status,
        "body": stored.model_dump(mode="json"),
        "headers": {k.lower(): v for k, v in headers.items()},
    }


def item_of(answer: JSONResponse) -> dict[str, Any]:
    """An error answer as one job's item: its status, JSON body, and the headers a single
    submit's answer carries (Retry-After among them)."""
    headers = {k: v for k, v in answer.headers.items() if k in _HEADERS}
    body = json.loads(bytes(answer.body))
    return {"status": answer.status_code, "body": body, "headers": headers}
