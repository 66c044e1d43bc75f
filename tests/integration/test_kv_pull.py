"""The KV-gated worker on the real broker and database: it takes a record only when the
engine can start its job, and a rebalance mid-run loses and duplicates nothing."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from sqlalchemy import select

from plumbing.db import make_engine
from plumbing.settings import Settings
from producers.service import run_relay
from schemas.envelopes import DispatchEnvelope
from schemas.tables import outbox
from tests.integration.pipeline import Pipeline, open_pipeline
from workers.consumer import Worker
from workers.engines.sim.engine import SimEngine
from workers.gate import JobProgress
from workers.service import run_worker, working

# A need of ceil((68 estimated prompt tokens + 256 max_tokens) / 16) = 21 blocks per job:
# 64 blocks less a 1-block watermark hold three jobs at once.
BLOCKS = 64


class Probe:
    """Stands between a worker and its consumer and checks every pull and every pause."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.real: AIOKafkaConsumer = worker.consumer
        self.taken = 0  # records handed to the worker and not put back
        self.started = 0
        self.most_untaken = 0
        self.pauses = 0
        self.unjustified_pauses: list[str] = []
        self.most_running = 0
        gate_started = worker.gate.started

        def started(envelope: DispatchEnvelope) -> JobProgress:
            self.started += 1
            self.most_running = max(self.most_running, worker.gate.ledger.running + 1)
            return gate_started(envelope)

        worker.gate.started = started  # type: ignore[method-assign]
        worker.consumer = self  # type: ignore[assignment]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    async def getmany(self, *partitions: Any, **kwargs: Any) -> Any:
        self._check_untaken()
        batches = await self.real.getmany(*partitions, **kwargs)
        self.taken += sum(len(records) for records in batches.values())
        self._check_untaken()
        return batches

    def seek(self, tp: Any, offset: int) -> None:
        self.taken -= 1  # the worker puts back one record at most (max_records=1)
        self.real.seek(tp, offset)

    def pause(self, *partitions: Any) -> None:
        self.pauses += 1
        held = self.worker.held
        gate = self.worker.gate
        if gate.room() and (held is None or gate.admits(held.envelope)):
            self.unjustified_pauses.append(f"running={gate.ledger.running} held={held}")
        self.real.pause(*partitions)

    def _check_untaken(self) -> None:
        self.most_untaken = max(self.most_untaken, self.taken - self.started)


@pytest.fixture
async def pipeline(settings: Settings) -> AsyncIterator[Pipeline]:
    async for p in open_pipeline(settings.model_copy(update={"sim_num_blocks": BLOCKS})):
        yield p


async def test_worker_pulls_only_what_the_kv_cache_holds(pipeline: Pipeline) -> None:
    probes: list[Probe] = []
    engine = SimEngine(num_blocks=BLOCKS, time_scale=1.0)

    async def worker(settings: Settings, stop: asyncio.Event) -> None:
        async with working(settings, stop, engine=engine) as w:
            if w is not None:
                probes.append(Probe(w))
                await w.run(stop)

    pipeline.start(run_relay)
    pipeline.start(worker)
    ids = await pipeline.submit(24)
    views = await pipeline.wait_terminal(ids)
    assert {v["state"] for v in views.values()} == {"succeeded"}
    [probe] = probes
    assert probe.started == 24
    assert probe.pauses > 0  # the cache was full at times: the gate was exercised
    assert probe.unjustified_pauses == []
    assert probe.most_untaken <= 1
    assert probe.most_running == 3
    assert engine.capacity().preemptions == 0


async def terminal_events(settings: Settings) -> Counter[str]:
    db = make_engine(settings.require_database_url(), pool_size=1)
    try:
        async with db.connect() as conn:
            rows = await conn.execute(
                select(outbox.c.payload).where(outbox.c.topic == settings.events_topic)
            )
            return Counter(json.loads(row.payload)["job_id"] for row in rows)
    finally:
        await db.dispose()


@pytest.mark.parametrize("drain_timeout_s", [30.0, 0.2], ids=["finish", "abort"])
async def test_rebalance_mid_run_loses_and_duplicates_nothing(
    settings: Settings, drain_timeout_s: float
) -> None:
    # A job decodes for about 0.27 s per unit of time scale: in the abort case it must last
    # well past the time it takes to see it start, stop the worker and drain.
    scale = 2.0 if drain_timeout_s > 1 else 8.0
    tuned = settings.model_copy(
        update={
            "sim_num_blocks": BLOCKS,
            "sim_time_scale": scale,
            "drain_timeout_s": drain_timeout_s,
        }
    )
    async for pipeline in open_pipeline(tuned):
        pipeline.start(run_relay)
        pipeline.start_restartable(run_worker)
        ids = await pipeline.submit(30)
        async with asyncio.timeout(30):
            while sum(1 for v in await states(pipeline, ids) if v == "succeeded") < 3:
                await asyncio.sleep(0.1)
        if drain_timeout_s < 1:
            # The only worker leaves while a job it just started is decoding (so that job is
            # surely its own and far from its end), and a new one takes its partitions over.
            async with asyncio.timeout(30):
                while not await just_started(pipeline, ids, within_s=0.5):
                    await asyncio.sleep(0.05)
            await pipeline.stop_restartable()
            pipeline.start(run_worker)
        else:
            pipeline.start(run_worker)  # joins the group: a rebalance while jobs run
            async with asyncio.timeout(30):
                while sum(1 for v in await states(pipeline, ids) if v == "succeeded") < 12:
                    await asyncio.sleep(0.1)
            await pipeline.stop_restartable()  # the first leaves: another rebalance
        views = await pipeline.wait_terminal(ids, timeout_s=90)
        assert {v["state"] for v in views.values()} == {"succeeded"}
        events = await terminal_events(tuned)
        assert set(events) == set(ids)
        assert set(events.values()) == {1}  # one terminal write per job
        if drain_timeout_s < 1:
            assert any(v["attempt"] > 1 for v in views.values())  # aborted and redelivered


async def just_started(pipeline: Pipeline, ids: list[str], within_s: float) -> bool:
    """Whether a job is running that started less than ``within_s`` ago."""
    for job_id in ids:
        view = (await pipeline.client.get(f"/v1/jobs/{job_id}")).json()
        started = view["started_at"]
        if view["state"] == "running" and started is not None:
            age = datetime.now(UTC) - datetime.fromisoformat(started)
            if age.total_seconds() < within_s:
                return True
    return False


async def states(pipeline: Pipeline, ids: list[str]) -> list[str]:
    return [(await pipeline.client.get(f"/v1/jobs/{i}")).json()["state"] for i in ids]
