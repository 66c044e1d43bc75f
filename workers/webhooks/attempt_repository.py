"""The webhook dispatcher's SQL for what an attempt did: record it, and give deliveries up.

Attempts that delivered or will be retried are recorded together, each attempt's row and
its delivery's new state in one statement (``record``), fenced by the attempt number. A
delivery given up (its last attempt failed, its address was refused, its endpoint answered
410 or was disabled before) takes a transaction: the attempt, the delivery's row, a
``dead_letters`` row and a dead-letter record in the outbox, all or nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.db import transaction
from schemas.tables import (
    dead_letters,
    outbox,
    webhook_attempts,
    webhook_deliveries,
    webhook_endpoints,
)
from schemas.webhooks import (
    DEAD_LETTER_SOURCE,
    DeliveryState,
    WebhookDeadLetter,
    delivery_from_row,
)
from workers.webhooks.claim_repository import ClaimedDelivery
from workers.webhooks.retry import AttemptResult, Outcome, Verdict

_PENDING = DeliveryState.PENDING.value
ENDPOINT_DISABLED = "endpoint disabled (it answered 410 Gone)"

# Attempts and their verdicts (delivered, or retried after ``wait_s``): every attempt is
# logged; a delivery's row changes only while it is still that attempt's (pending, and
# ``attempts`` its number). The ids of the deliveries that changed.
_RECORD = text(
    """
WITH given AS (
    SELECT * FROM unnest(CAST(:ids AS text[]), CAST(:attempts AS int[]),
                         CAST(:statuses AS int[]), CAST(:errors AS text[]),
                         CAST(:durations AS float8[]), CAST(:delivered AS boolean[]),
                         CAST(:waits AS float8[]))
        AS g(id, attempt, status, error, duration_ms, delivered, wait_s)
), logged AS (
    INSERT INTO webhook_attempts (delivery_id, attempt, status_code, error, duration_ms)
    SELECT id, attempt, status, error, duration_ms FROM given
), applied AS (
    UPDATE webhook_deliveries d
    SET state = CASE WHEN g.delivered THEN 'delivered' ELSE d.state END,
        finished_at = CASE WHEN g.delivered THEN now() ELSE d.finished_at END,
        next_attempt_at = CASE WHEN g.delivered THEN d.next_attempt_at
                               ELSE now() + make_interval(secs => g.wait_s) END,
        last_status = g.status,
        last_error = g.error
    FROM given g
    WHERE d.id = g.id AND d.state = 'pending' AND d.attempts = g.attempt
    RETURNING d.id
)
SELECT id FROM applied
"""
)


@dataclass(frozen=True)
class Recorded:
    owned: bool
    disabled: int = 0


@dataclass(frozen=True, kw_only=True)
class Attempted:
    """An attempt that delivered or is to be retried, and what it did."""

    claimed: ClaimedDelivery
    answer: AttemptResult
    verdict: Verdict


class AttemptRepository:
    def __init__(self, engine: AsyncEngine, *, dead_letter_topic: str) -> None:
        self._engine = engine
        self._dead_letter_topic = dead_letter_topic

    async def record(self, done: Sequence[Attempted]) -> set[str]:
        """Record attempts that delivered or are retried, in one statement. The ids of the
        deliveries still theirs (the others' lease ran out and another attempt took them,
        or their endpoint was disabled meanwhile: the attempt is logged all the same)."""
        async with self._engine.connect() as conn:
            result = await conn.execute(
                _RECORD,
                {
                    "ids": [a.claimed.id for a in done],
                    "attempts": [a.claimed.attempt for a in done],
                    "statuses": [a.answer.status for a in done],
                    "errors": [a.answer.error for a in done],
                    "durations": [a.answer.duration_ms for a in done],
                    "delivered": [a.verdict.outcome is Outcome.DELIVERED for a in done],
                    "waits": [a.verdict.wait_s for a in done],
                },
            )
            return {r.id for r in result}

    async def give_up(
        self, claimed: ClaimedDelivery, answer: AttemptResult, verdict: Verdict
    ) -> Recorded:
        """Record an attempt after which the delivery is given up (``verdict``: DEAD or
        GONE). ``owned`` is False when the delivery was no longer this attempt's.
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

    async def give_up_disabled(self, delivery_ids: Sequence[str]) -> int:
        """Give up deliveries to an endpoint disabled by a 410, without an attempt; how
        many were still pending."""
        async with transaction(self._engine) as conn:
            dead = 0
            for delivery_id in sorted(delivery_ids):  # one lock order
                dead += await self._dead(conn, delivery_id, None, ENDPOINT_DISABLED)
            return dead

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
