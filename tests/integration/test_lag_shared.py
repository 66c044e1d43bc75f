"""One lag reader per replica set, on the real database and broker: one replica reads the
broker and stores its readings, the others take them from PostgreSQL with their age; a
reader that dies, or cannot read the broker, is replaced; a silent reader's reading goes
stale on every replica."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiokafka.errors import KafkaConnectionError
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from producers.lag.estimate import LagEstimate
from producers.lag.kafka import KafkaLagSource
from producers.lag.monitor import LagMonitor
from producers.lag.repository import Share
from producers.lag.rule import Reading
from producers.lag.shared import SharedLagSource


class Counted(KafkaLagSource):
    """The broker reader, counting its reads; ``broken`` makes them fail."""

    def __init__(self, settings: Settings, db: AsyncEngine) -> None:
        super().__init__(
            db=db,
            bootstrap=settings.require_kafka(),
            topic=settings.dispatch_topic,
            group_id=settings.consumer_group,
            partitions=settings.partitions,
        )
        self.reads = 0
        self.broken = False

    async def read(
        self, tally: Callable[[], int] | None = None, share: Share | None = None
    ) -> Reading:
        self.reads += 1
        if self.broken:
            raise KafkaConnectionError("the broker is unreachable from this replica")
        return await super().read(tally, share)


def replica(settings: Settings, db: AsyncEngine) -> tuple[SharedLagSource, Counted]:
    local = Counted(settings, db)
    shared = SharedLagSource(
        local,
        url=settings.require_database_url(),
        topic=settings.dispatch_topic,
        group=settings.consumer_group,
    )
    return shared, local


async def test_one_replica_reads_the_broker_for_all(settings: Settings, db: AsyncEngine) -> None:
    (a, a_kafka), (b, b_kafka) = replica(settings, db), replica(settings, db)
    try:
        taken = await a.read()
        handed = await b.read()
        assert a.reader
        assert not b.reader
        assert (a_kafka.reads, b_kafka.reads) == (1, 0)
        assert taken is not None
        assert handed is not None
        assert (handed.ends, handed.committed, handed.unpublished, handed.open) == (
            taken.ends,
            taken.committed,
            taken.unpublished,
            taken.open,
        )
        assert 0 <= handed.age_s < 5
        assert await b.read() is None  # nothing new since
        await a.read()
        assert await b.read() is not None
        assert b_kafka.reads == 0

        await a.close()  # the reader's process ends: its session and its lock go
        assert await b.read() is not None
        assert b.reader
        assert b_kafka.reads == 1
    finally:
        await a.close()
        await b.close()


async def test_a_reader_that_cannot_reach_the_broker_lets_another_read(
    settings: Settings, db: AsyncEngine
) -> None:
    (a, a_kafka), (b, b_kafka) = replica(settings, db), replica(settings, db)
    try:
        await a.read()
        a_kafka.broken = True
        try:
            await a.read()
        except KafkaConnectionError:
            pass
        else:
            raise AssertionError("the failed read was not reported")
        assert not a.reader
        await b.read()
        assert b.reader
        assert b_kafka.reads == 1
    finally:
        await a.close()
        await b.close()


async def test_a_silent_readers_reading_goes_stale_everywhere(
    settings: Settings, db: AsyncEngine
) -> None:
    (a, _), (b, _) = replica(settings, db), replica(settings, db)
    follower = LagMonitor(b, estimate=LagEstimate(), interval_s=0.1, stale_after_s=1.0)
    try:
        await a.read()  # then the reader stalls, holding its lock
        assert await follower.refresh()
        assert follower.snapshot().known
        await asyncio.sleep(1.2)
        assert not await follower.refresh()
        assert not follower.snapshot().known
        assert not b.reader
    finally:
        await a.close()
        await b.close()
