"""The webhook dispatcher's one home for SQL.

A terminal job event becomes delivery rows (one per subject and event, whatever how often
the event is consumed); the dispatcher claims due rows with ``FOR UPDATE SKIP LOCKED`` and
leases them (``next_attempt_at`` moves past the attempt's time limit, so a dispatcher that
dies mid-attempt leaves a row that comes due again); each attempt is recorded and its
verdict applied in one transaction, fenced by the attempt number. A dead delivery gets a
``dead_letters`` row and a dead-letter record in the outbox, in the same transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import uuid_utils
from sqlalchemy import (
    ColumnElement,
    and_,
    extract,
    func,
    insert,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from schemas.batches import batch_status
from schemas.states import TERMINAL_STATES, JobState
from schemas.tables import (
    batches,
    dead_letters,
    jobs,
    outbox,
    webhook_attempts,
    webhook_deliveries,
    webhook_endpoints,
    webhook_secrets,
)
from schemas.webhooks import (
    DEAD_LETTER_SOURCE,
    WEBHOOKS_CHANNEL,
    BatchData,
    DeliveryState,
    JobData,
    WebhookDeadLetter,
    WebhookPayload,
    batch_event_type,
    job_event_type,
)
from workers.dead_letter_store import record_subject, set_aside
from workers.webhooks.retry import Answer, Outcome, Verdict

_TERMINAL = [s.value for s in TERMINAL_STATES]
_PENDING = DeliveryState.PENDING.value
ENDPOINT_DISABLED = "endpoint disabled (it answered 410 Gone)"

Endpoint = tuple[str, str]  # (tenant, url)


def _after(seconds: float) -> ColumnElement[datetime]:
    """``seconds`` from now, by the database's clock."""
    return func.now() + func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def new_delivery_id() -> str:
    """The webhook-id: time-ordered (UUIDv7), so ids page in the order they were made."""
    return f"msg_{uuid_utils.uuid7().hex}"


@dataclass(frozen=True, kw_only=True)
class Claimed:
    """A delivery leased to this dispatcher for one attempt."""

    id: str
    tenant: str
    url: str
    subject: str
    event_type: str
    body: str
    attempt: int  # this attempt's number, 1-based

    @property
    def endpoint(self) -> Endpoint:
        return (self.tenant, self.url)


@dataclass(frozen=True, kw_only=True)
class Claim:
    claimed: list[Claimed]
    dead: int  # deliveries to disabled endpoints, dead-lettered without an attempt


def _due(exclude: Collection[Endpoint]) -> ColumnElement[bool]:
    pending = webhook_deliveries.c.state == _PENDING
    if not exclude:
        return pending
    key = tuple_(webhook_deliveries.c.tenant, webhook_deliveries.c.url)
    return and_(pending, key.not_in(list(exclude)))


class WebhookRepository:
    def __init__(self, engine: AsyncEngine, *, dead_letter_topic: str) -> None:
        self._engine = engine
        self._dead_letter_topic = dead_letter_topic

    # Making deliveries

    async def enqueue(self, job_id: str, *, first_wait_s: float = 0.0) -> list[str]:
        """The deliveries a terminal job calls for: its own (when it has a callback_url)
        and its batch's (when the batch has one and this was its last job to end). Ids of
        the rows made; none when they exist already."""
        async with self._engine.begin() as conn:
            job = (await conn.execute(select(jobs).where(jobs.c.id == job_id))).mappings().first()
            if job is None or job["state"] not in _TERMINAL:
                return []
            made: list[str] = []
            if job["callback_url"]:
                made += await self._insert(
                    conn,
                    tenant=job["tenant"],
                    subject=str(job["id"]),
                    url=job["callback_url"],
                    payload=_job_payload(job),
                    first_wait_s=first_wait_s,
                )
            if job["batch_id"] is not None:
                made += await self._enqueue_batch(conn, str(job["batch_id"]), first_wait_s)
            for delivery_id in made:
                await conn.execute(select(func.pg_notify(WEBHOOKS_CHANNEL, delivery_id)))
        return made

    async def _enqueue_batch(
        self, conn: AsyncConnection, batch_id: str, first_wait_s: float
    ) -> list[str]:
        # Locked: the last two jobs of a batch ending at once decide one after the other.
        batch = (
            (await conn.execute(select(batches).where(batches.c.id == batch_id).with_for_update()))
            .mappings()
            .first()
        )
        if batch is None or not batch["callback_url"]:
            return []
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
        if ended != sum(counts.values()) or ended < batch["total"]:
            return []
        finished = max((at for _, _, at in rows if at is not None), default=None)
        return await self._insert(
            conn,
            tenant=batch["tenant"],
            subject=batch_id,
            url=batch["callback_url"],
            payload=_batch_payload(batch, counts, finished),
            first_wait_s=first_wait_s,
        )

    async def _insert(
        self,
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
                state=_PENDING,
                next_attempt_at=_after(first_wait_s),
            )
            .on_conflict_do_nothing(index_elements=["subject", "event_type"])
            .returning(webhook_deliveries.c.id)
        )
        return [made] if made is not None else []

    async def poison(self, *, topic: str, partition: int, offset: int, payload: bytes) -> None:
        """An events record that is not a job event: set aside, never retried."""
        async with self._engine.begin() as conn:
            await set_aside(
                conn,
                dead_letter_topic=self._dead_letter_topic,
                source="events",
                subject=record_subject(topic, partition, offset),
                reason="not a job event",
                payload=payload,
            )

    # Sending

    async def claim(
        self,
        *,
        limit: int,
        per_endpoint: int,
        busy: Mapping[Endpoint, int],
        lease_s: float,
    ) -> Claim:
        """Lease up to ``limit`` due deliveries, at most ``per_endpoint`` in flight to an
        endpoint (``busy``: those in flight here). Deliveries to a disabled endpoint are
        dead-lettered on the way."""
        full = [e for e, n in busy.items() if n >= per_endpoint]
        async with self._engine.begin() as conn:
            rows = (
                (
                    await conn.execute(
                        select(webhook_deliveries)
                        .where(_due(full), webhook_deliveries.c.next_attempt_at <= func.now())
                        .order_by(webhook_deliveries.c.next_attempt_at)
                        .limit(limit)
                        .with_for_update(skip_locked=True)
                    )
                )
                .mappings()
                .all()
            )
            if not rows:
                return Claim(claimed=[], dead=0)
            found = await conn.execute(
                select(webhook_endpoints.c.tenant, webhook_endpoints.c.url).where(
                    tuple_(webhook_endpoints.c.tenant, webhook_endpoints.c.url).in_(
                        list({(r["tenant"], r["url"]) for r in rows})
                    )
                )
            )
            disabled = {(r.tenant, r.url) for r in found}
            taken: list[Mapping[Any, Any]] = []
            dead = 0
            load = dict(busy)
            for row in rows:
                endpoint = (row["tenant"], row["url"])
                if endpoint in disabled:
                    dead += await self._dead(conn, row["id"], None, ENDPOINT_DISABLED)
                elif load.get(endpoint, 0) < per_endpoint:
                    load[endpoint] = load.get(endpoint, 0) + 1
                    taken.append(row)
            if not taken:
                return Claim(claimed=[], dead=dead)
            leased = await conn.execute(
                update(webhook_deliveries)
                .where(webhook_deliveries.c.id.in_([r["id"] for r in taken]))
                .values(attempts=webhook_deliveries.c.attempts + 1, next_attempt_at=_after(lease_s))
                .returning(webhook_deliveries.c.id, webhook_deliveries.c.attempts)
            )
            attempts: dict[str, int] = {r.id: r.attempts for r in leased}
        claimed = [
            Claimed(
                id=r["id"],
                tenant=r["tenant"],
                url=r["url"],
                subject=r["subject"],
                event_type=r["event_type"],
                body=r["body"],
                attempt=attempts[r["id"]],
            )
            for r in taken
        ]
        return Claim(claimed=claimed, dead=dead)

    async def seconds_until_due(self, exclude: Collection[Endpoint]) -> float | None:
        """Until the next pending delivery to an endpoint not in ``exclude`` comes due, by
        the database's clock (negative: overdue); None when there is none."""
        async with self._engine.connect() as conn:
            until = await conn.scalar(
                select(
                    extract("epoch", func.min(webhook_deliveries.c.next_attempt_at) - func.now())
                ).where(_due(exclude))
            )
        return float(until) if until is not None else None

    async def secrets(self, tenant: str) -> list[str]:
        """The tenant's secrets that sign now, oldest first."""
        async with self._engine.connect() as conn:
            rows = await conn.scalars(
                select(webhook_secrets.c.secret)
                .where(
                    webhook_secrets.c.tenant == tenant,
                    (webhook_secrets.c.expires_at.is_(None))
                    | (webhook_secrets.c.expires_at > func.now()),
                )
                .order_by(webhook_secrets.c.id)
            )
            return list(rows)

    async def record(self, claimed: Claimed, answer: Answer, verdict: Verdict) -> bool:
        """Record the attempt and apply its verdict. False when the delivery was no longer
        this attempt's (its lease ran out and another attempt took it, or its endpoint was
        disabled meanwhile): the attempt is recorded all the same."""
        async with self._engine.begin() as conn:
            await conn.execute(
                insert(webhook_attempts).values(
                    delivery_id=claimed.id,
                    attempt=claimed.attempt,
                    status_code=answer.status,
                    error=answer.error,
                    duration_ms=answer.duration_ms,
                )
            )
            owned = and_(
                webhook_deliveries.c.id == claimed.id,
                webhook_deliveries.c.state == _PENDING,
                webhook_deliveries.c.attempts == claimed.attempt,
            )
            base = {"last_status": answer.status, "last_error": answer.error}
            if verdict.outcome is Outcome.DELIVERED:
                result = await conn.execute(
                    update(webhook_deliveries)
                    .where(owned)
                    .values(state=DeliveryState.DELIVERED.value, finished_at=func.now(), **base)
                )
                return bool(result.rowcount)
            if verdict.outcome is Outcome.RETRY:
                result = await conn.execute(
                    update(webhook_deliveries)
                    .where(owned)
                    .values(next_attempt_at=_after(verdict.wait_s), **base)
                )
                return bool(result.rowcount)
            reason = verdict.reason or "given up"
            if verdict.outcome is Outcome.GONE:
                await conn.execute(
                    pg_insert(webhook_endpoints)
                    .values(tenant=claimed.tenant, url=claimed.url, reason=reason)
                    .on_conflict_do_nothing()
                )
            owned_now = await self._dead(conn, claimed.id, owned, reason, **base)
            if verdict.outcome is Outcome.GONE:
                # Every other pending delivery to the endpoint goes too, now.
                others = await conn.scalars(
                    select(webhook_deliveries.c.id).where(
                        webhook_deliveries.c.tenant == claimed.tenant,
                        webhook_deliveries.c.url == claimed.url,
                        webhook_deliveries.c.state == _PENDING,
                        webhook_deliveries.c.id != claimed.id,
                    )
                )
                for other in list(others):
                    await self._dead(conn, other, None, ENDPOINT_DISABLED)
            return bool(owned_now)

    async def _dead(
        self,
        conn: AsyncConnection,
        delivery_id: str,
        fence: ColumnElement[bool] | None,
        reason: str,
        **values: Any,
    ) -> int:
        """Give a pending delivery up: its row, a dead_letters row and a dead-letter record
        through the outbox, all in the caller's transaction."""
        where = (
            fence
            if fence is not None
            else and_(
                webhook_deliveries.c.id == delivery_id, webhook_deliveries.c.state == _PENDING
            )
        )
        if "last_error" not in values:
            values["last_error"] = reason
        row = (
            (
                await conn.execute(
                    update(webhook_deliveries)
                    .where(where)
                    .values(state=DeliveryState.DEAD.value, finished_at=func.now(), **values)
                    .returning(webhook_deliveries)
                )
            )
            .mappings()
            .first()
        )
        if row is None:
            return 0
        record = WebhookDeadLetter(
            delivery_id=row["id"],
            tenant=row["tenant"],
            subject=row["subject"],
            event_type=row["event_type"],
            url=row["url"],
            attempts=row["attempts"],
            last_status=row["last_status"],
            reason=reason,
            at=row["finished_at"] or datetime.now(UTC),
        )
        await conn.execute(
            insert(dead_letters).values(
                source=DEAD_LETTER_SOURCE,
                tenant=row["tenant"],
                subject=row["id"],
                reason=reason,
                payload=record.model_dump_json(),
            )
        )
        await conn.execute(
            insert(outbox).values(
                topic=self._dead_letter_topic, key=row["id"], payload=record.to_bytes()
            )
        )
        return 1


def _job_payload(job: Mapping[Any, Any]) -> WebhookPayload:
    state = JobState(job["state"])
    data = JobData(
        id=str(job["id"]),
        kind=job["kind"],
        state=state.value,
        attempt=job["attempt"],
        custom_id=job["custom_id"],
        batch_id=str(job["batch_id"]) if job["batch_id"] is not None else None,
        result=job["result"],
        error=job["error"],
        created_at=job["created_at"],
        finished_at=job["finished_at"],
    )
    return WebhookPayload(
        type=job_event_type(state.value),
        timestamp=job["finished_at"] or job["updated_at"],
        data=data,
    )


def _batch_payload(
    batch: Mapping[Any, Any], counts: dict[str, int], finished: datetime | None
) -> WebhookPayload:
    status = batch_status(batch["cancelled_at"], counts, batch["total"])
    data = BatchData(
        id=str(batch["id"]),
        status=status,
        total=batch["total"],
        counts=counts,
        metadata=batch["metadata"],
        created_at=batch["created_at"],
        finished_at=finished,
    )
    return WebhookPayload(
        type=batch_event_type(status), timestamp=finished or datetime.now(UTC), data=data
    )
