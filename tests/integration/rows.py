"""Rows and request lines the integration tests write or send: a job row (and the job as the
worker running it holds it), a batch stored as the API stores one, an OpenAI Batch chat
line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from producers.batches.input import chunked
from producers.batches.repository import BatchRequest, BatchStore, NewBatch
from producers.jobs.submit_repository import new_job_id
from schemas.jobs import JobKind, NewJob, Priority
from workers.repository import ClaimedJob

HOUR = timedelta(hours=1)


def job(name: str, state: str, finished: datetime | None, **extra: Any) -> dict[str, Any]:
    """A job row of tenant "t", its deadline an hour away."""
    return {
        "id": new_job_id(),
        "tenant": "t",
        "kind": "complete",
        "state": state,
        "priority": "normal",
        "input": name,
        "max_tokens": 4,
        "deadline": datetime.now(UTC) + HOUR,
        "finished_at": finished,
        **extra,
    }


def claimed(row: dict[str, Any]) -> ClaimedJob:
    """A ``job`` row as the worker running it holds it (its attempt 1)."""
    return ClaimedJob(
        id=str(row["id"]),
        tenant=str(row["tenant"]),
        kind=JobKind(row["kind"]),
        input=str(row["input"]),
        max_tokens=int(row["max_tokens"]),
        deadline=row["deadline"],
        created_at=datetime.now(UTC),
        attempt=1,
        callback_url=None,
    )


def submitted(
    text: str = "A document.", *, key: str | None = None, digest: str | None = None
) -> NewJob:
    """A single submit of tenant "acme", as the API validates it (``key``: its
    Idempotency-Key, ``digest`` its request's hash)."""
    return NewJob(
        tenant="acme",
        kind=JobKind.SUMMARIZE,
        input=text,
        max_tokens=32,
        deadline=datetime.now(UTC) + HOUR,
        priority=Priority.NORMAL,
        callback_url=None,
        idempotency_key=key,
        request_hash=(digest or "h") if key else None,
    )


def new(tenant: str, *, deadline: datetime | None = None) -> NewBatch:
    """A batch's own row, as the API makes it for a one-hour window."""
    return NewBatch(
        tenant=tenant,
        endpoint="/v1/completions",
        completion_window="1h",
        deadline=deadline or datetime.now(UTC) + HOUR,
        priority=Priority.NORMAL,
        callback_url=None,
        metadata=None,
        idempotency_key=None,
        request_hash=None,
    )


async def batch_of(db: AsyncEngine, tenant: str, n: int, deadline: datetime) -> str:
    """A batch of ``n`` completion jobs stored as the API stores one; its id."""
    requests = [
        BatchRequest(custom_id=str(i), kind=JobKind.COMPLETE, input="x", max_tokens=4)
        for i in range(n)
    ]
    view, _ = await BatchStore(db, events_topic="e").create(
        new(tenant, deadline=deadline),
        chunked(requests),
        endpoint=lambda: "/v1/completions",
        admit=lambda jobs, held: None,
    )
    return view.id


def chat(
    custom_id: str, text: str = "Summarize: the sluice gate holds the water."
) -> dict[str, Any]:
    """An OpenAI Batch line for /v1/chat/completions on the simulator's served name."""
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "sim",  # one of the served names (setting models)
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 32,
        },
    }
