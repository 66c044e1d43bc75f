"""The API's periodic reads ride in a group of submits' transaction (``plumbing.carpool``),
on the real PostgreSQL: one commit for the reads and the jobs. A transaction's id is the
``xmin`` of the rows it wrote, so a rider that asks ``txid_current()`` tells which one it
ran in."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.carpool import Carpool
from plumbing.settings import Settings
from producers.jobs.repository import JobRepository
from schemas.tables import jobs
from tests.integration.rows import submitted


def repository(db: AsyncEngine, settings: Settings, carpool: Carpool) -> JobRepository:
    repo = JobRepository(
        db, dispatch_topic=settings.dispatch_topic, events_topic=settings.events_topic
    )
    repo.carpool = carpool
    return repo


async def txid(conn: AsyncConnection) -> int:
    return int(await conn.scalar(text("SELECT txid_current()")) or 0)


async def xmin(db: AsyncEngine, job_id: str) -> int:
    async with db.connect() as conn:
        found = await conn.scalar(
            select(text("xmin::text::bigint")).select_from(jobs).where(jobs.c.id == job_id)
        )
    return int(found or 0)


async def waiting(carpool: Carpool, n: int) -> None:
    for _ in range(200):
        if carpool.waiting >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{carpool.waiting} riders waited, not {n}")


async def test_the_reads_commit_with_the_next_group(db: AsyncEngine, settings: Settings) -> None:
    carpool = Carpool(30.0)
    repo = repository(db, settings, carpool)

    async def never_alone() -> int:
        raise AssertionError("the rider ran alone")

    rider = asyncio.create_task(carpool.ride(txid, never_alone))
    flow = asyncio.create_task(repo.flow(via=carpool))
    await waiting(carpool, 2)
    [answer] = await repo.submit_group([submitted()])
    assert not isinstance(answer, Exception)
    job, created = answer
    assert created
    assert await asyncio.wait_for(rider, 5) == await xmin(db, job.id)
    # Read before the group's statement ran, so without its job (as a read alone before it).
    assert (await asyncio.wait_for(flow, 5)).in_flight == 0
    assert carpool.waiting == 0


async def test_a_rider_that_fails_leaves_the_group_stored(
    db: AsyncEngine, settings: Settings
) -> None:
    carpool = Carpool(30.0)
    repo = repository(db, settings, carpool)
    ran: list[str] = []

    async def broken(conn: AsyncConnection) -> Any:
        ran.append("in the group")
        return await conn.scalar(text("SELECT 1 / 0"))

    async def alone() -> str:
        ran.append("alone")
        return "alone"

    rider = asyncio.create_task(carpool.ride(broken, alone))
    await waiting(carpool, 1)
    [answer] = await repo.submit_group([submitted()])
    assert not isinstance(answer, Exception)
    job, created = answer
    assert created
    assert await asyncio.wait_for(rider, 5) == "alone"
    assert ran == ["in the group", "alone"]
    async with db.connect() as conn:
        stored = await conn.scalar(select(jobs.c.state).where(jobs.c.id == job.id))
    assert stored == "queued"
