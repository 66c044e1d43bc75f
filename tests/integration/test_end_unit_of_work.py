"""A job's end joins the worker's next claim (``plumbing.unit_of_work``): one transaction
commits both, on the real PostgreSQL. Rows written by one transaction carry its id as
``xmin``, so the test reads whether the end and the claim committed together."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from plumbing.unit_of_work import UnitOfWork
from schemas.states import JobState
from schemas.tables import jobs, outbox
from tests.integration.rows import claimed, job
from workers.end_repository import EndRepository
from workers.gate import Candidate, Drop
from workers.repository import ClaimedJob, WorkerRepository, lock_rows


async def two_jobs(db: AsyncEngine) -> tuple[ClaimedJob, str]:
    """A job running here (attempt 1), and one dispatched to claim."""
    ending = job("ending", "running", None, attempt=1)
    waiting = job("waiting", "dispatched", None, attempt=0)
    async with db.begin() as conn:
        await conn.execute(insert(jobs), [ending, waiting])
    return claimed(ending), str(waiting["id"])


async def xmins(db: AsyncEngine, *ids: str) -> list[int]:
    async with db.connect() as conn:
        found = await conn.execute(
            select(jobs.c.id, text("xmin::text::bigint")).where(jobs.c.id.in_(ids))
        )
        by_id = {str(r[0]): int(r[1]) for r in found}
    return [by_id[i] for i in ids]


async def events_of(db: AsyncEngine, job_id: str) -> int:
    async with db.connect() as conn:
        found = await conn.scalar(
            select(text("count(*)")).select_from(outbox).where(outbox.c.key == job_id)
        )
    return int(found or 0)


def repositories(
    db: AsyncEngine, settings: Settings, linger_s: float
) -> tuple[EndRepository, WorkerRepository]:
    work = UnitOfWork(db, linger_s=linger_s, lock=lock_rows)
    ends = EndRepository(db, events_topic=settings.events_topic, work=work)
    claims = WorkerRepository(db, events_topic=settings.events_topic, work=work)
    return ends, claims


async def until_waiting(claims: WorkerRepository, ends_task: asyncio.Task[bool]) -> None:
    for _ in range(200):
        if claims.work.waiting or ends_task.done():
            return
        await asyncio.sleep(0.01)
    pytest.fail("the end never waited for a claim")


def fit(_: Candidate) -> Drop | None:
    return None


async def test_an_end_commits_with_the_next_claim(db: AsyncEngine, settings: Settings) -> None:
    ends, claims = repositories(db, settings, linger_s=30.0)
    ended, waiting = await two_jobs(db)
    finishing = asyncio.create_task(ends.finish(ended, JobState.SUCCEEDED, result={"text": "x"}))
    await until_waiting(claims, finishing)
    assert not finishing.done(), "the end did not wait for the claim"
    outcome = await claims.claim_batch([waiting], fit, len)
    assert isinstance(outcome[waiting], ClaimedJob)
    assert await asyncio.wait_for(finishing, 5) is True  # long before its 30 s linger
    end_xmin, claim_xmin = await xmins(db, ended.id, waiting)
    assert end_xmin == claim_xmin, "the end and the claim were two transactions"
    assert await events_of(db, ended.id) == 1


async def test_an_end_no_claim_came_for_commits_alone(db: AsyncEngine, settings: Settings) -> None:
    ends, _ = repositories(db, settings, linger_s=0.2)
    ended, _waiting = await two_jobs(db)
    assert await asyncio.wait_for(ends.finish(ended, JobState.SUCCEEDED, result={}), 5)
    async with db.connect() as conn:
        state = await conn.scalar(select(jobs.c.state).where(jobs.c.id == ended.id))
    assert state == JobState.SUCCEEDED.value
    assert await events_of(db, ended.id) == 1


async def test_a_claim_that_fails_leaves_its_joined_ends_to_commit_alone(
    db: AsyncEngine, settings: Settings
) -> None:
    ends, claims = repositories(db, settings, linger_s=30.0)
    ended, waiting = await two_jobs(db)
    finishing = asyncio.create_task(ends.finish(ended, JobState.FAILED, error={"code": "x"}))
    await until_waiting(claims, finishing)

    def broken(_: Candidate) -> Drop | None:
        raise RuntimeError("the gate broke")

    with pytest.raises(RuntimeError):
        await claims.claim_batch([waiting], broken, len)
    assert await asyncio.wait_for(finishing, 5) is True
    async with db.connect() as conn:
        states = dict(
            (str(r.id), r.state)
            for r in await conn.execute(
                select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_([ended.id, waiting]))
            )
        )
    assert states == {ended.id: JobState.FAILED.value, waiting: JobState.DISPATCHED.value}
    assert await events_of(db, ended.id) == 1


async def test_ends_no_claim_came_for_commit_together(db: AsyncEngine, settings: Settings) -> None:
    ends, _ = repositories(db, settings, linger_s=0.5)
    first, _ = await two_jobs(db)
    second, _ = await two_jobs(db)
    done = await asyncio.wait_for(
        asyncio.gather(
            ends.finish(first, JobState.SUCCEEDED, result={}),
            ends.finish(second, JobState.SUCCEEDED, result={}),
        ),
        5,
    )
    assert done == [True, True]
    one, other = await xmins(db, first.id, second.id)
    assert one == other, "the ends that waited together committed apart"
    assert await events_of(db, first.id) == await events_of(db, second.id) == 1
