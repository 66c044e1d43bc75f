"""Loops that sleep until woken, after a burst and then silence (issue 43, point 4): the last
item of a burst is still handled within the loop's own bound, never only by a long fallback.

Each test runs the loop as its process runs it, on the real database, with the jobs channel
heard as the API hears it (``producers/api/lifespan.py``): every notice touches the process's
``Activity``, so a loop that found nothing to do may wait ``QUIET_S`` (30 s) for the next one.
Where the wake is what is tested, the loop's interval is long too; the bounds carry a few
seconds of slack for a loaded machine (liveness, not speed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.activity import Activity
from plumbing.notify import JobNotice, Listener
from plumbing.settings import Settings
from producers.batches import lifecycle, meter
from producers.batches.input import RequestChecker, chunked
from producers.batches.lifecycle import Lifecycle
from producers.batches.lifecycle_repository import LifecycleStore
from producers.batches.meter import Meter
from producers.batches.meter_repository import MeterStore
from producers.batches.repository import BatchRequest, BatchStore
from producers.files.repository import FileStore
from producers.lag.estimate import LagEstimate
from producers.retention.pruner import Pruner
from producers.retention.repository import RetentionStore
from schemas import constants
from schemas.jobs import JobKind
from schemas.tables import batches, dead_letters, jobs, outbox, webhook_deliveries, workers
from tests.integration.rows import batch_of, job, new
from tests.support.loops import running, within

SLACK_S = 5.0  # a loaded 2-core machine's delays: the bounds are liveness, not speed
LONG_S = 60.0  # a fallback interval that would fail every bound below
RESULT = {"text": "done", "engine": "sim", "prompt_tokens": 3, "output_tokens": 1}


@asynccontextmanager
async def hearing(
    db: AsyncEngine, activity: Activity, wake: Callable[[], None]
) -> AsyncIterator[None]:
    """The jobs channel heard as an API process hears it: every notice of a batch's job
    touches ``activity`` and calls ``wake``; a (re)connect touches it. Once connected."""

    def on_notice(payload: str) -> None:
        notice = JobNotice.parse(payload)
        if notice is None or notice.in_batch is not False:
            activity.touch()
            wake()

    listener = Listener(
        db.url.render_as_string(hide_password=False),
        constants.JOBS_CHANNEL,
        on_notice=on_notice,
        on_connect=activity.touch,
    )
    activity.heard_by(listener.connected)
    async with running(listener.run):
        async with asyncio.timeout(10):
            await listener.connected.wait()
        yield


async def count(db: AsyncEngine, *where: Any) -> int:
    async with db.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(jobs).where(*where)) or 0)


async def end_jobs(db: AsyncEngine, *where: Any) -> None:
    """The jobs matching ``where`` end, each in its own transaction and all at once, as a
    burst of workers' end writes (each a notice on the jobs channel)."""
    async with db.connect() as conn:
        ids = (await conn.scalars(select(jobs.c.id).where(*where))).all()

    async def end(job_id: Any) -> None:
        async with db.begin() as conn:
            await conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id)
                .values(state="succeeded", finished_at=datetime.now(UTC), result=RESULT)
            )

    await asyncio.gather(*(end(i) for i in ids))


# The batch meter (producers/batches/meter.py).


class LagReading:
    """Admission as the meter sees it: the lag of its last reading (None: unknown), and the
    estimate the meter reports into."""

    def __init__(self, lag: int | None) -> None:
        self.lag = lag
        self.estimate = LagEstimate()

    def current_lag(self) -> int | None:
        return self.lag


def metered(
    settings: Settings,
    db: AsyncEngine,
    reading: LagReading,
    activity: Activity,
    *,
    soft: int,
    interval_s: float,
    counts_backlog: bool,
) -> Meter:
    store = MeterStore(
        db, dispatch_topic=settings.dispatch_topic, events_topic=settings.events_topic
    )
    return Meter(
        store,
        reading,  # type: ignore[arg-type]
        soft=soft,
        fill=1.0,
        interval_s=interval_s,
        counts_backlog=counts_backlog,
        activity=activity,
    )


async def hold_batches(db: AsyncEngine, m: Meter, *, batches_n: int, jobs_each: int) -> None:
    """A burst of batches stored at once (their jobs held), each waking the meter as the
    API's POST /v1/batches does."""
    store = BatchStore(db, events_topic="unused")

    async def one(n: int) -> None:
        lines = [
            BatchRequest(custom_id=f"{n}-{i}", kind=JobKind.COMPLETE, input="x", max_tokens=4)
            for i in range(jobs_each)
        ]
        await store.create(
            new(f"tenant-{n}"),
            chunked(lines),
            endpoint=lambda: "/v1/completions",
            admit=lambda jobs, held: None,
        )
        m.wake()

    await asyncio.gather(*(one(n) for n in range(batches_n)))


RELEASED = (~jobs.c.held, jobs.c.batch_id.is_not(None))
RELEASED_OPEN = (*RELEASED, jobs.c.state == "queued")


async def test_meter_releases_the_last_held_job_within_an_interval_of_room(
    settings: Settings, db: AsyncEngine
) -> None:
    """Bound: once there is room, the last held job of a burst is released within
    ``interval_s`` (plus ``MIN_GAP_S``), even when the room comes with nothing the meter
    hears (the lag reading catching up) after a burst of batches and of ends, then silence:
    a round that leaves jobs held is never quiet, so no ``QUIET_S`` wait comes between."""
    interval_s = 1.0
    reading, activity = LagReading(0), Activity()
    m = metered(
        settings, db, reading, activity, soft=8, interval_s=interval_s, counts_backlog=False
    )
    async with hearing(db, activity, m.job_ended), running(m.run):
        await hold_batches(db, m, batches_n=3, jobs_each=5)
        await within(partial(at_least, db, 8), SLACK_S, "the first room's 8 jobs released")
        reading.lag = 8  # the reading counts them now
        await end_jobs(db, *RELEASED_OPEN)  # a burst of ends: the stale reading leaves no room
        await asyncio.sleep(interval_s)  # the rounds they woke found no room; then silence
        assert await count(db, *RELEASED) == 8
        reading.lag = 0  # the reading catches up: room, and nothing heard
        await within(
            partial(at_least, db, 15),
            interval_s + meter.MIN_GAP_S + SLACK_S,
            "the last held jobs released after the room appeared",
        )
    assert await count(db, jobs.c.held) == 0


async def at_least(db: AsyncEngine, n: int) -> bool:
    return await count(db, *RELEASED) >= n


async def test_meter_releases_the_last_held_job_when_a_burst_of_ends_makes_room(
    settings: Settings, db: AsyncEngine
) -> None:
    """Bound: a job's end that leaves room wakes the meter (``job_ended``, the jobs
    channel's notice), so after a burst of batches over the room and bursts of ends, the
    last held job is released within a round of the ends, never only at the next interval
    (here 60 s) or after a quiet wait (``QUIET_S``)."""
    reading, activity = LagReading(0), Activity()
    m = metered(settings, db, reading, activity, soft=8, interval_s=LONG_S, counts_backlog=True)
    async with hearing(db, activity, m.job_ended), running(m.run):
        await hold_batches(db, m, batches_n=4, jobs_each=5)  # 20 jobs, room for 8
        await within(partial(at_least, db, 8), SLACK_S, "released at the batches' wake")
        for before, after in ((8, 16), (16, 20)):
            assert await count(db, *RELEASED) == before
            await end_jobs(db, *RELEASED_OPEN)
            ended = time.monotonic()
            await within(
                partial(at_least, db, after),
                SLACK_S,
                f"{after} released after a burst of ends",
                since=ended,
            )
    assert await count(db, jobs.c.held) == 0


# The batch lifecycle (producers/batches/lifecycle.py).


class WatchedLifecycleStore(LifecycleStore):
    """The lifecycle's store, noting what each round's ``mark_finalizing`` marked."""

    def __init__(self, db: AsyncEngine, events_topic: str) -> None:
        super().__init__(db, BatchStore(db, events_topic=events_topic), FileStore(db))
        self.marked: list[int] = []

    async def mark_finalizing(self, limit: int = 100) -> int:
        marked = await super().mark_finalizing(limit)
        self.marked.append(marked)
        return marked


def lifecycle_of(
    settings: Settings, store: LifecycleStore, activity: Activity, *, interval_s: float
) -> Lifecycle:
    return Lifecycle(
        store,
        lambda endpoint: RequestChecker(settings.api, endpoint=endpoint),
        interval_s=interval_s,
        activity=activity,
    )


async def statuses(db: AsyncEngine, ids: list[str]) -> set[str]:
    async with db.connect() as conn:
        found = await conn.scalars(select(batches.c.status).where(batches.c.id.in_(ids)))
        return set(found.all())


async def end_batches(db: AsyncEngine, ids: list[str]) -> None:
    """Each batch's jobs end together, in one transaction a batch, all batches at once."""

    async def end(batch_id: str) -> None:
        async with db.begin() as conn:
            await conn.execute(
                update(jobs)
                .where(jobs.c.batch_id == batch_id)
                .values(state="succeeded", held=False, finished_at=datetime.now(UTC), result=RESULT)
            )

    await asyncio.gather(*(end(b) for b in ids))


async def test_lifecycle_completes_every_batch_of_a_burst_within_an_interval_of_its_last_job(
    settings: Settings, db: AsyncEngine
) -> None:
    """Bound: a batch reaches its final status within ``interval_s`` of its last job's end,
    woken by that end's notice; after a burst of batches whose last jobs end together, then
    silence, every one is ``completed`` within a few rounds of the ends, never only at the
    next interval (here 60 s) or after a quiet wait (``QUIET_S``)."""
    deadline = datetime.now(UTC) + timedelta(hours=1)
    ids = [await batch_of(db, f"tenant-{n}", 3, deadline) for n in range(8)]
    activity = Activity()
    store = WatchedLifecycleStore(db, settings.events_topic)
    lc = lifecycle_of(settings, store, activity, interval_s=LONG_S)
    async with hearing(db, activity, lc.wake), running(lc.run):
        await end_batches(db, ids)
        ended = time.monotonic()

        async def completed() -> bool:
            return await statuses(db, ids) == {"completed"}

        await within(completed, SLACK_S, "every batch completed", since=ended)


async def test_lifecycle_completes_a_batch_its_woken_round_found_locked_within_an_interval(
    settings: Settings, db: AsyncEngine
) -> None:
    """Bound: a batch whose last job ended reaches its final status within ``interval_s``
    (plus ``MIN_GAP_S``) of being free to take, even when the round its last job's notice
    woke found its row held by another transaction (the webhook dispatcher locks a batch's
    row as each of its jobs ends: workers/webhooks/delivery_repository.py:190) and nothing
    is heard afterwards: the interval, not ``QUIET_S``, must bring the next round."""
    interval_s = 0.5
    deadline = datetime.now(UTC) + timedelta(hours=1)
    batch_id = await batch_of(db, "acme", 3, deadline)
    activity = Activity()
    store = WatchedLifecycleStore(db, settings.events_topic)
    lc = lifecycle_of(settings, store, activity, interval_s=interval_s)
    async with hearing(db, activity, lc.wake), running(lc.run):
        async with db.connect() as holder:
            await holder.execution_options(isolation_level="READ COMMITTED")
            held = await holder.begin()
            await holder.execute(
                select(batches.c.id).where(batches.c.id == batch_id).with_for_update()
            )
            rounds = len(store.marked)
            await end_batches(db, [batch_id])

            async def looked() -> bool:
                return len(store.marked) > rounds

            await within(looked, SLACK_S, "a round woken by the ends")
            await asyncio.sleep(1.0)  # the rounds the burst of notices woke, all while held
            assert set(store.marked[rounds:]) == {0}  # it was passed over (SKIP LOCKED)
            await held.rollback()
        free = time.monotonic()

        async def completed() -> bool:
            return await statuses(db, [batch_id]) == {"completed"}

        await within(
            completed,
            interval_s + lifecycle.MIN_GAP_S + SLACK_S,
            "the batch completed once its row was free",
            since=free,
        )


# The pruner (producers/retention/pruner.py).


def retention(settings: Settings, **windows: float) -> Settings:
    return settings.model_copy(update={"prune_batch_rows": 5, **windows})


def published(n: int, at: datetime | None, key: str = "k") -> list[dict[str, Any]]:
    return [
        {"topic": "d", "key": f"{key}-{i}", "payload": b"x", "published_at": at} for i in range(n)
    ]


def delivered(n: int, at: datetime | None, name: str = "d") -> list[dict[str, Any]]:
    return [
        {
            "id": f"msg_{name}{i}",
            "tenant": "t",
            "subject": f"{name}{i}",
            "event_type": "job.succeeded",
            "url": "https://example.com/hook",
            "body": "{}",
            "state": "delivered" if at is not None else "pending",
            "finished_at": at,
        }
        for i in range(n)
    ]


def dead(n: int, at: datetime, reason: str = "old") -> list[dict[str, Any]]:
    return [{"source": "webhook", "reason": reason, "created_at": at} for _ in range(n)]


async def rows(db: AsyncEngine, table: Any, *where: Any) -> int:
    async with db.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(table).where(*where)) or 0)


async def ended_batch(db: AsyncEngine, jobs_n: int, deadline: datetime, ended: datetime) -> str:
    batch_id = await batch_of(db, "t", jobs_n, deadline)
    async with db.begin() as conn:
        await conn.execute(
            update(jobs)
            .where(jobs.c.batch_id == batch_id)
            .values(state="succeeded", held=False, finished_at=ended)
        )
    return batch_id


async def test_pruner_deletes_a_burst_of_several_batches_of_rows_in_one_pass(
    settings: Settings, db: AsyncEngine
) -> None:
    """Bound: one pass deletes every row past its window, however many times
    ``prune_batch_rows`` there are: a table gives batches until one is short, and a burst
    of an exact multiple of the batch (the last full batch then an empty one) is no
    exception."""
    now = datetime.now(UTC)
    old, ended = now - timedelta(hours=2), now - timedelta(days=2)
    async with db.begin() as conn:
        await conn.execute(insert(outbox), published(15, old) + published(1, now, "new"))
        await conn.execute(insert(outbox), published(1, None, "unpublished"))
        singles = [job(f"j{i}", "succeeded", ended) for i in range(10)]
        await conn.execute(insert(jobs), [*singles, job("recent", "succeeded", now)])
        await conn.execute(insert(dead_letters), dead(11, ended) + dead(1, now, "new"))
        await conn.execute(
            insert(webhook_deliveries), delivered(5, ended) + delivered(1, None, "pending")
        )
        gone_workers = [
            {"id": f"w{i}", "model": "m", "engine": "sim", "capacity": 1, "running": 0}
            for i in range(5)
        ]
        await conn.execute(insert(workers), gone_workers)
        await conn.execute(update(workers).values(seen_at=old))
    kept = [await ended_batch(db, 5, now + timedelta(hours=1), ended)]
    for _ in range(2):
        await ended_batch(db, 5, now - timedelta(days=3), ended)

    windows = retention(settings, retention_outbox_s=3600, retention_ended_s=86_400).retention
    done = await Pruner(windows, RetentionStore(db)).prune(now)

    assert done == {
        "outbox": 15,
        "jobs": 10 + 2 * 5,
        "webhook_deliveries": 5,
        "dead_letters": 11,
        "workers": 5,
        "batches": 2,
    }
    assert await rows(db, outbox) == 2
    assert await rows(db, jobs) == 1 + 5  # the recent single, the open window's batch
    assert await rows(db, dead_letters) == 1
    assert await rows(db, webhook_deliveries) == 1
    assert await rows(db, workers) == 0
    async with db.connect() as conn:
        assert [str(b) for b in (await conn.scalars(select(batches.c.id))).all()] == kept


async def test_pruner_deletes_rows_that_pass_their_window_in_silence_within_an_interval(
    settings: Settings, db: AsyncEngine
) -> None:
    """Bound: a row is gone within ``prune_interval_s`` of passing its window: a burst
    already past it goes at the first pass, and a burst that passes it later, while
    nothing else happens, goes at the next pass after (a few batches each)."""
    interval_s, window_s = 1.0, 3.0
    tuned = retention(
        settings,
        prune_interval_s=interval_s,
        retention_outbox_s=window_s,
        retention_ended_s=window_s,
    )
    now = datetime.now(UTC)
    past = now - timedelta(seconds=window_s + 60)
    soon = now - timedelta(seconds=window_s - 1.0)  # past its window a second from now
    crossed = time.monotonic() + 1.0
    async with db.begin() as conn:
        await conn.execute(insert(outbox), published(10, past, "past") + published(15, soon))
        await conn.execute(insert(jobs), [job(f"j{i}", "failed", soon) for i in range(10)])
        await conn.execute(insert(dead_letters), dead(7, soon))
        await conn.execute(insert(webhook_deliveries), delivered(5, soon))
    batch_id = await ended_batch(db, 5, soon, soon)
    pruner = Pruner(tuned.retention, RetentionStore(db))
    async with running(pruner.run):

        async def past_gone() -> bool:
            return await rows(db, outbox, outbox.c.key.like("past-%")) == 0

        await within(past_gone, SLACK_S, "the burst already past its window")

        async def all_gone() -> bool:
            left = [await rows(db, t) for t in (outbox, jobs, dead_letters, webhook_deliveries)]
            return sum(left) + await rows(db, batches, batches.c.id == batch_id) == 0

        await within(
            all_gone, interval_s + SLACK_S, "the burst that passed its window", since=crossed
        )
