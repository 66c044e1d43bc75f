"""The webhook dispatcher's SQL for sending: claim due deliveries, record attempts, give up.

The dispatcher claims due rows with ``FOR UPDATE SKIP LOCKED`` and leases them
(``next_attempt_at`` moves past the attempt's time limit, so a dispatcher that dies
mid-attempt leaves a row that comes due again); each attempt is recorded and its verdict
applied in one transaction, fenced by the attempt number. A dead delivery gets a
``dead_letters`` row and a dead-letter record in the outbox, in the same transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, extract, func, insert, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.db import transaction
from schemas.tables import (
    dead_letters,
    outbox,
    webhook_attempts,
    webhook_deliveries,
    webhook_endpoints,
    webhook_secrets,
)
from schemas.webhooks import (
    DEAD_LETTER_SOURCE,
    Delivery,
    DeliveryState,
    WebhookDeadLetter,
    delivery_from_row,
)
from workers.webhooks.delivery_repository import after
from workers.webhooks.retry import Answer, Outcome, Verdict

_PENDING = DeliveryState.PENDING.value
ENDPOINT_DISABLED = "endpoint disabled (it answered 410 Gone)"

Endpoint = tuple[str, str]  # (tenant, url)


@dataclass(frozen=True)
class Recorded:
    owned: bool
    disabled: int = 0


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


def _claimed(delivery: Delivery, attempt: int) -> Claimed:
    return Claimed(
        id=delivery.id,
        tenant=delivery.tenant,
        url=delivery.url,
        subject=delivery.subject,
        event_type=delivery.event_type,
        body=delivery.body,
        attempt=attempt,
    )


class AttemptRepository:
    def __init__(self, engine: AsyncEngine, *, dead_letter_topic: str) -> None:
        self._engine = engine
        self._dead_letter_topic = dead_letter_topic

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
        async with transaction(self._engine) as conn:
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
            due = [delivery_from_row(r) for r in rows]
            found = await conn.execute(
                select(webhook_endpoints.c.tenant, webhook_endpoints.c.url).where(
                    tuple_(webhook_endpoints.c.tenant, webhook_endpoints.c.url).in_(
                        list({d.endpoint for d in due})
                    )
                )
            )
            disabled = {(r.tenant, r.url) for r in found}
            taken: list[Delivery] = []
            dead = 0
            load = dict(busy)
            for delivery in due:
                endpoint = delivery.endpoint
                if endpoint in disabled:
                    dead += await self._dead(conn, delivery.id, None, ENDPOINT_DISABLED)
                elif load.get(endpoint, 0) < per_endpoint:
                    load[endpoint] = load.get(endpoint, 0) + 1
                    taken.append(delivery)
            if not taken:
                return Claim(claimed=[], dead=dead)
            leased = await conn.execute(
                update(webhook_deliveries)
                .where(webhook_deliveries.c.id.in_([d.id for d in taken]))
                .values(attempts=webhook_deliveries.c.attempts + 1, next_attempt_at=after(lease_s))
                .returning(webhook_deliveries.c.id, webhook_deliveries.c.attempts)
            )
            attempts: dict[str, int] = {r.id: r.attempts for r in leased}
        return Claim(claimed=[_claimed(d, attempts[d.id]) for d in taken], dead=dead)

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

    async def record(self, claimed: Claimed, answer: Answer, verdict: Verdict) -> Recorded:
        """Record the attempt and apply its verdict. ``owned`` is False when the delivery was
        no longer this attempt's (its lease ran out and another attempt took it, or its
        endpoint was disabled meanwhile): the attempt is recorded all the same.
        ``disabled``: the other pending deliveries a 410 dead-lettered with it."""
        async with transaction(self._engine) as conn:
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
                return Recorded(owned=bool(result.rowcount))
            if verdict.outcome is Outcome.RETRY:
                result = await conn.execute(
                    update(webhook_deliveries)
                    .where(owned)
                    .values(next_attempt_at=after(verdict.wait_s), **base)
                )
                return Recorded(owned=bool(result.rowcount))
            reason = verdict.reason or "given up"
            if verdict.outcome is Outcome.GONE:
                await conn.execute(
                    pg_insert(webhook_endpoints)
                    .values(tenant=claimed.tenant, url=claimed.url, reason=reason)
                    .on_conflict_do_nothing()
                )
            owned_now = await self._dead(conn, claimed.id, owned, reason, **base)
            disabled = 0
            if verdict.outcome is Outcome.GONE:
                # Every other pending delivery to the endpoint goes too, now.
                others = await conn.scalars(
                    select(webhook_deliveries.c.id)
                    .where(
                        webhook_deliveries.c.tenant == claimed.tenant,
                        webhook_deliveries.c.url == claimed.url,
                        webhook_deliveries.c.state == _PENDING,
                        webhook_deliveries.c.id != claimed.id,
                    )
                    .order_by(webhook_deliveries.c.id)  # one lock order (plumbing.lock_store)
                )
                for other in list(others):
                    disabled += await self._dead(conn, other, None, ENDPOINT_DISABLED)
            return Recorded(owned=bool(owned_now), disabled=disabled)

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
        dead = delivery_from_row(row)
        record = WebhookDeadLetter(
            delivery_id=dead.id,
            tenant=dead.tenant,
            subject=dead.subject,
            event_type=dead.event_type,
            url=dead.url,
            attempts=dead.attempts,
            last_status=dead.last_status,
            reason=reason,
            at=dead.finished_at or datetime.now(UTC),
        )
        await conn.execute(
            insert(dead_letters).values(
                source=DEAD_LETTER_SOURCE,
                tenant=dead.tenant,
                subject=dead.id,
                reason=reason,
                payload=record.model_dump_json(),
            )
        )
        await conn.execute(
            insert(outbox).values(record.outbox_row(self._dead_letter_topic, dead.id))
        )
        return 1
