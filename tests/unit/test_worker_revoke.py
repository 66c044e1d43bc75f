"""A revoke while the worker's consumer claims a batch: the claimed jobs are started and end
like the others (none left ``running`` for nobody), and when the broker's cluster id changed
meanwhile (a broker whose data was replaced), the jobs running here run to their end and no
offset of the old cluster is committed to the new one. A commit the broker refuses (a stale
member epoch in a rebalance) is made again, though no other job ends."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka import TopicPartition
from confluent_kafka import KafkaError, KafkaException

from schemas.envelopes import DispatchEnvelope
from schemas.jobs import JobKind, Priority
from workers import consumer as consumer_module
from workers.consumer import Worker
from workers.repository import ClaimedJob

TOPIC = "t.dispatch"
TP = TopicPartition(TOPIC, 0)
JOB = "01a20fad-7aaa-7240-992f-709c1800aa0d"


class FakeConsumer:
    """Yields one dispatch record (offset 7), then nothing; records the commits."""

    def __init__(self) -> None:
        deadline = datetime.now(UTC) + timedelta(minutes=5)
        envelope = DispatchEnvelope(
            job_id=JOB,
            tenant="t",
            kind=JobKind.COMPLETE,
            priority=Priority.NORMAL,
            max_tokens=10,
            prompt_tokens=10,
            deadline=deadline,
        )
        self.records = [SimpleNamespace(offset=7, value=envelope.to_bytes())]
        self.commits: list[dict[TopicPartition, int]] = []
        self.refuse = 0  # commits to refuse, as a broker does one of a stale member epoch
        self.listener: Any = None

    def subscribe(self, topics: list[str], listener: Any) -> None:
        self.listener = listener

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def pause(self, *_: TopicPartition) -> None: ...

    def resume(self, *_: TopicPartition) -> None: ...

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, Any]:
        if self.records:
            return {TP: [self.records.pop()]}
        await asyncio.sleep(min(timeout_ms, 10) / 1000)
        return {}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.refuse:
            self.refuse -= 1
            raise KafkaException(KafkaError(KafkaError.STALE_MEMBER_EPOCH))
        self.commits.append(dict(offsets))


class FakeGate:
    def __init__(self) -> None:
        self.in_flight: set[str] = set()
        self.room_changed = asyncio.Event()

    def room(self) -> bool:
        return len(self.in_flight) < 4

    def admits(self, envelope: DispatchEnvelope) -> bool:
        return self.room()

    def started(self, envelope: DispatchEnvelope) -> object:
        self.in_flight.add(envelope.job_id)
        return object()

    def finished(self, job_id: str) -> None:
        self.in_flight.discard(job_id)


class FakeExecutor:
    """A claim that waits for ``claim_done``; a job that runs until ``job_done``."""

    def __init__(self) -> None:
        self.claiming = asyncio.Event()
        self.claim_done = asyncio.Event()
        self.job_done = asyncio.Event()
        self.ended: list[str] = []

    async def claim(self, job_ids: list[str], stop: asyncio.Event) -> dict[str, Any]:
        self.claiming.set()
        await self.claim_done.wait()
        now = datetime.now(UTC)
        return {
            job_id: ClaimedJob(
                id=job_id,
                tenant="t",
                kind=JobKind.COMPLETE,
                input="x",
                max_tokens=10,
                deadline=now + timedelta(minutes=5),
                created_at=now,
                attempt=1,
                callback_url=None,
            )
            for job_id in job_ids
        }

    async def run(self, job: ClaimedJob, progress: object) -> None:
        await self.job_done.wait()
        self.ended.append(job.id)


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The broker's cluster id, as the worker reads it."""
    current = {"id": "old"}

    class ClusterIdReader:
        def __init__(self, bootstrap: str) -> None:
            pass

        async def read(self) -> str:
            return current["id"]

        async def close(self) -> None:
            pass

    monkeypatch.setattr(consumer_module, "ClusterIdReader", ClusterIdReader)
    return current


def _worker() -> tuple[Worker, FakeConsumer, FakeExecutor]:
    fake, executor = FakeConsumer(), FakeExecutor()
    worker = Worker(
        consumer=cast(Any, fake),
        gate=cast(Any, FakeGate()),
        executor=cast(Any, executor),
        topic=TOPIC,
        bootstrap="unused",
        drain_timeout_s=5.0,
    )
    return worker, fake, executor


async def _revoke_during_claim(
    worker: Worker, fake: FakeConsumer, executor: FakeExecutor, stop: asyncio.Event
) -> tuple[asyncio.Task[None], asyncio.Task[None]]:
    """Start the worker, wait for its claim of the record, and revoke the partition."""
    running = asyncio.create_task(worker.run(stop))
    await asyncio.wait_for(executor.claiming.wait(), 5)
    revoke = asyncio.create_task(fake.listener.on_partitions_revoked({TP}))
    await asyncio.sleep(0.05)
    assert not revoke.done(), "the revoke waits for the claim under way"
    return running, revoke


async def test_after_the_cluster_was_replaced_a_job_claimed_during_the_revoke_runs_to_its_end(
    cluster: dict[str, str],
) -> None:
    worker, fake, executor = _worker()
    stop = asyncio.Event()
    running, revoke = await _revoke_during_claim(worker, fake, executor, stop)
    cluster["id"] = "new"  # the broker restarted empty while the claim was under way
    executor.claim_done.set()
    await asyncio.wait_for(revoke, 5)
    assert worker.running == 1  # started, not dropped: its record is gone with the old cluster
    executor.job_done.set()
    while worker.running:
        await asyncio.sleep(0.01)
    assert executor.ended == [JOB]
    stop.set()
    await asyncio.wait_for(running, 5)
    assert fake.commits == []  # offset 8 indexes the old cluster: never committed to the new one


async def test_in_the_same_cluster_a_job_claimed_during_the_revoke_ends_before_the_commit(
    cluster: dict[str, str],
) -> None:
    worker, fake, executor = _worker()
    stop = asyncio.Event()
    running, revoke = await _revoke_during_claim(worker, fake, executor, stop)
    executor.claim_done.set()
    await asyncio.sleep(0.05)
    assert not revoke.done(), "the revoke drains the job it claimed"
    executor.job_done.set()
    await asyncio.wait_for(revoke, 5)
    assert executor.ended == [JOB]
    assert {TP: 8} in fake.commits
    stop.set()
    await asyncio.wait_for(running, 5)


async def test_a_refused_commit_is_made_again_though_no_other_job_ends(
    cluster: dict[str, str],
) -> None:
    worker, fake, executor = _worker()
    fake.refuse = 2
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    executor.claim_done.set()
    executor.job_done.set()
    async with asyncio.timeout(5):
        while not fake.commits:
            await asyncio.sleep(0.05)
    assert executor.ended == [JOB]
    assert fake.commits == [{TP: 8}]  # refused twice, then made: its job was the last
    stop.set()
    await asyncio.wait_for(running, 5)
