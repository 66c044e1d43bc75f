"""The deadlock a worker died of, made to happen: a worker's claim holds the lowest of
its jobs and waits behind a third transaction, while another statement that locks several
of the same jobs (the relay recording dispatch positions, a batch cancel, the reconciler's
redispatch) finds them in another order (the order they lie in the table).

Jobs ``a < m < b`` by id lie in the table as ``b, m, a``. A holder locks ``m``; the claim
of ``[a, m, b]`` locks ``a`` and waits for ``m``; the other statement starts and takes
``b`` before it reaches ``a`` (or ``m``); the holder lets go; the claim takes ``m`` and
waits for ``b``. With one lock order the other statement waits for ``a`` before it takes
``b``, and both finish. Real PostgreSQL (deadlock_timeout breaks a cycle after 1 s) and a
real broker for the relay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.kafka import cluster_id, make_producer
from plumbing.published_store import Acked, OutboxRow
from plumbing.settings import Settings
from producers.batches.repository import BatchStore
from producers.outbox.repository import OutboxStore, dispatch_row
from schemas.tables import jobs, outbox
from tests.integration.rows import batch_of
from workers.repository import WorkerRepository

TENANT = "t"
Other = Callable[[AsyncEngine, Settings, str, str, str], Awaitable[object]]


async def laid_out(db: AsyncEngine, settings: Settings) -> tuple[str, str, str, str]:
    """A batch of three dispatched jobs a < m < b, stored in the order b, m, a; the
    dispatch rows of b and a in the outbox, b's first."""
    batch_id = await batch_of(db, TENANT, 3, datetime.now(UTC) + timedelta(hours=1))
    async with db.begin() as conn:
        rows = [dict(r) for r in (await conn.execute(select(jobs).order_by(jobs.c.id))).mappings()]
        await conn.execute(text("DELETE FROM outbox"))
        await conn.execute(text("DELETE FROM jobs"))
        stored = [
            {**r, "held": False, "state": "dispatched", "dispatch_cluster_id": "cluster-1"}
            | {"dispatch_partition": 0, "dispatch_offset": i}
            for i, r in enumerate(reversed(rows))
        ]
        for row in stored:  # one statement each: the table keeps them in this order
            await conn.execute(insert(jobs).values(**row))
        a, m, b = (str(r["id"]) for r in rows)
        for job in (stored[0], stored[2]):
            await conn.execute(insert(outbox).values(dispatch_row(settings.dispatch_topic, job)))
    return batch_id, a, m, b


async def relay(db: AsyncEngine, settings: Settings, batch_id: str, a: str, b: str) -> object:
    cluster = await cluster_id(settings.require_kafka())
    producer = make_producer(
        settings.require_kafka(), idempotent=settings.kafka_idempotent_producer
    )
    await producer.start()

    async def publish(rows: list[OutboxRow]) -> list[Acked]:
        sent = [await producer.send_and_wait(r.topic, r.payload, key=r.key.encode()) for r in rows]
        return [
            Acked(topic=s.topic, partition=s.partition, offset=s.offset, cluster_id=cluster)
            for s in sent
        ]

    try:
        return await OutboxStore(db, dispatch_topic=settings.dispatch_topic).publish_batch(
            10, publish
        )
    finally:
        await producer.stop()


async def batch_cancel(
    db: AsyncEngine, settings: Settings, batch_id: str, a: str, b: str
) -> object:
    return await BatchStore(db, events_topic=settings.events_topic).cancel(TENANT, batch_id)


async def reconciler(db: AsyncEngine, settings: Settings, batch_id: str, a: str, b: str) -> object:
    async with db.connect() as conn:
        found = (
            await conn.execute(
                select(
                    jobs.c.id,
                    jobs.c.dispatch_cluster_id,
                    jobs.c.dispatch_partition,
                    jobs.c.dispatch_offset,
                ).where(jobs.c.id.in_([b, a]))
            )
        ).all()
    positions = {
        str(r.id): (r.dispatch_cluster_id, r.dispatch_partition, r.dispatch_offset) for r in found
    }
    lost = [(b, positions[b]), (a, positions[a])]
    return await OutboxStore(db, dispatch_topic=settings.dispatch_topic).redispatch_lost(lost)


async def waiting(db: AsyncEngine, count: int, within_s: float = 10) -> None:
    """Until ``count`` sessions of this database wait for a lock."""
    query = text(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s ON s.pid = l.pid "
        "WHERE NOT l.granted AND s.datname = current_database()"
    )
    async with asyncio.timeout(within_s):
        while True:
            async with db.connect() as conn:
                if (await conn.scalar(query) or 0) >= count:
                    return
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("other", [relay, batch_cancel, reconciler], ids=lambda f: f.__name__)
async def test_a_claim_and_a_multi_row_statement_never_deadlock(
    settings: Settings, db: AsyncEngine, other: Other
) -> None:
    batch_id, a, m, b = await laid_out(db, settings)
    worker = WorkerRepository(db, events_topic=settings.events_topic)
    async with db.connect() as holder:
        await holder.execution_options(isolation_level="READ COMMITTED")  # a real one
        await holder.begin()
        await holder.execute(select(jobs.c.id).where(jobs.c.id == m).with_for_update())
        claim = asyncio.create_task(worker.claim_batch([a, m, b], lambda _: None, len))
        await waiting(db, 1)  # the claim holds a, waits for m
        rival = asyncio.create_task(other(db, settings, batch_id, a, b))
        await waiting(db, 2)  # the other statement waits too
        await holder.rollback()
    results = await asyncio.gather(claim, rival, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == [], errors
    claimed = results[0]
    assert isinstance(claimed, dict)
    async with db.connect() as conn:
        states = dict((await conn.execute(select(jobs.c.id, jobs.c.state))).all())
    assert set(map(str, states)) == {a, m, b}
