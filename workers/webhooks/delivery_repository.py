"""The webhook dispatcher's SQL for making deliveries: terminal job events become delivery
rows (one per subject and event, however often the event is consumed), and an events record
that is not a job event is set aside.

A batch of events costs two statements, neither in a transaction: one read of the jobs that
call for a delivery (``_CALLING``), and one insert of their rows that also wakes the other
dispatchers (``_MAKE``). Only the last job of a batch with a ``callback_url`` takes a
transaction, which locks the batch row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import uuid_utils
from sqlalchemy import ColumnElement, any_, bindparam, func, select, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.db import transaction
from schemas.batches import Batch, batch_from_row, batch_status
from schemas.states import TERMINAL_STATES
from schemas.tables import batches, jobs, webhook_deliveries
from schemas.webhooks import (
    WEBHOOKS_CHANNEL,
    BatchData,
    JobData,
    WebhookPayload,
    batch_event_type,
    job_event_type,
)
from workers.dead_letter_store import record_subject, set_aside

_TERMINAL = [s.value for s in TERMINAL_STATES]

# The terminal jobs among the given ones that call for a delivery: their own callback_url,
# or their batch's (the batch's delivery is made once its last job has ended).
_CALLING = (
    select(
        jobs.c.id,
        jobs.c.tenant,
        jobs.c.kind,
        jobs.c.state,
        jobs.c.attempt,
        jobs.c.custom_id,
        jobs.c.batch_id,
        jobs.c.result,
        jobs.c.error,
        jobs.c.callback_url,
        jobs.c.created_at,
        jobs.c.updated_at,
        jobs.c.finished_at,
        batches.c.callback_url.label("batch_callback_url"),
    )
    .select_from(jobs.outerjoin(batches, batches.c.id == jobs.c.batch_id))
    .where(
        jobs.c.id == any_(bindparam("ids", type_=ARRAY(UUID(as_uuid=False)))),
        jobs.c.state.in_(_TERMINAL),
        jobs.c.callback_url.is_not(None) | batches.c.callback_url.is_not(None),
    )
)

# Delivery rows, several in one statement; those that exist already (the same subject and
# event) are skipped. The NOTIFY (one per transaction, however many rows) wakes the other
# dispatchers; ``tag`` lets this one tell its own from theirs.
_MAKE = text(
    """
WITH made AS (
    INSERT INTO webhook_deliveries (id, tenant, subject, event_type, url, body, state,
                                    next_attempt_at)
    SELECT id, tenant, subject, event_type, url, body, 'pending',
           now() + make_interval(secs => wait_s)
    FROM unnest(CAST(:ids AS text[]), CAST(:tenants AS text[]), CAST(:subjects AS text[]),
                CAST(:event_types AS text[]), CAST(:urls AS text[]), CAST(:bodies AS text[]),
                CAST(:waits AS float8[]))
         AS g(id, tenant, subject, event_type, url, body, wait_s)
    ON CONFLICT (subject, event_type) DO NOTHING
    RETURNING id
)
SELECT id, pg_notify(:channel, :tag) FROM made
"""
)


def after(seconds: float) -> ColumnElement[datetime]:
    """``seconds`` from now, by the database's clock."""
    return func.now() + func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def new_delivery_id() -> str:
    """The webhook-id: time-ordered (UUIDv7), so ids page in the order they were made."""
    return f"msg_{uuid_utils.uuid7().hex}"


@dataclass(frozen=True, kw_only=True)
class NewDelivery:
    tenant: str
    subject: str
    url: str
    payload: WebhookPayload
    first_wait_s: float


@dataclass(frozen=True, kw_only=True)
class Made:
    """The rows made: their ids and the first wait of each (seconds)."""

    ids: list[str]
    waits_s: list[float]


class DeliveryRepository:
    def __init__(self, engine: AsyncEngine, *, dead_letter_topic: str, tag: str = "") -> None:
        self._engine = engine
        self._dead_letter_topic = dead_letter_topic
        self._tag = tag  # the NOTIFY payload of the rows this dispatcher makes

    async def enqueue(self, job_ids: Sequence[str], first_waits_s: Sequence[float]) -> Made:
        """The deliveries the terminal jobs ``job_ids`` call for (``first_waits_s``: the
        wait before each one's first attempt): a job's own (when it has a callback_url) and
        its batch's (when the batch has one and every job of it has ended). Only rows that
        did not exist yet are reported."""
        wait_of = dict(zip(job_ids, first_waits_s, strict=True))
        async with self._engine.connect() as conn:
            rows = (await conn.execute(_CALLING, {"ids": list(wait_of)})).mappings().all()
            own = [
                NewDelivery(
                    tenant=r["tenant"],
                    subject=str(r["id"]),
                    url=r["callback_url"],
                    payload=_job_payload(r),
                    first_wait_s=wait_of[str(r["id"])],
                )
                for r in rows
                if r["callback_url"]
            ]
            made = await self._make(conn, own)
        batch_waits = {
            str(r["batch_id"]): wait_of[str(r["id"])] for r in rows if r["batch_callback_url"]
        }
        for batch_id, wait_s in batch_waits.items():
            async with transaction(self._engine) as conn:
                made += await self._make(conn, await _batch_delivery(conn, batch_id, wait_s))
        return Made(ids=[i for i, _ in made], waits_s=[w for _, w in made])

    async def _make(
        self, conn: AsyncConnection, new: Sequence[NewDelivery]
    ) -> list[tuple[str, float]]:
        """Insert ``new`` in one statement; the (id, first wait) of the rows made."""
        if not new:
            return []
        ids = [new_delivery_id() for _ in new]
        result = await conn.execute(
            _MAKE,
            {
                "ids": ids,
                "tenants": [d.tenant for d in new],
                "subjects": [d.subject for d in new],
                "event_types": [d.payload.type for d in new],
                "urls": [d.url for d in new],
                "bodies": [d.payload.model_dump_json() for d in new],
                "waits": [d.first_wait_s for d in new],
                "channel": WEBHOOKS_CHANNEL,
                "tag": self._tag,
            },
        )
        wait_of = {i: d.first_wait_s for i, d in zip(ids, new, strict=True)}
        return [(r.id, wait_of[r.id]) for r in result]

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


async def _batch_delivery(conn: AsyncConnection, batch_id: str, wait_s: float) -> list[NewDelivery]:
    """The batch's delivery when every job of it has ended and it has none yet."""
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
    payload = _batch_payload(batch, counts, finished)
    return [
        NewDelivery(
            tenant=batch.tenant, subject=batch_id, url=url, payload=payload, first_wait_s=wait_s
        )
    ]


def _job_payload(row: Mapping[Any, Any]) -> WebhookPayload:
    data = JobData(
        id=str(row["id"]),
        kind=row["kind"],
        state=row["state"],
        attempt=row["attempt"],
        custom_id=row["custom_id"],
        batch_id=str(row["batch_id"]) if row["batch_id"] is not None else None,
        result=row["result"],
        error=row["error"],
        created_at=row["created_at"],
        finished_at=row["finished_at"],
    )
    return WebhookPayload(
        type=job_event_type(row["state"]),
        timestamp=row["finished_at"] or row["updated_at"],
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
