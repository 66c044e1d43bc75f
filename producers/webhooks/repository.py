"""The API's SQL for webhooks: a tenant's deliveries with their attempts, and its signing
secrets. Every query is scoped to the tenant."""

from __future__ import annotations

import base64
import json
import secrets as random_secrets
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.db import transaction
from schemas.tables import dead_letters, webhook_attempts, webhook_deliveries, webhook_secrets
from schemas.webhooks import (
    DEAD_LETTER_SOURCE,
    SECRET_PREFIX,
    WEBHOOKS_CHANNEL,
    AttemptView,
    DeliveryDetail,
    DeliveryNotDead,
    DeliveryNotFound,
    DeliveryState,
    DeliveryView,
    NewSecret,
    SecretNotFound,
    SecretView,
    delivery_from_row,
    delivery_view,
)

SECRET_BYTES = 32


def new_secret() -> str:
    """``whsec_`` and 32 random bytes in base64, as Standard Webhooks specifies."""
    return SECRET_PREFIX + base64.b64encode(random_secrets.token_bytes(SECRET_BYTES)).decode()


def _secret(row: Mapping[Any, Any], now: datetime) -> SecretView:
    expires = row["expires_at"]
    return SecretView(
        id=row["id"],
        created_at=row["created_at"],
        expires_at=expires,
        active=expires is None or expires > now,
    )


class WebhookStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def deliveries(
        self,
        tenant: str,
        *,
        state: DeliveryState | None,
        subject: str | None,
        after: str | None,
        limit: int,
    ) -> tuple[list[DeliveryView], bool]:
        """The tenant's deliveries, oldest first (ids are time-ordered), after the id
        ``after``; and whether more follow."""
        query = select(webhook_deliveries).where(webhook_deliveries.c.tenant == tenant)
        if state is not None:
            query = query.where(webhook_deliveries.c.state == state.value)
        if subject is not None:
            query = query.where(webhook_deliveries.c.subject == subject)
        if after is not None:
            query = query.where(webhook_deliveries.c.id > after)
        query = query.order_by(webhook_deliveries.c.id).limit(limit + 1)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [delivery_view(delivery_from_row(r)) for r in rows[:limit]], len(rows) > limit

    async def for_subject(self, tenant: str, subject: str) -> list[DeliveryDetail]:
        """The tenant's deliveries about one job or batch, oldest first, with attempts."""
        async with self._engine.connect() as conn:
            ids = (
                await conn.scalars(
                    select(webhook_deliveries.c.id)
                    .where(
                        webhook_deliveries.c.tenant == tenant,
                        webhook_deliveries.c.subject == subject,
                    )
                    .order_by(webhook_deliveries.c.id)
                )
            ).all()
        return [await self.delivery(tenant, delivery_id) for delivery_id in ids]

    async def delivery(self, tenant: str, delivery_id: str) -> DeliveryDetail:
        async with self._engine.connect() as conn:
            row = (
                (
                    await conn.execute(
                        select(webhook_deliveries).where(
                            webhook_deliveries.c.id == delivery_id,
                            webhook_deliveries.c.tenant == tenant,
                        )
                    )
                )
                .mappings()
                .first()
            )
            if row is None:
                raise DeliveryNotFound(f"no webhook delivery {delivery_id}")
            attempts = (
                (
                    await conn.execute(
                        select(webhook_attempts)
                        .where(webhook_attempts.c.delivery_id == delivery_id)
                        .order_by(webhook_attempts.c.id)
                    )
                )
                .mappings()
                .all()
            )
            dead_reason = await conn.scalar(
                select(dead_letters.c.reason)
                .where(
                    dead_letters.c.source == DEAD_LETTER_SOURCE,
                    dead_letters.c.tenant == tenant,
                    dead_letters.c.subject == delivery_id,
                )
                .order_by(dead_letters.c.id.desc())
                .limit(1)
            )
        delivery = delivery_from_row(row)
        return DeliveryDetail(
            **delivery_view(delivery).model_dump(),
            payload=json.loads(delivery.body),
            attempt_log=[
                AttemptView(
                    attempt=a["attempt"],
                    at=a["at"],
                    status_code=a["status_code"],
                    error=a["error"],
                    duration_ms=a["duration_ms"],
                )
                for a in attempts
            ],
            dead_letter_reason=dead_reason,
        )

    async def redeliver(self, tenant: str, delivery_id: str) -> DeliveryDetail:
        """Send a dead delivery again: pending and due now, the same message (its id and
        body, so a receiver dedupes it), one more attempt (numbered after the last); the
        dispatcher is woken by the NOTIFY of a new delivery. 409 unless it is dead."""
        async with transaction(self._engine) as conn:
            revived = await conn.scalar(
                update(webhook_deliveries)
                .where(
                    webhook_deliveries.c.id == delivery_id,
                    webhook_deliveries.c.tenant == tenant,
                    webhook_deliveries.c.state == DeliveryState.DEAD.value,
                )
                .values(
                    state=DeliveryState.PENDING.value, next_attempt_at=func.now(), finished_at=None
                )
                .returning(webhook_deliveries.c.id)
            )
            if revived is not None:
                await conn.execute(select(func.pg_notify(WEBHOOKS_CHANNEL, delivery_id)))
        if revived is None:
            found = await self.delivery(tenant, delivery_id)  # 404 if not the tenant's
            raise DeliveryNotDead(f"webhook delivery {delivery_id} is {found.state.value}")
        return await self.delivery(tenant, delivery_id)

    async def create_secret(self, tenant: str) -> NewSecret:
        secret = new_secret()
        async with transaction(self._engine) as conn:
            row = (
                (
                    await conn.execute(
                        insert(webhook_secrets)
                        .values(tenant=tenant, secret=secret)
                        .returning(webhook_secrets, func.now().label("now"))
                    )
                )
                .mappings()
                .one()
            )
        return NewSecret(**_secret(row, row["now"]).model_dump(), secret=secret)

    async def list_secrets(self, tenant: str) -> list[SecretView]:
        async with self._engine.connect() as conn:
            rows = (
                (
                    await conn.execute(
                        select(webhook_secrets, func.now().label("now"))
                        .where(webhook_secrets.c.tenant == tenant)
                        .order_by(webhook_secrets.c.id)
                    )
                )
                .mappings()
                .all()
            )
        return [_secret(r, r["now"]) for r in rows]

    async def expire_secret(self, tenant: str, secret_id: int, in_s: float) -> SecretView:
        """Stop signing with the secret ``in_s`` seconds from now (sooner if it was already
        due to expire sooner)."""
        when = func.now() + func.make_interval(0, 0, 0, 0, 0, 0, in_s)
        async with transaction(self._engine) as conn:
            row = (
                (
                    await conn.execute(
                        update(webhook_secrets)
                        .where(
                            webhook_secrets.c.id == secret_id, webhook_secrets.c.tenant == tenant
                        )
                        .values(
                            expires_at=func.least(
                                func.coalesce(webhook_secrets.c.expires_at, when), when
                            )
                        )
                        .returning(webhook_secrets, func.now().label("now"))
                    )
                )
                .mappings()
                .first()
            )
        if row is None:
            raise SecretNotFound(f"no webhook secret {secret_id}")
        return _secret(row, row["now"])
