"""The API's SQL for batches. A batch, its jobs and their dispatch records are written by
one statement (one round trip, one transaction); every query is scoped to the tenant."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from producers.jobs.repository import cancelling, event_row
from producers.jobs.submit_repository import new_job_id
from schemas.batches import BatchTerminal, BatchView, batch_status, batch_view
from schemas.envelopes import DispatchEnvelope
from schemas.errors import BatchNotFound, IdempotencyConflict
from schemas.jobs import Job, JobKind, Priority, estimate_tokens, job_from_row
from schemas.states import TERMINAL_STATES
from schemas.tables import batches, jobs, outbox

_TERMINAL = frozenset(s.value for s in TERMINAL_STATES)

# The batch row, its jobs and their dispatch records in one statement. Sibling CTEs see
# one snapshot and foreign keys are checked at the end of the statement, so the jobs may
# name the batch inserted beside them. An idempotent replay inserts nothing.
_CREATE = text(
    """
WITH batch AS (
    INSERT INTO batches (id, tenant, status, endpoint, completion_window, deadline,
                         callback_url, metadata, total, idempotency_key, request_hash,
                         input_file_id)
    VALUES (CAST(:id AS uuid), :tenant, 'in_progress', :endpoint, :window, :deadline,
            :callback_url, CAST(:metadata AS jsonb), :total, :key, :hash, :input_file_id)
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
), new_jobs AS (
    INSERT INTO jobs (id, tenant, kind, state, priority, input, max_tokens, deadline,
                      batch_id, custom_id, params)
    SELECT t.id, :tenant, t.kind, 'queued', :priority, t.input, t.max_tokens, :deadline,
           batch.id, t.custom_id, CAST(t.params AS jsonb)
    FROM batch, unnest(CAST(:ids AS uuid[]), CAST(:kinds AS text[]), CAST(:inputs AS text[]),
                       CAST(:max_tokens AS int[]), CAST(:custom_ids AS text[]),
                       CAST(:params AS text[]))
         AS t(id, kind, input, max_tokens, custom_id, params)
    RETURNING 1
), new_outbox AS (
    INSERT INTO outbox (topic, key, payload)
    SELECT :topic, t.key, t.payload
    FROM batch, unnest(CAST(:ids AS text[]), CAST(:payloads AS bytea[]))
         WITH ORDINALITY AS t(key, payload, n)
    ORDER BY t.n
    RETURNING 1
)
SELECT (SELECT id FROM batch) AS id,
       (SELECT count(*) FROM new_jobs) AS jobs,
       (SELECT count(*) FROM new_outbox) AS records
"""
)


@dataclass(frozen=True, kw_only=True)
class BatchRequest:
    """One validated request line."""

    custom_id: str
    kind: JobKind
    input: str
    max_tokens: int
    params: dict[str, Any] | None = None  # model and sampling parameters (schemas/sampling.py)


@dataclass(frozen=True, kw_only=True)
class NewBatch:
    tenant: str
    endpoint: str
    completion_window: str
    deadline: datetime
    priority: Priority
    callback_url: str | None
    metadata: dict[str, str] | None
    idempotency_key: str | None
    request_hash: str | None
    requests: Sequence[BatchRequest]
    input_file_id: str | None = None


class BatchStore:
    def __init__(self, engine: AsyncEngine, *, dispatch_topic: str, events_topic: str) -> None:
        self._engine = engine
        self._dispatch_topic = dispatch_topic
        self._events_topic = events_topic

    async def create(self, new: NewBatch) -> tuple[BatchView, bool]:
        """Store the batch whole; an idempotent replay answers the batch stored first."""
        batch_id = new_job_id()
        ids = [new_job_id() for _ in new.requests]
        payloads = [
            DispatchEnvelope(
                job_id=job_id,
                tenant=new.tenant,
                kind=r.kind,
                priority=new.priority,
                max_tokens=r.max_tokens,
                prompt_tokens=estimate_tokens(r.input),
                deadline=new.deadline,
            ).to_bytes()
            for job_id, r in zip(ids, new.requests, strict=True)
        ]
        params = {
            "id": batch_id,
            "tenant": new.tenant,
            "endpoint": new.endpoint,
            "window": new.completion_window,
            "deadline": new.deadline,
            "callback_url": new.callback_url,
            "metadata": json.dumps(new.metadata) if new.metadata is not None else None,
            "total": len(ids),
            "key": new.idempotency_key,
            "hash": new.request_hash,
            "input_file_id": new.input_file_id,
            "priority": new.priority.value,
            "ids": ids,
            "kinds": [r.kind.value for r in new.requests],
            "inputs": [r.input for r in new.requests],
            "max_tokens": [r.max_tokens for r in new.requests],
            "custom_ids": [r.custom_id for r in new.requests],
            "params": [json.dumps(r.params) if r.params else None for r in new.requests],
            "topic": self._dispatch_topic,
            "payloads": payloads,
        }
        async with self._engine.begin() as conn:
            made = (await conn.execute(_CREATE, params)).one()
            if made.id is None:
                return await self._replay(conn, new), False
            return await self._view(conn, new.tenant, str(made.id)), True

    async def _replay(self, conn: AsyncConnection, new: NewBatch) -> BatchView:
        row = (
            (
                await conn.execute(
                    select(batches).where(
                        batches.c.tenant == new.tenant,
                        batches.c.idempotency_key == new.idempotency_key,
                    )
                )
            )
            .mappings()
            .one()
        )
        if row["request_hash"] != new.request_hash:
            raise IdempotencyConflict(
                "this Idempotency-Key was already used with a different batch"
            )
        return await self._view(conn, new.tenant, str(row["id"]))

    async def get(self, tenant: str, batch_id: str) -> BatchView:
        async with self._engine.connect() as conn:
            return await self._view(conn, tenant, batch_id)

    async def _view(self, conn: AsyncConnection, tenant: str, batch_id: str) -> BatchView:
        row = await _batch(conn, tenant, batch_id)
        counts, ended_at = await _counts(conn, batch_id)
        return batch_view(row, counts, ended_at)

    async def page(
        self, tenant: str, *, after: str | None, limit: int
    ) -> tuple[list[BatchView], bool]:
        """The tenant's batches, newest first, before the batch id ``after``."""
        query = select(batches).where(batches.c.tenant == tenant)
        if after is not None:
            query = query.where(batches.c.id < after)
        async with self._engine.connect() as conn:
            rows = (
                (await conn.execute(query.order_by(batches.c.id.desc()).limit(limit + 1)))
                .mappings()
                .all()
            )
            page = rows[:limit]
            counts = await _counts_of(conn, [str(r["id"]) for r in page])
            views = [batch_view(r, *counts[str(r["id"])]) for r in page]
        return views, len(rows) > limit

    async def endpoint(self, tenant: str, batch_id: str) -> str:
        async with self._engine.connect() as conn:
            return str((await _batch(conn, tenant, batch_id))["endpoint"])

    async def finished_run(self, batch_id: str, *, after: str | None, limit: int) -> list[Job]:
        """The batch's jobs in submission order after the job id ``after``, up to the first
        that is not terminal yet: a cursor that never skips a job that ends late."""
        query = select(jobs).where(jobs.c.batch_id == batch_id)
        if after is not None:
            query = query.where(jobs.c.id > after)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query.order_by(jobs.c.id).limit(limit))).mappings().all()
        run: list[Job] = []
        for row in rows:
            if row["state"] not in _TERMINAL:
                break
            run.append(job_from_row(row))
        return run

    async def cancel(self, tenant: str, batch_id: str) -> BatchView:
        """Cancel every job of the batch that has not ended (running ones are aborted by
        their workers, told by the same NOTIFY as a single cancel); 409 once it is done."""
        now = datetime.now(UTC)
        async with self._engine.begin() as conn:
            row = await _batch(conn, tenant, batch_id, lock=True)
            counts, _ = await _counts(conn, batch_id)
            status = batch_status(row["cancelled_at"], counts, row["total"])
            if status in ("completed", "expired"):
                raise BatchTerminal(f"batch {batch_id} has already {status}")
            if row["cancelled_at"] is None:
                await conn.execute(
                    update(batches)
                    .where(batches.c.id == batch_id)
                    .values(status="cancelling", cancelled_at=now)
                )
            cancelled = (
                (await conn.execute(cancelling(jobs.c.batch_id == batch_id, now))).mappings().all()
            )
            if cancelled:
                events = [
                    event_row(self._events_topic, job_from_row(r), now, "cancelled")
                    for r in cancelled
                ]
                await conn.execute(insert(outbox), events)
            return await self._view(conn, tenant, batch_id)


async def _batch(
    conn: AsyncConnection, tenant: str, batch_id: str, *, lock: bool = False
) -> Mapping[Any, Any]:
    query = select(batches).where(batches.c.id == batch_id, batches.c.tenant == tenant)
    if lock:
        query = query.with_for_update()
    row = (await conn.execute(query)).mappings().first()
    if row is None:
        raise BatchNotFound(f"no batch {batch_id}")
    return row


async def _counts(conn: AsyncConnection, batch_id: str) -> tuple[dict[str, int], datetime | None]:
    """The batch's jobs by state, and when the last of them ended."""
    return (await _counts_of(conn, [batch_id]))[batch_id]


async def _counts_of(
    conn: AsyncConnection, batch_ids: list[str]
) -> dict[str, tuple[dict[str, int], datetime | None]]:
    """``_counts`` of several batches, in one query."""
    rows = (
        await conn.execute(
            select(jobs.c.batch_id, jobs.c.state, func.count(), func.max(jobs.c.finished_at))
            .where(jobs.c.batch_id.in_(batch_ids))
            .group_by(jobs.c.batch_id, jobs.c.state)
        )
    ).all()
    found: dict[str, tuple[dict[str, int], datetime | None]] = {b: ({}, None) for b in batch_ids}
    for batch_id, state, n, ended in rows:
        counts, last = found[str(batch_id)]
        counts[str(state)] = int(n)
        if ended is not None and (last is None or ended > last):
            found[str(batch_id)] = (counts, ended)
    return found
