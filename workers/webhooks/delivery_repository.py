"""The webhook dispatcher's SQL for making deliveries: a terminal job event becomes delivery
rows (one per subject and event, however often the event is consumed), and an events record
that is not a job event is set aside.
"""

from __future__ import annotations

from datetime import UTC, datetime

import uuid_utils
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.db import transaction
from schemas.batches import Batch, batch_from_row, batch_status
from schemas.jobs import Job, job_from_row
from schemas.states import TERMINAL_STATES
from schemas.tables import batches, jobs, webhook_deliveries
from schemas.webhooks import (
    WEBHOOKS_CHANNEL,
    BatchData,
    DeliveryState,
    JobData,
    WebhookPayload,
    batch_event_type,
    job_event_type,
)
from workers.dead_letter_store import record_subject, set_aside

_TERMINAL = [s.value for s in TERMINAL_STATES]


def after(seconds: float) -> ColumnElement[datetime]:
    """``seconds`` from now, by the database's clock."""
    return func.now() + func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def new_delivery_id() -> str:
    """The webhook-id: time-ordered (UUIDv7), so ids page in the order they were made."""
    return f"msg_{uuid_utils.uuid7().hex}"


class DeliveryRepository:
    def __init__(self, engine: AsyncEngine, *, dead_letter_topic: str) -> None:
        self._engine = engine
        self._dead_letter_topic = dead_letter_topic

    async def enqueue(self, job_id: str, *, first_wait_s: float = 0.0) -> list[str]:
        """The deliveries a terminal job calls for: its own (when it has a callback_url)
        and its batch's (when the batch has one and this was its last job to end). Ids of
        the rows made; none when they exist already."""
        async with transaction(self._engine) as conn:
            row = (await conn.execute(select(jobs).where(jobs.c.id == job_id))).mappings().first()
            if row is None or row["state"] not in _TERMINAL:
                return []
            job = job_from_row(row)
            made: list[str] = []
            if job.callback_url:
                made += await _insert(
                    conn,
                    tenant=job.tenant,
                    subject=job.id,
                    url=job.callback_url,
                    payload=_job_payload(job),
                    first_wait_s=first_wait_s,
                )
            if job.batch_id is not None:
                made += await _enqueue_batch(conn, job.batch_id, first_wait_s)
            for delivery_id in made:
                await conn.execute(select(func.pg_notify(WEBHOOKS_CHANNEL, delivery_id)))
        return made

    async def poison(self, *, topic: str, partition: int, offset: int, payload: bytes) -> None:
        """An events record that is not a job event: set aside, never retried."""
        async with transaction(self._engine) as conn:
            await set_aside(
                conn,
                dead_letter_topic=self._dead_letter_topic,
                source="events",
                subject=record_subject(topic, partition, offset),
                reason="not a job event",
                payload=payload,
            )


async def _enqueue_batch(conn: AsyncConnection, batch_id: str, first_wait_s: float) -> list[str]:
    # Locked: the last two jobs of a batch ending at once decide one after the other.
    row = (
        (await conn.execute(select(batches).where(batches.c.id == batch_id).with_for_update()))
        .mappings()
        .first()
    )
    batch = batch_from_row(row) if row is not None else None
    if batch is None or not batch.callback_url:
        return []
    url = batch.callback_url
    done = await conn.scalar(
        select(func.count())
        .select_from(webhook_deliveries)
        .where(
            webhook_deliveries.c.subject == batch_id,
            webhook_deliveries.c.event_type.like("batch.%"),
        )
    )
    if done:
        return []
    rows = (
        await conn.execute(
            select(jobs.c.state, func.count(), func.max(jobs.c.finished_at))
            .where(jobs.c.batch_id == batch_id)
            .group_by(jobs.c.state)
        )
    ).all()
    counts = {str(state): int(n) for state, n, _ in rows}
    ended = sum(n for state, n in counts.items() if state in _TERMINAL)
    if ended != sum(counts.values()) or ended < batch.total:
        return []
    finished = max((at for _, _, at in rows if at is not None), default=None)
    return await _insert(
        conn,
        tenant=batch.tenant,
        subject=batch_id,
        url=url,
        payload=_batch_payload(batch, counts, finished),
        first_wait_s=first_wait_s,
    )


async def _insert(
    conn: AsyncConnection,
    *,
    tenant: str,
    subject: str,
    url: str,
    payload: WebhookPayload,
    first_wait_s: float,
) -> list[str]:
    made = await conn.scalar(
        pg_insert(webhook_deliveries)
        .values(
            id=new_delivery_id(),
            tenant=tenant,
            subject=subject,
            event_type=payload.type,
            url=url,
            body=payload.model_dump_json(),
            state=DeliveryState.PENDING.value,
            next_attempt_at=after(first_wait_s),
        )
        .on_conflict_do_nothing(index_elements=["subject", "event_type"])
        .returning(webhook_deliveries.c.id)
    )
    return [made] if made is not None else []


def _job_payload(job: Job) -> WebhookPayload:
    data = JobData(
        id=job.id,
        kind=job.kind.value,
        state=job.state.value,
        attempt=job.attempt,
        custom_id=job.custom_id,
        batch_id=job.batch_id,
        result=job.result,
        error=job.error,
        created_at=job.created_at,
        finished_at=job.finished_at,
    )
    return WebhookPayload(
        type=job_event_type(job.state.value),
        timestamp=job.finished_at or job.updated_at,
        data=data,
    )


def _batch_payload(
    batch: Batch, counts: dict[str, int], finished: datetime | None
) -> WebhookPayload:
    status = batch_status(batch.cancelled_at, counts, batch.total)
    data = BatchData(
        id=batch.id,
        status=status,
        total=batch.total,
        counts=counts,
        metadata=batch.metadata,
        created_at=batch.created_at,
        finished_at=finished,
    )
    return WebhookPayload(
        type=batch_event_type(status), timestamp=finished or datetime.now(UTC), data=data
    )
