"""The API's periodic reads join a group of submits' transaction (``plumbing.unit_of_work``),
on the real PostgreSQL: one commit for the reads and the jobs. A transaction's id is the
``xmin`` of the rows it wrote, so a write that asks ``txid_current()`` tells which one it
ran in."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from plumbing.unit_of_work import Unit, UnitOfWork
from producers.jobs.repository import JobRepository
from schemas.tables import jobs
from tests.integration.rows import submitted


def repository(db: AsyncEngine, settings: Settings, work: UnitOfWork) -> JobRepository:
    return JobRepository(
        db, dispatch_topic=settings.dispatch_topic, events_topic=settings.events_topic, work=work
    )


async def txid(unit: Unit) -> int:
    return int(await unit.connection.scalar(text("SELECT txid_current()")) or 0)


async def xmin(db: AsyncEngine, job_id: str) -> int:
    async with db.connect() as conn:
        found = await conn.scalar(
            select(text("xmin::text::bigint")).select_from(jobs).where(jobs.c.id == job_id)
        )
    return int(found or 0)


async def waiting(work: UnitOfWork, n: int) -> None:
    for _ in range(200):
        if work.waiting >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{work.waiting} writes waited, not {n}")


async def test_the_reads_commit_with_the_next_group(db: AsyncEngine, settings: Settings) -> None:
    work = UnitOfWork(db, linger_s=30.0)
    repo = repository(db, settings, work)
    rider = asyncio.create_task(work.join(txid))
    flow = asyncio.create_task(repo.flow(work=work))
    await waiting(work, 2)
    [answer] = await repo.submit_group([submitted()])
    assert not isinstance(answer, Exception)
    job, created = answer
    assert created
    assert await asyncio.wait_for(rider, 5) == await xmin(db, job.id)
    # Read before the group's statement ran, so without its job (as a read alone before it).
    assert (await asyncio.wait_for(flow, 5)).in_flight == 0
    assert work.waiting == 0


async def test_a_rider_that_fails_leaves_the_group_stored(
    db: AsyncEngine, settings: Settings
) -> None:
    work = UnitOfWork(db, linger_s=30.0)
    repo = repository(db, settings, work)
    ran: list[str] = []

    async def broken(unit: Unit) -> Any:
        if ran:  # alone, after the group's transaction failed
            ran.append("alone")
            return "alone"
        ran.append("in the group")
        return await unit.connection.scalar(text("SELECT 1 / 0"))

    rider = asyncio.create_task(work.join(broken))
    await waiting(work, 1)
    [answer] = await repo.submit_group([submitted()])
    assert not isinstance(answer, Exception)
    job, created = answer
    assert created
    assert await asyncio.wait_for(rider, 5) == "alone"
    assert ran == ["in the group", "alone"]
    async with db.connect() as conn:
        stored = await conn.scalar(select(jobs.c.state).where(jobs.c.id == job.id))
    assert stored == "queued"
