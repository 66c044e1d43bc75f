"""The dispatcher's batching without a timer: events handed over in batches (``batched``)
and attempts recorded together (``Recorder``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

import pytest

from schemas.envelopes import JobEvent
from schemas.states import JobState
from workers.webhooks.app import batched
from workers.webhooks.attempt_repository import Attempted
from workers.webhooks.claim_repository import ClaimedDelivery
from workers.webhooks.delivery_repository import Made
from workers.webhooks.dispatch import Dispatcher
from workers.webhooks.events import EventHandler, EventRecord
from workers.webhooks.recorder import Recorder
from workers.webhooks.retry import AttemptResult, Outcome, RetrySchedule, Verdict


async def fed(queue: asyncio.Queue[int | None]) -> AsyncIterator[int]:
    while (item := await queue.get()) is not None:
        yield item


async def test_a_lone_item_is_written_at_once_and_a_burst_goes_in_one_write() -> None:
    queue: asyncio.Queue[int | None] = asyncio.Queue()
    writes: list[list[int]] = []
    release = asyncio.Event()

    async def write(batch: list[int]) -> None:
        writes.append(batch)
        await release.wait()

    task = asyncio.create_task(batched(fed(queue), write))
    queue.put_nowait(1)
    async with asyncio.timeout(5):
        while not writes:
            await asyncio.sleep(0)
    assert writes == [[1]]  # not held back for company
    for item in (2, 3, 4):
        queue.put_nowait(item)
    for _ in range(20):
        await asyncio.sleep(0)
    assert writes == [[1]]  # one write at a time
    release.set()
    queue.put_nowait(None)
    async with asyncio.timeout(5):
        await task
    assert writes == [[1], [2, 3, 4]]


async def test_at_most_so_many_go_in_a_write() -> None:
    queue: asyncio.Queue[int | None] = asyncio.Queue()
    for item in range(7):
        queue.put_nowait(item)
    queue.put_nowait(None)
    writes: list[list[int]] = []

    async def write(batch: list[int]) -> None:
        writes.append(batch)
        await asyncio.sleep(0.01)

    async with asyncio.timeout(5):
        await batched(fed(queue), write, most=3)
    assert [i for w in writes for i in w] == list(range(7))
    assert max(len(w) for w in writes) <= 3


async def test_a_failed_write_raises() -> None:
    queue: asyncio.Queue[int | None] = asyncio.Queue()
    queue.put_nowait(1)

    async def write(batch: list[int]) -> None:
        raise RuntimeError("database gone")

    with pytest.raises(RuntimeError, match="database gone"):
        async with asyncio.timeout(5):
            await batched(fed(queue), write)


def attempted(delivery_id: str) -> Attempted:
    claimed = ClaimedDelivery(
        id=delivery_id,
        tenant="t",
        url="http://x/",
        subject="s",
        event_type="e",
        body="{}",
        attempt=1,
    )
    return Attempted(
        claimed=claimed,
        answer=AttemptResult(status=204),
        verdict=Verdict(outcome=Outcome.DELIVERED),
    )


async def test_attempts_that_end_together_are_recorded_in_one_write() -> None:
    writes: list[list[str]] = []

    async def write(done: Sequence[Attempted]) -> set[str]:
        writes.append([a.claimed.id for a in done])
        await asyncio.sleep(0.01)
        return {a.claimed.id for a in done} - {"b"}

    recorder = Recorder(write)
    owned = await asyncio.gather(*(recorder.record(attempted(i)) for i in "abc"))
    assert owned == [True, False, True]  # b's lease was taken by another attempt
    assert writes == [["a", "b", "c"]]


async def test_a_failed_record_raises_for_each_attempt_it_held() -> None:
    async def write(done: Sequence[Attempted]) -> set[str]:
        raise ConnectionError("gone")

    recorder = Recorder(write)
    got = await asyncio.gather(
        *(recorder.record(attempted(i)) for i in "ab"), return_exceptions=True
    )
    assert [type(g) for g in got] == [ConnectionError, ConnectionError]


class Enqueued:
    """A delivery repository that keeps what it was asked to enqueue."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    async def enqueue(self, job_ids: Sequence[str], waits: Sequence[float]) -> Made:
        self.asked.append(list(job_ids))
        return Made(ids=[], waits_s=[])


def event(job_id: str, **extra: object) -> EventRecord:
    value = JobEvent(
        job_id=job_id,
        tenant="t",
        state=JobState.SUCCEEDED,
        attempt=1,
        at=datetime.now(UTC),
        **extra,
    )
    return EventRecord(topic="events", partition=0, offset=0, value=value.to_bytes())


async def test_only_the_jobs_that_may_call_for_a_delivery_are_read() -> None:
    """No callback and in no batch: nothing to deliver, the job is not read. A writer that
    did not say whether the job is in a batch (older events): read."""
    repo = Enqueued()
    handler = EventHandler(
        repo,  # type: ignore[arg-type]
        Dispatcher.__new__(Dispatcher),
        schedule=RetrySchedule(steps_s=(0.0,), retry_after_max_s=60.0),
        uniform=lambda low, high: low,
    )
    await handler(
        [
            event("plain", in_batch=False),
            event("called", callback_url="http://x/cb", in_batch=False),
            event("batched", in_batch=True),
            event("unsaid"),
        ]
    )
    assert repo.asked == [["called", "batched", "unsaid"]]
