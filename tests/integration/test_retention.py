"""Retention on the real database: a prune pass deletes only what is past its window, and
never a row that a job still running, a batch still open or a pending delivery needs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from producers.retention.pruner import Pruner
from producers.retention.repository import RetentionStore
from schemas.tables import (
    batches,
    dead_letters,
    jobs,
    outbox,
    webhook_attempts,
    webhook_deliveries,
)
from tests.integration.rows import batch_of, job

NOW = datetime.now(UTC)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


async def ids(db: AsyncEngine, table: Any) -> set[str]:
    async with db.connect() as conn:
        return {str(i) for i in (await conn.scalars(select(table.c.id))).all()}


async def test_a_pass_deletes_only_what_is_past_its_window(
    settings: Settings, db: AsyncEngine
) -> None:
    rows = {
        "old": job("old", "succeeded", NOW - 2 * DAY),
        "older": job("older", "expired", NOW - 3 * DAY),
        "oldest": job("oldest", "failed", NOW - 4 * DAY),
        "recent": job("recent", "succeeded", NOW - HOUR),
        "running": job("running", "running", None),
        "queued": job("queued", "queued", None),
    }
    async with db.begin() as conn:
        await conn.execute(insert(jobs), list(rows.values()))
        await conn.execute(
            insert(outbox),
            [
                {"topic": "d", "key": "old", "payload": b"x", "published_at": NOW - 2 * HOUR},
                {
                    "topic": "d",
                    "key": "new",
                    "payload": b"x",
                    "published_at": NOW - timedelta(seconds=1),
                },
                {"topic": "d", "key": "unpublished", "payload": b"x", "published_at": None},
            ],
        )
        await conn.execute(
            insert(dead_letters),
            [
                {"source": "webhook", "reason": "old", "created_at": NOW - 2 * DAY},
                {"source": "webhook", "reason": "new", "created_at": NOW - HOUR},
            ],
        )
    done = await Pruner(tuned(settings).retention, RetentionStore(db)).prune(NOW)
    # Three ended jobs past the day, with prune_batch_rows 2: two statements, all of them.
    assert done["jobs"] == 3
    assert await ids(db, jobs) == {rows[k]["id"] for k in ("recent", "running", "queued")}
    async with db.connect() as conn:
        keys = set((await conn.scalars(select(outbox.c.key))).all())
        reasons = set((await conn.scalars(select(dead_letters.c.reason))).all())
    assert keys == {"new", "unpublished"}
    assert reasons == {"new"}
    again = await Pruner(tuned(settings).retention, RetentionStore(db)).prune(NOW)
    assert again == dict.fromkeys(done, 0)


def tuned(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"retention_outbox_s": 3600, "retention_ended_s": 86_400, "prune_batch_rows": 2}
    )


async def end(db: AsyncEngine, batch_id: str, finished: datetime, *, but: int = 0) -> None:
    """Every job of the batch ends at ``finished``, except ``but`` of them (still running)."""
    async with db.begin() as conn:
        all_ids = (await conn.scalars(select(jobs.c.id).where(jobs.c.batch_id == batch_id))).all()
        for i, job_id in enumerate(sorted(map(str, all_ids))):
            values = (
                {"state": "running", "held": False}
                if i < but
                else {"state": "succeeded", "held": False, "finished_at": finished}
            )
            await conn.execute(jobs.update().where(jobs.c.id == job_id).values(**values))


async def test_a_batch_goes_whole_once_every_job_ended_past_the_window(
    settings: Settings, db: AsyncEngine
) -> None:
    gone = await batch_of(db, "a", 5, NOW - 3 * DAY)
    await end(db, gone, NOW - 2 * DAY)
    open_one = await batch_of(db, "a", 3, NOW - 3 * DAY)
    await end(db, open_one, NOW - 2 * DAY, but=1)  # one job still running: kept whole
    recent = await batch_of(db, "a", 2, NOW - 3 * DAY)
    await end(db, recent, NOW - HOUR)  # ended inside the window
    done = await Pruner(tuned(settings).retention, RetentionStore(db)).prune(NOW)
    assert (done["jobs"], done["batches"]) == (5, 1)
    assert await ids(db, batches) == {open_one, recent}
    async with db.connect() as conn:
        left = await conn.scalar(
            select(func.count()).select_from(jobs).where(jobs.c.batch_id == gone)
        )
    assert left == 0


async def test_only_ended_deliveries_go_with_their_attempts(
    settings: Settings, db: AsyncEngine
) -> None:
    def delivery(name: str, state: str, finished: datetime | None) -> dict[str, Any]:
        return {
            "id": f"msg_{name}",
            "tenant": "t",
            "subject": name,
            "event_type": "job.succeeded",
            "url": "https://example.com/hook",
            "body": "{}",
            "state": state,
            "finished_at": finished,
        }

    async with db.begin() as conn:
        await conn.execute(
            insert(webhook_deliveries),
            [
                delivery("delivered", "delivered", NOW - 2 * DAY),
                delivery("dead", "dead", NOW - 2 * DAY),
                delivery("pending", "pending", None),
                delivery("fresh", "delivered", NOW - HOUR),
            ],
        )
        await conn.execute(
            insert(webhook_attempts),
            [
                {"delivery_id": f"msg_{name}", "attempt": 1, "duration_ms": 1.0}
                for name in ("delivered", "dead", "pending", "fresh")
            ],
        )
    done = await Pruner(tuned(settings).retention, RetentionStore(db)).prune(NOW)
    assert done["webhook_deliveries"] == 2
    assert await ids(db, webhook_deliveries) == {"msg_pending", "msg_fresh"}
    async with db.connect() as conn:
        attempts = set((await conn.scalars(select(webhook_attempts.c.delivery_id))).all())
    assert attempts == {"msg_pending", "msg_fresh"}
