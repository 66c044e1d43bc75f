"""The API's SQL for batches. A batch and its jobs are written in one transaction, its jobs
held until the meter releases them (``producers.batches.meter``); every query is scoped to
the tenant."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.db import transaction
from plumbing.lock_store import end_children, locking_in_order
from producers.jobs.repository import cancellable, cancelling, event_row, job_model
from producers.jobs.submit_repository import new_job_id
from schemas.batches import BatchTerminal, BatchView, batch_status, batch_view
from schemas.errors import BatchNotFound, IdempotencyConflict
from schemas.jobs import Job, JobKind, Priority, job_from_row, model_of
from schemas.states import TERMINAL_STATES, JobState
from schemas.tables import batches, jobs, outbox

_TERMINAL = frozenset(s.value for s in TERMINAL_STATES)

# One chunk of a batch's jobs, held: the meter releases them into the dispatch topic
# (producers/batches/meter.py).
INSERT_JOBS = text(
    """
INSERT INTO jobs (id, tenant, kind, state, priority, input, max_tokens, deadline,
                  batch_id, custom_id, params, held, dispatch_topic)
SELECT t.id, :tenant, t.kind, 'queued', :priority, t.input, t.max_tokens, :deadline,
       CAST(:batch_id AS uuid), t.custom_id, CAST(t.params AS jsonb), true, t.topic
FROM unnest(CAST(:ids AS uuid[]), CAST(:kinds AS text[]), CAST(:inputs AS text[]),
            CAST(:max_tokens AS int[]), CAST(:custom_ids AS text[]), CAST(:params AS text[]),
            CAST(:topics AS text[]))
     AS t(id, kind, input, max_tokens, custom_id, params, topic)
"""
)

# The dispatch topic of a model's pool (None: the first pool's).
TopicOf = Callable[[str | None], str | None]

# Called with the batch's job count and the jobs every tenant had held before it, before
# the batch commits: it refuses (raises) a batch that cannot be taken.
Admit = Callable[[int, Mapping[str, int]], None]


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
    """A batch's options; its requests are read and written in chunks beside it."""

    tenant: str
    endpoint: str | None  # None: the url its lines name
    completion_window: str
    deadline: datetime
    priority: Priority
    callback_url: str | None
    metadata: dict[str, str] | None
    idempotency_key: str | None
    request_hash: str | None
    input_file_id: str | None = None


class BatchStore:
    def __init__(
        self, engine: AsyncEngine, *, events_topic: str, topic_of: TopicOf | None = None
    ) -> None:
        """``topic_of``: the dispatch topic of a model's pool, where a line's job goes once
        the meter releases it (by default none: the first pool's)."""
        self._engine = engine
        self._events_topic = events_topic
        self.topic_of: TopicOf = topic_of or (lambda _model: None)

    async def create(
        self,
        new: NewBatch,
        chunks: AsyncIterable[Sequence[BatchRequest]],
        *,
        endpoint: Callable[[], str],
        admit: Admit,
    ) -> tuple[BatchView, bool]:
        """Store the batch and its jobs (held) in one transaction, a chunk of jobs per
        statement, so that no more than a chunk is in memory; ``endpoint`` is read once the
        chunks are. An idempotent replay answers the batch stored first, reading nothing."""
        async with transaction(self._engine) as conn:
            batch_id = await self._insert_batch(conn, new)
            if batch_id is None:
                return await self._replay(conn, new), False
            held = await held_by_tenant(conn)
            total = 0
            async for chunk in chunks:
                await conn.execute(INSERT_JOBS, job_params(new, batch_id, chunk, self.topic_of))
                total += len(chunk)
            admit(total, held)
            await conn.execute(
                update(batches)
                .where(batches.c.id == batch_id)
                .values(endpoint=endpoint(), total=total)
            )
            return await self._view(conn, new.tenant, batch_id), True

    async def create_validating(
        self, new: NewBatch, *, lines: int, admit: Admit
    ) -> tuple[BatchView, bool]:
        """Store a batch of an uploaded file ``validating``, without its jobs: the lifecycle
        checks its lines and makes them (``producers.batches.lifecycle``). ``lines``: the
        file's, as many jobs as it may hold, for admission. A replay answers the first."""
        async with transaction(self._engine) as conn:
            batch_id = await self._insert_batch(conn, new, status="validating", total=lines)
            if batch_id is None:
                return await self._replay(conn, new), False
            admit(lines, await held_by_tenant(conn))
            return await self._view(conn, new.tenant, batch_id), True

    @staticmethod
    async def _insert_batch(
        conn: AsyncConnection, new: NewBatch, *, status: str = "in_progress", total: int = 1
    ) -> str | None:
        """The batch's row (its endpoint and total are set once its jobs are written); None
        for an idempotent replay."""
        made = await conn.execute(
            pg_insert(batches)
            .values(
                id=new_job_id(),
                tenant=new.tenant,
                status=status,
                priority=new.priority.value,
                in_progress_at=func.now() if status == "in_progress" else None,
                endpoint=new.endpoint or "",
                completion_window=new.completion_window,
                deadline=new.deadline,
                callback_url=new.callback_url,
                metadata=new.metadata,
                total=total,  # provisional: set once the jobs are written
                idempotency_key=new.idempotency_key,
                request_hash=new.request_hash,
                input_file_id=new.input_file_id,
            )
            .on_conflict_do_nothing(
                index_elements=[batches.c.tenant, batches.c.idempotency_key],
                index_where=batches.c.idempotency_key.isnot(None),
            )
            .returning(batches.c.id)
        )
        found = made.scalar_one_or_none()
        return None if found is None else str(found)

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

    async def get(self, tenant: str | None, batch_id: str) -> BatchView:
        """The batch (of any tenant for None, an operator's read)."""
        async with self._engine.connect() as conn:
            return await self._view(conn, tenant, batch_id)

    async def _view(self, conn: AsyncConnection, tenant: str | None, batch_id: str) -> BatchView:
        row = await _batch(conn, tenant, batch_id)
        counts, _ = await batch_counts(conn, batch_id)
        return batch_view(row, counts)

    async def page(
        self,
        tenant: str | None,
        *,
        after: str | None,
        limit: int,
        statuses: Sequence[str] = (),
        model: str | None = None,
    ) -> tuple[list[BatchView], bool]:
        """The tenant's batches (every tenant's for None), newest first, before the batch
        id ``after``; of those ``statuses`` and with a job of ``model``, if given."""
        query = select(batches)
        if tenant is not None:
            query = query.where(batches.c.tenant == tenant)
        if statuses:
            query = query.where(batches.c.status.in_(statuses))
        if model is not None:
            query = query.where(
                select(jobs.c.id)
                .where(jobs.c.batch_id == batches.c.id, job_model() == model)
                .exists()
            )
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
            views = [batch_view(r, counts[str(r["id"])][0]) for r in page]
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
        their workers, told by the same NOTIFY as a single cancel); 409 once it is done. A
        batch still ``validating`` is ``cancelled`` at once, its lines never made jobs."""
        now = datetime.now(UTC)
        async with transaction(self._engine) as conn:
            row = await _batch(conn, tenant, batch_id, lock=True)
            if row["status"] == "validating":
                await conn.execute(
                    update(batches)
                    .where(batches.c.id == batch_id)
                    .values(status="cancelled", cancelled_at=now, finished_at=now, total=0)
                )
                return await self._view(conn, tenant, batch_id)
            counts, _ = await batch_counts(conn, batch_id)
            status = batch_status(row["cancelled_at"], counts, row["total"])
            if row["status"] in ("completed", "expired", "failed", "finalizing"):
                status = row["status"]
            if status in ("completed", "expired", "failed", "finalizing"):
                raise BatchTerminal(f"batch {batch_id} has already {status}")
            if row["cancelled_at"] is None:
                await conn.execute(
                    update(batches)
                    .where(batches.c.id == batch_id)
                    .values(status="cancelling", cancelled_at=now)
                )
            of_batch = jobs.c.batch_id == batch_id
            await conn.execute(locking_in_order(jobs, and_(of_batch, cancellable())))
            cancelled = (await conn.execute(cancelling(of_batch, now))).mappings().all()
            if cancelled:
                events = [
                    event_row(self._events_topic, job_from_row(r), now, "cancelled")
                    for r in cancelled
                ]
                await conn.execute(insert(outbox), events)
                # The documents among them end their graphs' jobs too.
                ids = [str(r["id"]) for r in cancelled]
                await end_children(conn, ids, JobState.CANCELLED, now)
            return await self._view(conn, tenant, batch_id)


def job_params(
    new: NewBatch, batch_id: str, chunk: Sequence[BatchRequest], topic_of: TopicOf
) -> dict[str, Any]:
    return {
        "tenant": new.tenant,
        "priority": new.priority.value,
        "deadline": new.deadline,
        "batch_id": batch_id,
        "ids": [new_job_id() for _ in chunk],
        "kinds": [r.kind.value for r in chunk],
        "inputs": [r.input for r in chunk],
        "max_tokens": [r.max_tokens for r in chunk],
        "custom_ids": [r.custom_id for r in chunk],
        "params": [json.dumps(r.params) if r.params else None for r in chunk],
        "topics": [topic_of(model_of(r.params)) for r in chunk],
    }


async def held_by_tenant(conn: AsyncConnection) -> dict[str, int]:
    """Each tenant's batch jobs the meter has not released yet."""
    rows = await conn.execute(
        select(jobs.c.tenant, func.count()).where(jobs.c.held).group_by(jobs.c.tenant)
    )
    return {tenant: int(n) for tenant, n in rows.all()}


async def _batch(
    conn: AsyncConnection, tenant: str | None, batch_id: str, *, lock: bool = False
) -> Mapping[Any, Any]:
    query = select(batches).where(batches.c.id == batch_id)
    if tenant is not None:
        query = query.where(batches.c.tenant == tenant)
    if lock:
        query = query.with_for_update()
    row = (await conn.execute(query)).mappings().first()
    if row is None:
        raise BatchNotFound(f"no batch {batch_id}")
    return row


async def batch_counts(
    conn: AsyncConnection, batch_id: str
) -> tuple[dict[str, int], datetime | None]:
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
