"""No deadlock on job rows: several workers, the relay, the reconciler and batch cancels on
one database and broker, over thousands of jobs, with every statement that locks several
job rows taking them in one order (``plumbing.db.locking_in_order``).

PostgreSQL counts the deadlocks it broke in ``pg_stat_database.deadlocks``; the run must
add none, and no role may end on a database error.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.db import make_engine
from plumbing.settings import Settings
from producers.batches.repository import BatchStore
from producers.outbox.config import OutboxConfig
from producers.outbox.reconciler import Reconciler
from producers.outbox.relay import OutboxRelay
from producers.outbox.repository import OutboxStore, dispatch_row
from producers.outbox.topic_view import TopicViewReader
from schemas.batches import BatchTerminal
from schemas.states import JobState
from schemas.tables import jobs, outbox
from tests.integration.rows import batch_of
from workers.engines.sim.engine import SimEngine
from workers.service import run_worker

BATCHES = 6
PER_BATCH = 250
WORKERS = 3
TERMINAL = [s.value for s in JobState if s.terminal]


async def deadlocks(db: AsyncEngine) -> int:
    async with db.connect() as conn:
        found = await conn.scalar(
            text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        )
    return int(found or 0)


async def unended(db: AsyncEngine) -> int:
    async with db.connect() as conn:
        found = await conn.scalar(
            select(func.count()).select_from(jobs).where(jobs.c.state.not_in(TERMINAL))
        )
    return int(found or 0)


async def dispatchable_batches(db: AsyncEngine, settings: Settings) -> list[str]:
    """Batches whose jobs are released (not held by the meter), stored in an order unlike
    their ids' and with their dispatch rows in the outbox in another (as the rows of many
    concurrent submits interleave): a statement that takes rows in the order it finds
    them then takes them in neither the ids' order nor the relay's."""
    deadline = datetime.now(UTC) + timedelta(hours=1)
    ids = [await batch_of(db, f"tenant-{i % 3}", PER_BATCH, deadline) for i in range(BATCHES)]
    shuffle = random.Random(7).shuffle
    async with db.begin() as conn:
        rows = [dict(r) for r in (await conn.execute(select(jobs))).mappings().all()]
        await conn.execute(text("DELETE FROM outbox"))
        await conn.execute(text("DELETE FROM jobs"))
        shuffle(rows)
        await conn.execute(insert(jobs), [{**r, "held": False} for r in rows])
        shuffle(rows)
        await conn.execute(insert(outbox), [dispatch_row(settings.dispatch_topic, r) for r in rows])
    async with db.connect() as conn:
        await conn.execute(text("ANALYZE jobs"))
    return ids


async def cancel_some(db: AsyncEngine, settings: Settings, batch_ids: list[str]) -> int:
    """Cancel every other batch while its jobs are being dispatched and claimed."""
    store = BatchStore(db, events_topic=settings.events_topic)
    done = 0
    for i, batch_id in enumerate(batch_ids[::2]):
        await asyncio.sleep(0.4 + 0.3 * i)
        try:
            await store.cancel(f"tenant-{(2 * i) % 3}", batch_id)
            done += 1
        except BatchTerminal:
            pass
    return done


async def test_workers_relay_reconciler_and_batch_cancels_never_deadlock(
    settings: Settings, db: AsyncEngine
) -> None:
    tuned = settings.model_copy(
        update={
            "relay_batch_size": 500,
            "relay_idle_poll_s": 0.05,
            "reconcile_interval_s": 0.5,
            "claim_batch": 64,
            "control_sweep_s": 0.2,
            "deadline_aware": False,
        }
    )
    batch_ids = await dispatchable_batches(db, tuned)
    before = await deadlocks(db)
    stop = asyncio.Event()
    relay_db = make_engine(tuned.require_database_url(), pool_size=4)
    store = OutboxStore(relay_db, dispatch_topic=tuned.dispatch_topic)
    config = OutboxConfig.of(tuned)
    roles = [
        asyncio.create_task(OutboxRelay(config, store).run(stop), name="relay-1"),
        asyncio.create_task(OutboxRelay(config, store).run(stop), name="relay-2"),
        asyncio.create_task(
            Reconciler(config, store, TopicViewReader(config.bootstrap, config.kafka)).run(stop),
            name="reconciler",
        ),
        *(
            asyncio.create_task(
                run_worker(tuned, stop, engine=SimEngine(time_scale=0.01)), name=f"worker-{i}"
            )
            for i in range(WORKERS)
        ),
    ]
    try:
        cancelled = await cancel_some(db, tuned, batch_ids)
        async with asyncio.timeout(120):
            while await unended(db):
                ended = [t for t in roles if t.done()]
                assert not ended, [(t.get_name(), t.exception()) for t in ended]
                await asyncio.sleep(0.2)
    finally:
        stop.set()
        results = await asyncio.gather(*roles, return_exceptions=True)
        await relay_db.dispose()
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert cancelled >= 1
    await db.dispose()  # its sessions report their deadlocks as they end
    await asyncio.sleep(0.5)
    assert await deadlocks(db) - before == 0
