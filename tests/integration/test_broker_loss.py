"""Accepted jobs survive the loss of the broker: the outbox re-publishes them."""

from __future__ import annotations

import asyncio
from collections import Counter

from sqlalchemy import select

from plumbing.db import make_engine
from plumbing.kafka import ensure_topics
from plumbing.settings import Settings
from producers.service import run_relay
from schemas.tables import outbox
from sluicegate.local.broker.apache import ApacheKafka
from sluicegate.local.broker.tansu import TansuBroker
from tests.integration.pipeline import open_pipeline
from tests.support.brokers import on_broker, restart_on_a_lost_log
from workers.service import run_worker


async def test_broker_killed_between_accept_and_dispatch(
    settings: Settings, lossy_broker: ApacheKafka | TansuBroker
) -> None:
    broker = lossy_broker
    own = on_broker(settings, broker).model_copy(update={"sim_time_scale": 0.05})
    async for pipeline in open_pipeline(own):
        pipeline.start_restartable(run_relay)
        pipeline.start_restartable(run_worker)
        before = await pipeline.submit(5)
        await pipeline.wait_terminal(before)

        broker.kill()  # and its log with it: every record and offset is gone
        accepted = await pipeline.submit(10)  # the API needs only PostgreSQL
        await asyncio.sleep(1.0)  # the relay fails to publish meanwhile
        # What `sluicegate up` does when its embedded broker dies: stop the relay and the
        # workers (their positions index the old cluster, and a client that reconnects first
        # makes Tansu auto-create a topic with defaults, which serves no fetches), start a
        # new broker, create the topics, then start them again. The accepted jobs wait in
        # the outbox meanwhile.
        roles = await pipeline.stop_restartable()
        await restart_on_a_lost_log(broker)
        await ensure_topics(broker.bootstrap, own.topic_partitions())
        for role in roles:
            pipeline.start_restartable(role)

        views = await pipeline.wait_terminal(accepted, timeout_s=90)
        assert {v["state"] for v in views.values()} == {"succeeded"}
        # Delivery is at least once (the relay re-sends a batch it saw no ack for); the
        # fenced terminal write keeps it to exactly one terminal state and one event per job.
        assert await terminal_events(own) == Counter(before + accepted)


async def terminal_events(settings: Settings) -> Counter[str]:
    db = make_engine(settings.require_database_url(), pool_size=1)
    try:
        async with db.connect() as conn:
            keys = (
                await conn.execute(
                    select(outbox.c.key).where(outbox.c.topic == settings.events_topic)
                )
            ).scalars()
            return Counter(keys)
    finally:
        await db.dispose()
