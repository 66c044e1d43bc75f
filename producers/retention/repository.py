"""Retention's SQL: each statement deletes at most ``limit`` rows past their window, in its
own transaction, oldest first, skipping rows another transaction holds (two relays may
prune at once). Nothing a job, a batch or a delivery still needs is ever picked: only
published outbox rows, ended jobs, batches whose every job ended, and ended deliveries."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Table, delete, exists, select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.selectable import ScalarSelect

from plumbing.db import transaction
from schemas.batches.output import result_file_id
from schemas.states import TERMINAL_STATES
from schemas.tables import (
    batches,
    dead_letters,
    files,
    jobs,
    outbox,
    webhook_attempts,
    webhook_deliveries,
    workers,
)

_TERMINAL = [s.value for s in TERMINAL_STATES]
_ENDED_DELIVERIES = ["delivered", "dead"]


class RetentionStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def _delete(self, table: Table, picked: ScalarSelect[Any]) -> int:
        """One statement, so its own transaction without a BEGIN and a COMMIT."""
        async with self._engine.connect() as conn:
            result = await conn.execute(delete(table).where(table.c.id.in_(picked)))
            return int(result.rowcount)

    async def outbox(self, cutoff: datetime, limit: int) -> int:
        """Rows published before ``cutoff``."""
        picked = (
            select(outbox.c.id)
            .where(outbox.c.published_at < cutoff)
            .order_by(outbox.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return await self._delete(outbox, picked.scalar_subquery())

    async def single_jobs(self, cutoff: datetime, limit: int) -> int:
        """Jobs submitted alone that ended before ``cutoff`` (a batch's jobs go with it)."""
        picked = (
            select(jobs.c.id)
            .where(
                jobs.c.finished_at < cutoff,
                jobs.c.batch_id.is_(None),
                jobs.c.state.in_(_TERMINAL),
            )
            .order_by(jobs.c.finished_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return await self._delete(jobs, picked.scalar_subquery())

    async def ended_batch(self, cutoff: datetime) -> str | None:
        """A batch past its deadline before ``cutoff`` whose every job ended before it."""
        unended = exists().where(
            jobs.c.batch_id == batches.c.id,
            (jobs.c.finished_at.is_(None)) | (jobs.c.finished_at >= cutoff),
        )
        async with self._engine.connect() as conn:
            found = await conn.scalar(
                select(batches.c.id)
                .where(batches.c.deadline < cutoff, ~unended)
                .order_by(batches.c.deadline)
                .limit(1)
            )
        return None if found is None else str(found)

    async def batch_jobs(self, batch_id: str, limit: int) -> int:
        """Up to ``limit`` jobs of an ended batch (``ended_batch``)."""
        picked = (
            select(jobs.c.id)
            .where(jobs.c.batch_id == batch_id, jobs.c.state.in_(_TERMINAL))
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return await self._delete(jobs, picked.scalar_subquery())

    async def batch(self, batch_id: str) -> int:
        """The batch row, once none of its jobs is left."""
        async with transaction(self._engine) as conn:
            left = exists().where(jobs.c.batch_id == batch_id)
            result = await conn.execute(delete(batches).where(batches.c.id == batch_id, ~left))
            if result.rowcount:  # its output and error files go with it
                named = [result_file_id(batch_id, "output"), result_file_id(batch_id, "error")]
                await conn.execute(delete(files).where(files.c.id.in_(named)))
            return int(result.rowcount)

    async def deliveries(self, cutoff: datetime, limit: int) -> int:
        """Deliveries delivered or dead before ``cutoff``, with their attempts."""
        async with transaction(self._engine) as conn:
            ids = (
                await conn.scalars(
                    select(webhook_deliveries.c.id)
                    .where(
                        webhook_deliveries.c.state.in_(_ENDED_DELIVERIES),
                        webhook_deliveries.c.finished_at < cutoff,
                    )
                    .order_by(webhook_deliveries.c.finished_at)
                    .limit(limit)
                    .with_for_update(skip_locked=True)
                )
            ).all()
            if not ids:
                return 0
            await conn.execute(
                delete(webhook_attempts).where(webhook_attempts.c.delivery_id.in_(ids))
            )
            await conn.execute(delete(webhook_deliveries).where(webhook_deliveries.c.id.in_(ids)))
            return len(ids)

    async def dead_letters(self, cutoff: datetime, limit: int) -> int:
        picked = (
            select(dead_letters.c.id)
            .where(dead_letters.c.created_at < cutoff)
            .order_by(dead_letters.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return await self._delete(dead_letters, picked.scalar_subquery())

    async def workers(self, cutoff: datetime, limit: int) -> int:
        """Rows of workers not seen since ``cutoff`` (gone without a clean stop)."""
        picked = (
            select(workers.c.id)
            .where(workers.c.seen_at < cutoff)
            .order_by(workers.c.seen_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return await self._delete(workers, picked.scalar_subquery())
