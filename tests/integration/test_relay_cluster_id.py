"""The relay records each dispatch record with the id of the cluster that acknowledged it: a
producer that outlives the broker (it reconnects by itself to one that came back empty, with a
new cluster id) must not record the new records against the old id, or the reconciler would
take them for gone and send them again, pass after pass."""

from __future__ import annotations

import asyncio

from sqlalchemy import select

from plumbing.db import make_engine
from plumbing.kafka import cluster_id, ensure_topics
from plumbing.settings import Settings
from schemas.tables import jobs
from sluicegate.local.broker.apache import ApacheKafka
from sluicegate.local.broker.tansu import TansuBroker
from tests.integration.pipeline import open_pipeline, relay_only
from tests.support.brokers import on_broker, restart_on_a_lost_log


async def dispatch_cluster_id(settings: Settings, job_id: str, within_s: float = 30) -> str:
    """The cluster id recorded with the job's dispatch record, once the relay published it."""
    db = make_engine(settings.require_database_url(), pool_size=1)
    try:
        async with asyncio.timeout(within_s):
            while True:
                async with db.connect() as conn:
                    found = (
                        await conn.execute(
                            select(jobs.c.dispatch_cluster_id).where(jobs.c.id == job_id)
                        )
                    ).scalar()
                if found is not None:
                    return str(found)
                await asyncio.sleep(0.1)
    finally:
        await db.dispose()


async def test_a_producer_that_outlived_the_broker_records_the_new_cluster_id(
    settings: Settings, lossy_broker: ApacheKafka | TansuBroker
) -> None:
    broker = lossy_broker
    own = on_broker(settings, broker)
    await ensure_topics(broker.bootstrap, own.topic_partitions())
    async for pipeline in open_pipeline(own):
        pipeline.start(relay_only)
        [first] = await pipeline.submit(1)
        assert await dispatch_cluster_id(own, first) == await cluster_id(broker.bootstrap)

        broker.kill()  # the relay is idle: its producer sees nothing of it
        await restart_on_a_lost_log(broker)
        await ensure_topics(broker.bootstrap, own.topic_partitions())
        new_id = await cluster_id(broker.bootstrap)
        # Apache Kafka's restart outlasts the lag's staleness bound: refused until read again.
        [second] = await pipeline.submit_admitted(1)
        assert await dispatch_cluster_id(own, second) == new_id
