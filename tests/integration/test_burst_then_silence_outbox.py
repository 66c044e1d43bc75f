"""The outbox's loops that sleep until woken, after a burst and then silence (issue 43,
point 4): the relay, publishing at once, and the workers' end writes that wait for a claim
to carry them. The last item of a burst is still handled within the loop's own bound, on the
real database and broker; where a wake is what is tested, the fallback is long (the relay's
idle poll an hour). The bounds carry seconds of slack for a loaded machine: liveness, not
speed (the figures each test prints are the speed)."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.publish_at_once import at_once_publisher
from plumbing.published_store import OutboxRow
from plumbing.settings import Settings
from plumbing.unit_of_work import UnitOfWork
from schemas.states import JobState
from schemas.tables import jobs, outbox
from tests.integration.pipeline import relay_only
from tests.integration.rows import claimed, job
from tests.support.loops import running, within
from workers.end_repository import EndRepository
from workers.repository import lock_rows
from workers.service import events_topic

SLACK_S = 5.0


def all_published(db: AsyncEngine, keys: list[str]) -> Any:
    """A check: every outbox row keyed ``keys`` is marked published."""
    unpublished = select(func.count()).where(
        outbox.c.key.in_(keys), outbox.c.published_at.is_(None)
    )

    async def check() -> bool:
        async with db.connect() as conn:
            return not await conn.scalar(unpublished)

    return check


async def burst_of_rows(
    db: AsyncEngine, topic: str, *, writers: int, each: int, rows: int, after_s: float | None
) -> list[str]:
    """``writers`` at once, each committing ``each`` transactions of ``rows`` outbox rows a
    few ms apart, so that NOTIFYs land while a relay round runs (``after_s``: the rows'
    ``publish_after`` that far ahead, as a writer that publishes at once stores them); the
    rows' keys."""
    keys: list[str] = []

    async def write(w: int) -> None:
        for t in range(each):
            made = [f"w{w}-t{t}-r{r}" for r in range(rows)]
            after = None if after_s is None else datetime.now(UTC) + timedelta(seconds=after_s)
            values = [
                {"topic": topic, "key": k, "payload": k.encode(), "publish_after": after}
                for k in made
            ]
            async with db.begin() as conn:
                await conn.execute(insert(outbox), values)
            keys.extend(made)
            await asyncio.sleep(random.uniform(0.0, 0.02))

    await asyncio.gather(*(write(w) for w in range(writers)))
    return keys


async def test_relay_publishes_the_last_row_of_a_burst_within_a_round_of_its_notify(
    settings: Settings, db: AsyncEngine
) -> None:
    """Bound: a row stored for the relay (no ``publish_after``) is published by the round its
    NOTIFY wakes, or by the round after the one running then (the wake is cleared before a
    round, so a NOTIFY meanwhile brings another); a full batch is followed by another at
    once. With the idle poll an hour away, only the wakes can meet it."""
    s = settings.model_copy(
        update={"publish_at_once": False, "relay_idle_poll_s": 3600.0, "relay_batch_size": 25}
    )
    async with running(partial(relay_only, s)):
        await asyncio.sleep(0.5)  # its first round ran and found nothing
        keys = await burst_of_rows(db, s.events_topic, writers=8, each=6, rows=5, after_s=None)
        took = await within(all_published(db, keys), SLACK_S, "every row of the burst")
    assert len(keys) == 240
    print(f"the last of 240 rows published {took:.2f} s after the burst")


async def test_relay_publishes_rows_their_writer_left_within_grace_and_one_poll(
    settings: Settings, db: AsyncEngine
) -> None:
    """Bound: a row its writer stored to publish at once makes no NOTIFY and is the relay's
    only after its ``publish_after`` (``publish_at_once_grace_s`` ahead); if its writer
    neither sent nor marked it, the relay publishes it within that grace plus one
    ``relay_idle_poll_s`` (here 1 s and 2 s)."""
    s = settings.model_copy(update={"relay_idle_poll_s": 2.0, "relay_batch_size": 25})
    async with running(partial(relay_only, s)):
        keys = await burst_of_rows(db, s.events_topic, writers=4, each=5, rows=5, after_s=1.0)
        took = await within(all_published(db, keys), 1.0 + 2.0 + SLACK_S, "every row left")
    print(f"the last of 100 rows left by their writer published {took:.2f} s after the burst")


async def test_at_once_marks_the_last_row_of_a_burst_within_its_linger(
    settings: Settings, db: AsyncEngine
) -> None:
    """Bound: a row published at once is marked by its writer's next statement, or alone
    ``publish_mark_linger_s`` after its acknowledgement when none comes. Rows are offered
    in waves (some while a send is in flight), then the writer is silent."""
    s = settings.model_copy(
        update={"publish_mark_linger_s": 0.3, "publish_at_once_grace_s": 3600.0}
    )
    at_once = at_once_publisher(s, UnitOfWork(db, linger_s=0.0), topics=events_topic(s))
    assert at_once is not None
    keys: list[str] = []
    async with running(at_once.run):
        for wave in range(10):
            made = [f"a{wave}-{r}" for r in range(20)]
            ahead = datetime.now(UTC) + timedelta(hours=1)
            values = [
                {"topic": s.events_topic, "key": k, "payload": k.encode(), "publish_after": ahead}
                for k in made
            ]
            async with db.begin() as conn:
                ids = (
                    await conn.scalars(insert(outbox).values(values).returning(outbox.c.id))
                ).all()
            at_once.offer(
                [
                    OutboxRow(id=i, topic=s.events_topic, key=k, payload=k.encode())
                    for i, k in zip(ids, made, strict=True)
                ]
            )
            keys += made
            await asyncio.sleep(random.uniform(0.0, 0.03))
        took = await within(all_published(db, keys), 0.3 + SLACK_S, "every row marked")
    print(f"the last of 200 rows published at once marked {took:.2f} s after the burst")


async def test_end_writes_commit_the_last_of_a_burst_within_its_linger(
    settings: Settings, db: AsyncEngine
) -> None:
    """Bound: a job's end waits up to ``end_linger_ms`` for a claim's transaction to carry
    it. After a burst no claim comes: the first end whose linger runs out carries every end
    waiting, and one that came while that ran carries itself (and those behind it) when
    its own linger runs out, so each end commits within its linger, plus the transaction
    that carries it. Three waves of ten ends, 0.15 s apart (under the 0.3 s linger), then
    silence."""
    linger_s = 0.3
    ends = EndRepository(
        db,
        events_topic=settings.events_topic,
        work=UnitOfWork(db, linger_s=linger_s, lock=lock_rows),
    )
    rows = [job(f"end-{n}", "running", None, attempt=1) for n in range(30)]
    async with db.begin() as conn:
        await conn.execute(insert(jobs), rows)
    finishing: list[asyncio.Task[bool]] = []
    for wave in range(3):
        for row in rows[wave * 10 : (wave + 1) * 10]:
            end = ends.finish(claimed(row), JobState.SUCCEEDED, result={})
            finishing.append(asyncio.create_task(end))
        await asyncio.sleep(0.15)
    last = asyncio.get_running_loop().time()
    done = await asyncio.wait_for(asyncio.gather(*finishing), linger_s + SLACK_S)
    took = asyncio.get_running_loop().time() - last
    assert done == [True] * 30
    async with db.connect() as conn:
        ended = await conn.scalar(
            select(func.count()).where(
                jobs.c.id.in_([r["id"] for r in rows]), jobs.c.state == JobState.SUCCEEDED.value
            )
        )
        events = await conn.scalar(
            select(func.count()).where(outbox.c.key.in_([str(r["id"]) for r in rows]))
        )
    assert (ended, events) == (30, 30)
    print(f"30 ends in 3 waves: the last committed {took:.2f} s after the last wave")
