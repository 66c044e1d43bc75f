"""Producers push back on lag over HTTP, on the real broker and database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import func, select

from plumbing.db import make_engine
from plumbing.settings import Settings
from producers.jobs.repository import JobRepository
from producers.lag.estimate import LagEstimate
from producers.lag.kafka import KafkaLagSource
from producers.lag.monitor import LagMonitor
from producers.lag.rule import Reading
from producers.service import run_relay
from schemas.tables import jobs
from tests.integration.pipeline import DOC, Pipeline, open_pipeline
from workers.service import run_worker


@pytest.fixture
async def pipeline(settings: Settings) -> AsyncIterator[Pipeline]:
    tight = settings.model_copy(
        update={
            "lag_soft": 4,
            "lag_hard": 8,
            "admission_mode": "reject",
            "lag_interval_s": 0.2,
            "deadline_aware": False,
            "sim_time_scale": 0.1,
        }
    )
    async for p in open_pipeline(tight):
        yield p


async def stored_jobs(settings: Settings) -> int:
    db = make_engine(settings.require_database_url(), pool_size=1)
    try:
        async with db.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(jobs))).scalar_one())
    finally:
        await db.dispose()


async def test_lag_over_threshold_yields_429_then_resumes_with_a_worker(
    pipeline: Pipeline,
) -> None:
    pipeline.start(run_relay)  # no workers: the backlog can only grow
    accepted = 0
    refusal = None
    for _ in range(400):
        response = await pipeline.client.post(
            "/v1/jobs", json={"kind": "summarize", "input": DOC, "ttl_s": 600}
        )
        if response.status_code == 429:
            refusal = response
            break
        assert response.status_code == 202, response.text
        accepted += 1
        await asyncio.sleep(0.05)
    assert refusal is not None, "the API never pushed back"
    body = refusal.json()
    assert body["status"] == "yield"
    assert body["reason"] in {"lag_soft", "lag_hard"}
    assert body["lag"] >= 4
    assert body["retry_after_ms"] > 0
    assert int(refusal.headers["retry-after"]) >= 1
    assert body["error"]["code"] == body["reason"]
    assert await stored_jobs(pipeline.settings) == accepted  # nothing stored for the refusal

    pipeline.start(run_worker)
    async with asyncio.timeout(60):
        while True:
            response = await pipeline.client.post(
                "/v1/jobs", json={"kind": "summarize", "input": DOC, "ttl_s": 600}
            )
            if response.status_code == 202:
                break
            assert response.status_code == 429
            await asyncio.sleep(0.1)


async def test_block_mode_waits_then_admits_and_bounds_waiters(settings: Settings) -> None:
    blocking = settings.model_copy(
        update={
            "lag_soft": 3,
            "lag_hard": 50,
            "admission_mode": "block",
            "max_block_ms": 30_000,
            "max_blocked": 1,
            "lag_interval_s": 0.2,
            "deadline_aware": False,
            "sim_time_scale": 0.1,
        }
    )
    body = {"kind": "summarize", "input": DOC, "ttl_s": 600}
    async for p in open_pipeline(blocking):
        p.start(run_relay)
        for _ in range(3):
            assert (await p.client.post("/v1/jobs", json=body)).status_code == 202
        started = asyncio.get_running_loop().time()
        waiter = asyncio.ensure_future(p.client.post("/v1/jobs", json=body))
        await asyncio.sleep(0.5)
        assert not waiter.done()  # between the thresholds: it waits, it is not refused
        extra = await p.client.post("/v1/jobs", json=body)
        assert extra.status_code == 429
        assert extra.json()["reason"] == "too_many_blocked"
        p.start(run_worker)
        answer = await asyncio.wait_for(waiter, 30)
        assert answer.status_code == 202
        assert asyncio.get_running_loop().time() - started > 0.5
        assert await stored_jobs(blocking) == 4


async def lag_reading(source: KafkaLagSource, *, records: int) -> Reading:
    """The first reading whose ends hold ``records`` published records."""
    async with asyncio.timeout(30):
        while True:
            reading = await source.read()
            if sum(reading.ends.values()) - sum(reading.committed.values()) >= records:
                return reading
            await asyncio.sleep(0.1)


async def test_open_lag_leaves_out_records_of_ended_jobs(pipeline: Pipeline) -> None:
    """Records past the commit point whose job ended (here: cancelled before any worker
    took it) are not work the group still owes: the open lag leaves them out, the consumer
    lag keeps them."""
    s = pipeline.settings
    pipeline.start(run_relay)  # no workers: nothing is committed
    ids = await pipeline.submit(4)
    db = make_engine(s.require_database_url(), pool_size=1)
    sources = [
        KafkaLagSource(
            db=db,
            bootstrap=s.require_kafka(),
            topic=s.dispatch_topic,
            group_id=s.consumer_group,
            partitions=s.partitions,
            count_open=count_open,
        )
        for count_open in (True, False)
    ]
    try:
        reading = await lag_reading(sources[0], records=4)
        assert sum((reading.open or {}).values()) == 4
        for job_id in ids[:3]:
            assert (await pipeline.client.delete(f"/v1/jobs/{job_id}")).status_code == 200
        reading = await sources[0].read()
        consumer = sum(reading.ends.values()) - sum(reading.committed.values())
        assert consumer == 4
        assert reading.open is not None
        assert sum(reading.open.values()) == 1
        plain = await sources[1].read()
        assert plain.open is None
        monitor = LagMonitor(sources[0], estimate=LagEstimate(), interval_s=0.2, stale_after_s=5)
        assert await monitor.refresh()
        assert monitor.snapshot().lag == 1
    finally:
        for source in sources:
            await source.close()
        await db.dispose()


async def test_flow_measures_seconds_per_output_token_of_recent_jobs(pipeline: Pipeline) -> None:
    """The deadline check's measured speed: the median over jobs that succeeded in the last
    minute of (finished - started) / decoded tokens, read from the real rows."""
    s = pipeline.settings
    pipeline.start(run_relay)
    pipeline.start(run_worker)
    ids = await pipeline.submit(4)
    views = await pipeline.wait_terminal(ids)
    assert {v["state"] for v in views.values()} == {"succeeded"}
    db = make_engine(s.require_database_url(), pool_size=1)
    try:
        repo = JobRepository(db, dispatch_topic=s.dispatch_topic, events_topic=s.events_topic)
        flow = await repo.flow()
        async with db.connect() as conn:
            rows = (
                await conn.execute(
                    select(jobs.c.started_at, jobs.c.finished_at, jobs.c.decoded_tokens)
                )
            ).all()
    finally:
        await db.dispose()
    per_token = sorted(
        (r.finished_at - r.started_at).total_seconds() / r.decoded_tokens for r in rows
    )
    assert flow.timed_jobs == 4
    assert flow.token_time_s is not None
    assert flow.token_time_s == pytest.approx((per_token[1] + per_token[2]) / 2, rel=1e-6)
