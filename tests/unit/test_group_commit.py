"""Group commit of single submits, against a fake writer: when groups are written, what
each caller is answered, and what a stop does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from producers.jobs.group_commit import GroupCommit
from producers.jobs.submit_repository import Stored
from schemas.errors import SluicegateError
from schemas.jobs import Job, JobKind, NewJob, Priority
from schemas.states import JobState

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def new(text: str = "a document") -> NewJob:
    return NewJob(
        tenant="t",
        kind=JobKind.SUMMARIZE,
        input=text,
        max_tokens=16,
        deadline=NOW + timedelta(hours=1),
        priority=Priority.NORMAL,
        callback_url=None,
        idempotency_key=None,
        request_hash=None,
    )


def stored(n: NewJob, i: int) -> Stored:
    job = Job(
        id=f"job-{i}-{n.input}",
        tenant=n.tenant,
        kind=n.kind,
        state=JobState.QUEUED,
        priority=n.priority,
        max_tokens=n.max_tokens,
        deadline=n.deadline,
        callback_url=None,
        idempotency_key=None,
        created_at=NOW,
        updated_at=NOW,
        dispatched_at=None,
        started_at=None,
        finished_at=None,
        attempt=0,
        result=None,
        error=None,
        abandon_on_disconnect=False,
        abandon_after_s=None,
        last_seen_at=NOW,
        decoded_tokens=None,
    )
    return job, True


@dataclass
class Writer:
    """Answers every job as created; a group holding "bad" fails as a statement would, and
    ``error`` fails every group. ``gate`` holds the first write until it is set."""

    calls: list[list[str]] = field(default_factory=list)
    gate: asyncio.Event | None = None
    error: BaseException | None = None

    async def submit_group(self, group: Sequence[NewJob]) -> list[Stored | SluicegateError]:
        self.calls.append([n.input for n in group])
        if self.gate is not None and len(self.calls) == 1:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        if any(n.input == "bad" for n in group):
            raise ValueError("a value the database refuses")
        return [stored(n, i) for i, n in enumerate(group)]


@pytest.fixture
async def stop() -> AsyncIterator[asyncio.Event]:
    event = asyncio.Event()
    yield event
    event.set()


def started(groups: GroupCommit, stop: asyncio.Event) -> asyncio.Task[None]:
    return asyncio.create_task(groups.run(stop))


async def until(condition: Callable[[], bool], limit_s: float = 5.0) -> None:
    async with asyncio.timeout(limit_s):
        while not condition():
            await asyncio.sleep(0.001)


async def test_concurrent_submits_share_one_write(stop: asyncio.Event) -> None:
    writer = Writer()
    groups = GroupCommit(writer, max_items=100, wait_s=0.002, writers=2)
    runner = started(groups, stop)
    answers = await asyncio.gather(*(groups.submit(new(f"d{i}")) for i in range(20)))
    assert writer.calls == [[f"d{i}" for i in range(20)]]
    assert [job.id.rsplit("-", 1)[1] for job, _ in answers] == [f"d{i}" for i in range(20)]
    stop.set()
    await runner


async def test_a_submit_to_an_idle_api_is_written_at_once(stop: asyncio.Event) -> None:
    writer = Writer()
    groups = GroupCommit(writer, max_items=100, wait_s=60.0, writers=2)
    runner = started(groups, stop)
    async with asyncio.timeout(5):  # not the 60 s a group may linger
        _, created = await groups.submit(new())
    assert created
    stop.set()
    await runner


async def test_a_group_lingers_while_another_is_written_unless_full(
    stop: asyncio.Event,
) -> None:
    gate = asyncio.Event()
    writer = Writer(gate=gate)
    groups = GroupCommit(writer, max_items=3, wait_s=0.2, writers=2)
    runner = started(groups, stop)
    first = asyncio.create_task(groups.submit(new("first")))
    await until(lambda: len(writer.calls) == 1)
    lingering = [asyncio.create_task(groups.submit(new(f"l{i}"))) for i in range(2)]
    await asyncio.sleep(0.05)
    assert len(writer.calls) == 1  # the second writer is free, but the group lingers
    assert groups.gathered == 2
    full = asyncio.create_task(groups.submit(new("l2")))  # max_items reached: written now
    await until(lambda: len(writer.calls) == 2)
    assert writer.calls[1] == ["l0", "l1", "l2"]
    await asyncio.gather(*lingering, full)
    late = asyncio.create_task(groups.submit(new("late")))
    await asyncio.sleep(0.05)
    assert len(writer.calls) == 2  # "first" is still being written: "late" lingers
    await until(lambda: len(writer.calls) == 3, limit_s=2.0)  # until wait_s is up
    gate.set()
    await asyncio.gather(first, late)
    stop.set()
    await runner


async def test_one_bad_submit_fails_alone(stop: asyncio.Event) -> None:
    writer = Writer()
    groups = GroupCommit(writer, max_items=100, wait_s=0.002, writers=2)
    runner = started(groups, stop)
    texts = [f"d{i}" for i in range(7)]
    texts.insert(5, "bad")
    answers = await asyncio.gather(*(groups.submit(new(t)) for t in texts), return_exceptions=True)
    for text, answer in zip(texts, answers, strict=True):
        if text == "bad":
            assert isinstance(answer, ValueError)
        else:
            assert isinstance(answer, tuple)
            assert answer[0].id.endswith(f"-{text}")
    assert len(writer.calls) <= 1 + 2 * 3  # halves down to the one at fault: 8 = 2**3
    written = [t for call in writer.calls for t in call if "bad" not in call]
    assert sorted(written) == sorted(t for t in texts if t != "bad")
    stop.set()
    await runner


async def test_a_database_out_of_reach_fails_the_group_once(stop: asyncio.Event) -> None:
    writer = Writer(error=ConnectionRefusedError("no database"))
    groups = GroupCommit(writer, max_items=100, wait_s=0.002, writers=2)
    runner = started(groups, stop)
    answers = await asyncio.gather(
        *(groups.submit(new(f"d{i}")) for i in range(6)), return_exceptions=True
    )
    assert all(isinstance(a, ConnectionRefusedError) for a in answers)
    assert len(writer.calls) == 1  # not split and written again
    stop.set()
    await runner


async def test_stop_writes_what_is_gathered_then_returns(stop: asyncio.Event) -> None:
    gate = asyncio.Event()
    writer = Writer(gate=gate)
    groups = GroupCommit(writer, max_items=100, wait_s=60.0, writers=1)
    runner = started(groups, stop)
    first = asyncio.create_task(groups.submit(new("first")))
    await until(lambda: len(writer.calls) == 1)
    pending = [asyncio.create_task(groups.submit(new(f"p{i}"))) for i in range(4)]
    await until(lambda: groups.gathered == 4)
    stop.set()
    await asyncio.sleep(0.01)
    assert not runner.done()  # the first write is still going on
    gate.set()
    async with asyncio.timeout(5):
        await runner
    answers = await asyncio.gather(first, *pending)
    assert all(created for _, created in answers)
    assert writer.calls == [["first"], ["p0", "p1", "p2", "p3"]]
    _, created = await groups.submit(new("after"))  # stopped: written alone, at once
    assert created
    assert writer.calls[-1] == ["after"]


async def test_a_caller_gone_before_its_group_is_taken_stores_nothing(
    stop: asyncio.Event,
) -> None:
    gate = asyncio.Event()
    writer = Writer(gate=gate)
    groups = GroupCommit(writer, max_items=100, wait_s=60.0, writers=1)
    runner = started(groups, stop)
    first = asyncio.create_task(groups.submit(new("first")))
    await until(lambda: len(writer.calls) == 1)
    gone = asyncio.create_task(groups.submit(new("gone")))
    kept = asyncio.create_task(groups.submit(new("kept")))
    await until(lambda: groups.gathered == 2)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    gate.set()
    await asyncio.gather(first, kept)
    stop.set()
    await runner
    assert writer.calls == [["first"], ["kept"]]
