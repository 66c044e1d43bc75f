"""Rows published at once by their writer, on the real database and broker: the API's
dispatch records and a worker's job events reach their topics with no relay running, and
are marked published (with the dispatch positions and partition ends) by the writer's next
statement, or alone after the linger; a row its writer left is the relay's only after its
grace."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.metrics import registry
from plumbing.publish_at_once import AtOncePublisher, at_once_publisher
from plumbing.publisher import Publisher, Target
from plumbing.settings import Settings
from plumbing.unit_of_work import UnitOfWork
from producers.jobs.submit_repository import SubmitRepository
from producers.outbox.repository import OutboxStore
from schemas.constants import M_AT_ONCE
from schemas.jobs import JobKind
from schemas.states import JobState
from schemas.tables import jobs, outbox, partition_ends
from sluicegate.local.embedded import free_port
from tests.integration.rows import job, submitted
from workers.end_repository import EndRepository
from workers.repository import ClaimedJob
from workers.service import events_topic


@asynccontextmanager
async def running(at_once: AtOncePublisher | None) -> AsyncIterator[AtOncePublisher]:
    assert at_once is not None
    stop = asyncio.Event()
    task = asyncio.create_task(at_once.run(stop))
    try:
        yield at_once
    finally:
        stop.set()
        await task


async def within(check_s: float, condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(check_s):
        while not condition():
            await asyncio.sleep(0.02)


async def records(bootstrap: str, topic: str, count: int) -> list[tuple[int, int, bytes]]:
    """The first ``count`` records of ``topic``: (partition, offset, key)."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    found: list[tuple[int, int, bytes]] = []
    try:
        async with asyncio.timeout(20):
            while len(found) < count:
                batch = await consumer.getmany(timeout_ms=200)
                found += [(r.partition, r.offset, r.key) for rs in batch.values() for r in rs]
        extra = await consumer.getmany(timeout_ms=500)  # and no more
        found += [(r.partition, r.offset, r.key) for rs in extra.values() for r in rs]
    finally:
        await consumer.stop()
    return found


def left_to_relay() -> float:
    found = registry("api").get_sample_value(M_AT_ONCE, {"outcome": "left_to_relay"})
    return found or 0.0


async def unpublished(db: AsyncEngine) -> int:
    async with db.connect() as conn:
        rows = await conn.scalars(select(outbox.c.id).where(outbox.c.published_at.is_(None)))
        return len(rows.all())


async def test_submits_are_dispatched_and_marked_by_the_next_statement(
    settings: Settings, db: AsyncEngine
) -> None:
    tuned = settings.model_copy(update={"publish_mark_linger_s": 60.0})  # no flush alone
    topics = frozenset([tuned.dispatch_topic])
    work = UnitOfWork(db, linger_s=0.0)
    partitions = tuned.topic_partitions()
    at_once = at_once_publisher(tuned, work, topics=partitions, dispatch_topics=topics)
    repo = SubmitRepository(db, dispatch_topic=tuned.dispatch_topic, work=work, at_once=at_once)
    async with running(at_once):
        first, _ = await repo.submit(submitted("first"))
        await within(10, lambda: work.published_waiting == 1)
        assert await unpublished(db) == 1  # sent, not recorded yet
        second, _ = await repo.submit(submitted("second"))  # records the first
        assert await unpublished(db) == 1  # the second's own row waits to be recorded
        await within(10, lambda: work.published_waiting == 1)
    # Stopping wrote the marks left.
    assert await unpublished(db) == 0
    sent = await records(tuned.require_kafka(), tuned.dispatch_topic, 2)
    assert sorted(k.decode() for _, _, k in sent) == sorted([first.id, second.id])
    async with db.connect() as conn:
        rows = (
            await conn.execute(
                select(jobs.c.id, jobs.c.state, jobs.c.dispatch_partition, jobs.c.dispatch_offset)
            )
        ).all()
        found = await conn.execute(select(partition_ends.c.partition, partition_ends.c.end_offset))
        ends = {p: e for p, e in found}
    positions = {str(r.id): (r.dispatch_partition, r.dispatch_offset) for r in rows}
    assert {str(r.id): r.state for r in rows} == dict.fromkeys(positions, "dispatched")
    assert positions == {k.decode(): (p, o) for p, o, k in sent}
    for p, o, _ in sent:
        assert ends[p] >= o + 1


async def test_a_row_its_writer_left_is_the_relays_after_its_grace(
    settings: Settings, db: AsyncEngine
) -> None:
    tuned = settings.model_copy(update={"publish_at_once_grace_s": 2.0})
    work = UnitOfWork(db, linger_s=0.0)
    # Never run: what is offered is left to the relay (as with the broker down).
    at_once = at_once_publisher(tuned, work, topics=tuned.topic_partitions())
    repo = SubmitRepository(db, dispatch_topic=tuned.dispatch_topic, work=work, at_once=at_once)
    stored, _ = await repo.submit(submitted("left"))
    store = OutboxStore(db, dispatch_topic=tuned.dispatch_topic)
    publisher = Publisher(
        Target(
            bootstrap=tuned.require_kafka(),
            topics=tuned.topic_partitions(),
            dispatch_topics=frozenset([tuned.dispatch_topic]),
            idempotent=tuned.kafka_idempotent_producer,
        )
    )
    try:
        assert (await store.publish_batch(10, publisher.publish)).published == 0
        await asyncio.sleep(2.2)
        assert (await store.publish_batch(10, publisher.publish)).published == 1
    finally:
        await publisher.disconnect()
    async with db.connect() as conn:
        state = await conn.scalar(select(jobs.c.state).where(jobs.c.id == stored.id))
    assert state == JobState.DISPATCHED.value
    sent = await records(tuned.require_kafka(), tuned.dispatch_topic, 1)
    assert [k.decode() for _, _, k in sent] == [stored.id]


async def test_a_workers_job_event_is_published_at_once_and_marked_alone(
    settings: Settings, db: AsyncEngine
) -> None:
    tuned = settings.model_copy(update={"publish_mark_linger_s": 0.2})
    row = job("ran", "running", None, attempt=1)
    async with db.connect() as conn:
        await conn.execute(insert(jobs).values(row))
    ran = ClaimedJob(
        id=row["id"],
        tenant="t",
        kind=JobKind.COMPLETE,
        input="ran",
        max_tokens=4,
        deadline=row["deadline"],
        created_at=datetime.now(UTC),
        attempt=1,
        callback_url=None,
    )
    ends = EndRepository(
        db,
        events_topic=tuned.events_topic,
        at_once=at_once_publisher(tuned, UnitOfWork(db, linger_s=0.0), topics=events_topic(tuned)),
    )
    async with running(ends.at_once):
        assert await ends.finish(ran, JobState.SUCCEEDED, result={"text": "done"})
        assert not await ends.finish(ran, JobState.FAILED)  # one terminal state
        async with asyncio.timeout(10):  # marked alone, after the linger
            while await unpublished(db):
                await asyncio.sleep(0.02)
    sent = await records(tuned.require_kafka(), tuned.events_topic, 1)
    assert [k.decode() for _, _, k in sent] == [row["id"]]


async def test_a_row_not_sent_at_once_is_left_to_the_relay(
    settings: Settings, db: AsyncEngine
) -> None:
    """Its writer's broker unreachable: the send fails, the row is counted as left to the
    relay, which publishes it once its grace has passed."""
    tuned = settings.model_copy(update={"publish_at_once_grace_s": 2.0})
    dispatch = frozenset([tuned.dispatch_topic])
    gone = Target(
        bootstrap=f"127.0.0.1:{free_port()}",
        topics=tuned.topic_partitions(),
        dispatch_topics=dispatch,
    )
    work = UnitOfWork(db, linger_s=0.0)
    at_once = AtOncePublisher(gone, work=work, linger_s=0.2, grace_s=2.0)
    repo = SubmitRepository(db, dispatch_topic=tuned.dispatch_topic, work=work, at_once=at_once)
    before = left_to_relay()
    async with running(at_once):
        stored, _ = await repo.submit(submitted("unsent"))
        await within(20, lambda: left_to_relay() > before)
    assert await unpublished(db) == 1
    publisher = Publisher(
        Target(
            bootstrap=tuned.require_kafka(),
            topics=tuned.topic_partitions(),
            dispatch_topics=dispatch,
            idempotent=tuned.kafka_idempotent_producer,
        )
    )
    store = OutboxStore(db, dispatch_topic=tuned.dispatch_topic)
    try:
        async with asyncio.timeout(20):
            while not (await store.publish_batch(10, publisher.publish)).published:
                await asyncio.sleep(0.2)
    finally:
        await publisher.disconnect()
    sent = await records(tuned.require_kafka(), tuned.dispatch_topic, 1)
    assert [k.decode() for _, _, k in sent] == [stored.id]
