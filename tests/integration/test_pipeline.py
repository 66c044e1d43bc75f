"""Submit → outbox relay → Kafka → worker → terminal state, on the real broker and database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from sqlalchemy import Select, func, select

from plumbing.db import make_engine
from plumbing.settings import Settings
from producers.service import run_relay
from schemas.tables import jobs, outbox
from tests.integration.pipeline import Pipeline, open_pipeline
from workers.service import run_worker


@pytest.fixture
async def pipeline(settings: Settings) -> AsyncIterator[Pipeline]:
    fast = settings.model_copy(update={"sim_time_scale": 0.1})
    async for p in open_pipeline(fast):
        yield p


async def committed(settings: Settings) -> int:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.require_kafka(),
        group_id=settings.consumer_group,
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        total = 0
        for p in range(settings.partitions):
            total += await consumer.committed(TopicPartition(settings.dispatch_topic, p)) or 0
        return total
    finally:
        await consumer.stop()


async def test_jobs_flow_through_relay_and_two_workers(pipeline: Pipeline) -> None:
    pipeline.start(run_relay)
    pipeline.start(run_worker)
    pipeline.start(run_worker)
    ids = await pipeline.submit(20)
    views = await pipeline.wait_terminal(ids)
    assert {v["state"] for v in views.values()} == {"succeeded"}
    assert all(v["attempt"] == 1 for v in views.values())
    assert all(v["result"]["engine"] == "sim" for v in views.values())
    # Every record's offset is committed once its job is terminal.
    async with asyncio.timeout(10):
        while await committed(pipeline.settings) < 20:
            await asyncio.sleep(0.2)
    s = pipeline.settings
    assert await scalar(s, select(func.count()).select_from(jobs)) == 20
    events = select(func.count()).select_from(outbox).where(outbox.c.topic == s.events_topic)
    assert await scalar(s, events) == 20  # exactly one terminal event per job
    unpublished = select(func.count()).select_from(outbox).where(outbox.c.published_at.is_(None))
    async with asyncio.timeout(10):
        while await scalar(s, unpublished):
            await asyncio.sleep(0.2)


async def scalar(settings: Settings, statement: Select[tuple[int]]) -> int:
    db = make_engine(settings.require_database_url(), pool_size=1)
    try:
        async with db.connect() as conn:
            return int((await conn.execute(statement)).scalar_one())
    finally:
        await db.dispose()


async def test_cancelled_before_dispatch_never_runs(pipeline: Pipeline) -> None:
    ids = await pipeline.submit(3)
    r = await pipeline.client.delete(f"/v1/jobs/{ids[0]}")
    assert r.json()["state"] == "cancelled"
    pipeline.start(run_relay)
    pipeline.start(run_worker)
    views = await pipeline.wait_terminal(ids)
    assert views[ids[0]]["state"] == "cancelled"
    assert views[ids[0]]["started_at"] is None
    assert {views[i]["state"] for i in ids[1:]} == {"succeeded"}
