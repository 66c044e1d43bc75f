"""Workers on Kafka's consumer group protocol (KIP-848, `worker_group_protocol=consumer`),
on Apache Kafka: a worker joining takes partitions from the others without revoking the
ones they keep, a worker stopping hands its partitions over at once, and every job ends
once, with one terminal event."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from sqlalchemy import func, select

from plumbing.db import make_engine
from plumbing.settings import Settings
from producers.service import run_relay
from schemas.tables import outbox
from tests.faults.processes import roles
from tests.integration.pipeline import Pipeline, open_pipeline
from workers.consumer import Worker
from workers.service import working

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def pipeline(settings: Settings, kafka_is_tansu: bool) -> AsyncIterator[Pipeline]:
    if kafka_is_tansu:
        pytest.skip("the consumer protocol is Apache Kafka's (Tansu speaks the classic one)")
    on_consumer_protocol = settings.model_copy(
        update={"worker_group_protocol": "consumer", "sim_time_scale": 0.5}
    )
    async for p in open_pipeline(on_consumer_protocol):
        yield p


class Watched:
    """A worker run as a task, its assignment sampled every 20 ms."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.stop = asyncio.Event()
        self.worker: Worker | None = None
        self.seen: list[frozenset[int]] = []
        self.task = asyncio.ensure_future(self._run(pipeline.settings))
        self._sampling = asyncio.ensure_future(self._sample())

    async def _run(self, settings: Settings) -> None:
        async with working(settings, self.stop) as worker:
            if worker is not None:
                self.worker = worker
                await worker.run(self.stop)

    def holds(self) -> frozenset[int]:
        if self.worker is None:
            return frozenset()
        held: set[TopicPartition] = self.worker.consumer.assignment()
        return frozenset(tp.partition for tp in held)

    def lost(self, since: int = 0) -> set[int]:
        """Partitions it held at a sample (from the ``since``-th on) and not at a later one."""
        gone: set[int] = set()
        seen = self.seen[since:]
        for before, after in itertools.pairwise(seen):
            gone |= before - after
        return gone

    async def _sample(self) -> None:
        while True:
            held = self.holds()
            if not self.seen or self.seen[-1] != held:
                self.seen.append(held)
            await asyncio.sleep(0.02)

    async def until(self, check: object, within_s: float = 30) -> None:
        async with asyncio.timeout(within_s):
            while not callable(check) or not check():
                if self.task.done():
                    self.task.result()  # a worker that died says why
                await asyncio.sleep(0.05)

    async def close(self) -> None:
        self.stop.set()
        await self.task
        self._sampling.cancel()


async def test_a_join_revokes_only_what_moves_and_a_stop_hands_over_at_once(
    pipeline: Pipeline,
) -> None:
    everything = frozenset(range(pipeline.settings.partitions))
    pipeline.start(run_relay)
    a, b = Watched(pipeline), Watched(pipeline)
    await a.until(lambda: a.holds() | b.holds() == everything and a.holds() and b.holds())
    before = {"a": a.holds(), "b": b.holds()}
    ids = await pipeline.submit(24)
    since = {"a": len(a.seen) - 1, "b": len(b.seen) - 1}

    c = Watched(pipeline)
    await c.until(lambda: bool(c.holds()) and a.holds() | b.holds() | c.holds() == everything)
    # Only what c took left a or b: the others were never revoked, and neither a nor b
    # went without partitions (an eager rebalance revokes everything first).
    assert a.lost(since["a"]) | b.lost(since["b"]) == c.holds(), (a.seen, b.seen, c.seen)
    assert all(a.seen[since["a"] :])
    assert all(b.seen[since["b"] :])
    assert a.holds() <= before["a"]
    assert b.holds() <= before["b"]

    # b stops: it leaves the group explicitly, and its partitions move well inside the
    # broker's 10 s session timeout.
    stopped = asyncio.get_running_loop().time()
    await b.close()
    await a.until(lambda: a.holds() | c.holds() == everything, within_s=8)
    moved_s = asyncio.get_running_loop().time() - stopped

    views = await pipeline.wait_terminal(ids)
    assert {v["state"] for v in views.values()} == {"succeeded"}
    await a.close()
    await c.close()
    db = make_engine(pipeline.settings.require_database_url(), pool_size=1)
    try:
        async with db.connect() as conn:
            events = await conn.scalar(
                select(func.count())
                .select_from(outbox)
                .where(outbox.c.topic == pipeline.settings.events_topic)
            )
    finally:
        await db.dispose()
    assert events == len(ids), "one terminal event per job"
    assert moved_s < 8


async def test_a_broker_without_the_protocol_stops_the_worker_with_one_line(
    tansu_settings: Settings, tmp_path: Path
) -> None:
    """Tansu speaks only the classic protocol: librdkafka would wait for an assignment in
    silence, so the worker asks the broker first and exits saying what to set."""
    with roles(tansu_settings, tmp_path) as started:
        worker = started.start("worker", worker_group_protocol="consumer")
        code = await asyncio.to_thread(worker.process.wait, 60)
    lines = worker.output().strip().splitlines()
    assert code == 1
    assert lines[-1].startswith("sluicegate worker (group_protocol_unsupported): the broker")
    assert "SLUICEGATE_WORKER_GROUP_PROTOCOL=classic" in lines[-1]
    assert "Traceback" not in worker.output()
