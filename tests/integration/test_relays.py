"""Several relays on one outbox, on the real database and broker: every row is published
once, each key's rows reach the topic in row order, the recorded partition ends are the
true ends of the log, and a relay that dies holding rows loses none of them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from sqlalchemy import func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.kafka import cluster_id, make_producer
from plumbing.pools import Pools
from plumbing.published_store import Acked, OutboxRow
from plumbing.settings import Settings
from producers.outbox.repository import OutboxStore, dispatch_row
from producers.service import run_relay
from schemas.tables import jobs, outbox, partition_ends
from tests.integration.pipeline import relay_only
from tests.integration.rows import job

Record = tuple[int, int, bytes, bytes]  # partition, offset, key, value


async def add_jobs(db: AsyncEngine, settings: Settings, count: int) -> list[str]:
    """``count`` queued jobs with their dispatch rows in the outbox."""
    rows = [job(f"doc {i}", "queued", None) for i in range(count)]
    async with db.begin() as conn:
        await conn.execute(insert(jobs), rows)
        await conn.execute(insert(outbox), [dispatch_row(settings.dispatch_topic, r) for r in rows])
    return [r["id"] for r in rows]


async def relays(settings: Settings, db: AsyncEngine, count: int, batch: int) -> None:
    """``count`` relays at once until the outbox has nothing unpublished."""
    tuned = settings.model_copy(update={"relay_batch_size": batch, "relay_idle_poll_s": 0.05})
    await until_published(db, lambda stop: [relay_only(tuned, stop) for _ in range(count)])


async def until_published(
    db: AsyncEngine, start: Callable[[asyncio.Event], list[Coroutine[Any, Any, None]]]
) -> None:
    """The relays ``start`` makes run until the outbox has nothing unpublished."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(relay) for relay in start(stop)]
    try:
        async with asyncio.timeout(60):
            while await unpublished(db):
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def unpublished(db: AsyncEngine) -> int:
    async with db.connect() as conn:
        found = await conn.scalar(
            select(func.count()).select_from(outbox).where(outbox.c.published_at.is_(None))
        )
    return int(found or 0)


async def read_all(settings: Settings, topic: str, expected: int) -> list[Record]:
    """Every record of ``topic``: at least ``expected``, then whatever more a last second
    of reading finds."""
    parts = [TopicPartition(topic, p) for p in range(settings.partitions)]
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.require_kafka(), enable_auto_commit=False
    )
    await consumer.start()
    found: list[Record] = []
    try:
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        async with asyncio.timeout(30):
            while len(found) < expected:
                found += flatten(await consumer.getmany(*parts, timeout_ms=300))
        found += flatten(await consumer.getmany(*parts, timeout_ms=1000))
    finally:
        await consumer.stop()
    return found


def flatten(batches: dict[TopicPartition, list[Any]]) -> list[Record]:
    return [(m.partition, m.offset, m.key, m.value) for ms in batches.values() for m in ms]


def true_ends(records: list[Record]) -> dict[int, int]:
    ends: dict[int, int] = {}
    for partition, offset, _, _ in records:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends


async def recorded_ends(db: AsyncEngine, topic: str) -> dict[int, int]:
    async with db.connect() as conn:
        rows = (
            await conn.execute(
                select(partition_ends.c.partition, partition_ends.c.end_offset).where(
                    partition_ends.c.topic == topic
                )
            )
        ).all()
    return {r.partition: r.end_offset for r in rows}


def job_of(value: bytes) -> str:
    return str(json.loads(value)["job_id"])


async def test_two_relays_publish_every_row_once_and_record_the_true_ends(
    settings: Settings, db: AsyncEngine
) -> None:
    ids = await add_jobs(db, settings, 400)
    await relays(settings, db, count=2, batch=16)

    records = await read_all(settings, settings.dispatch_topic, len(ids))
    assert sorted(job_of(value) for _, _, _, value in records) == sorted(ids)
    assert await recorded_ends(db, settings.dispatch_topic) == true_ends(records)
    # Each job's recorded position is its record's.
    at = {job_of(value): (p, o) for p, o, _, value in records}
    async with db.connect() as conn:
        rows = (
            await conn.execute(
                select(jobs.c.id, jobs.c.state, jobs.c.dispatch_partition, jobs.c.dispatch_offset)
            )
        ).all()
    assert {r.state for r in rows} == {"dispatched"}
    assert {str(r.id): (r.dispatch_partition, r.dispatch_offset) for r in rows} == at


async def test_two_relays_keep_each_keys_rows_in_order(settings: Settings, db: AsyncEngine) -> None:
    # Five keys taking turns, so that every batch of seven holds rows of a key whose earlier
    # row is in the batch the other relay holds; each relay takes a random time to publish.
    keys, per_key = 5, 40
    async with db.begin() as conn:
        await conn.execute(
            insert(outbox),
            [
                {"topic": settings.events_topic, "key": f"k{k}", "payload": f"{n}".encode()}
                for n in range(per_key)
                for k in range(keys)
            ],
        )
    producer = make_producer(settings.require_kafka(), idempotent=False)
    await producer.start()
    rng = random.Random(7)

    async def publish(rows: list[OutboxRow]) -> list[Acked]:
        await asyncio.sleep(rng.uniform(0, 0.03))
        futures = [await producer.send(r.topic, r.payload, key=r.key.encode()) for r in rows]
        return [
            Acked(topic=m.topic, partition=m.partition, offset=m.offset)
            for m in await asyncio.gather(*futures)
        ]

    async def relay() -> None:
        store = OutboxStore(db, dispatch_topic=settings.dispatch_topic)
        while await unpublished(db):
            if not (await store.publish_batch(7, publish)).published:
                await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(asyncio.gather(relay(), relay()), 60)
    finally:
        await producer.stop()

    records = await read_all(settings, settings.events_topic, keys * per_key)
    seen: dict[bytes, list[int]] = defaultdict(list)
    for _, _, key, value in sorted(records, key=lambda r: (r[0], r[1])):
        seen[key].append(int(value))
    assert seen == {f"k{k}".encode(): list(range(per_key)) for k in range(keys)}


async def test_a_relay_that_dies_holding_rows_loses_none(
    settings: Settings, db: AsyncEngine
) -> None:
    ids = await add_jobs(db, settings, 100)
    sent, hang = asyncio.Event(), asyncio.Event()
    cluster = await cluster_id(settings.require_kafka())

    async def publish_half_then_hang(rows: list[OutboxRow]) -> list[Acked]:
        producer = make_producer(settings.require_kafka(), idempotent=False)
        await producer.start()
        try:
            for row in rows[: len(rows) // 2]:
                await producer.send_and_wait(row.topic, row.payload, key=row.key.encode())
        finally:
            await producer.stop()
        sent.set()
        await hang.wait()  # never: the process dies here
        return [Acked(topic="", partition=0, offset=0, cluster_id=cluster)]

    dying = asyncio.create_task(
        OutboxStore(db, dispatch_topic=settings.dispatch_topic).publish_batch(
            len(ids), publish_half_then_hang
        )
    )
    await asyncio.wait_for(sent.wait(), 30)
    # Its process is gone: PostgreSQL ends its session and rolls its transaction back.
    async with db.begin() as conn:
        ended = await conn.scalar(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND state = 'idle in transaction'"
            )
        )
    assert ended == 1
    dying.cancel()
    with contextlib.suppress(BaseException):
        await dying

    await relays(settings, db, count=1, batch=32)
    records = await read_all(settings, settings.dispatch_topic, len(ids) + len(ids) // 2)
    sent_twice = [job_of(v) for _, _, _, v in records]
    assert sorted(set(sent_twice)) == sorted(ids)  # every job has its record
    assert len(sent_twice) == len(ids) + len(ids) // 2  # half of them twice: a redelivery
    assert await recorded_ends(db, settings.dispatch_topic) == true_ends(records)
    # Each job's recorded position is its newest record, the one the live relay sent.
    newest = {job_of(v): (p, o) for p, o, _, v in sorted(records, key=lambda r: (r[0], r[1]))}
    async with db.connect() as conn:
        rows = (
            await conn.execute(select(jobs.c.id, jobs.c.dispatch_partition, jobs.c.dispatch_offset))
        ).all()
    assert {str(r.id): (r.dispatch_partition, r.dispatch_offset) for r in rows} == newest


async def test_each_pools_jobs_go_to_its_topic_and_are_dispatched_again_there(
    settings: Settings, db: AsyncEngine
) -> None:
    """Two pools: the relay (with its reconcilers) publishes each job to its pool's topic,
    records each pool's ends and each job's topic; a broker that lost its log gets every
    unfinished job of a pool again on that pool's topic, none of the other's."""
    pooled = settings.model_copy(update={"pools": {"alpha": {}, "beta": {}}})
    alpha, beta = Pools(pooled)
    rows = [
        job(f"doc {i}", "queued", None, dispatch_topic=(beta if i % 3 == 0 else alpha).topic)
        for i in range(9)
    ]
    async with db.begin() as conn:
        await conn.execute(insert(jobs), rows)
        await conn.execute(insert(outbox), [dispatch_row(r["dispatch_topic"], r) for r in rows])
    await until_published(db, lambda stop: [run_relay(pooled, stop)])  # with its reconcilers
    for pool, count in ((alpha, 6), (beta, 3)):
        records = await read_all(settings, pool.topic, count)
        mine = {r["id"] for r in rows if r["dispatch_topic"] == pool.topic}
        assert {job_of(value) for _, _, _, value in records} == mine
        assert await recorded_ends(db, pool.topic) == true_ends(records)
    async with db.connect() as conn:
        stored = (await conn.execute(select(jobs.c.state, jobs.c.dispatch_topic))).all()
    assert Counter(stored) == Counter(
        {("dispatched", alpha.topic): 6, ("dispatched", beta.topic): 3}
    )

    again = OutboxStore(db, dispatch_topic=beta.topic, first=beta.first)
    assert await again.redispatch_unfinished() == 3
    async with db.connect() as conn:
        waiting = await conn.execute(
            select(outbox.c.topic, func.count())
            .where(outbox.c.published_at.is_(None))
            .group_by(outbox.c.topic)
        )
        assert dict(waiting.all()) == {beta.topic: 3}
