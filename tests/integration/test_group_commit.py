"""Group commit against a real PostgreSQL: concurrent submits land in one statement (one
transaction), and each caller still gets its own answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.db import make_engine
from producers.jobs.group_commit import GroupCommit
from producers.jobs.repository import JobRepository
from schemas.errors import IdempotencyConflict
from schemas.tables import jobs, outbox
from tests.integration.rows import submitted as new


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    db = make_engine(database_url, pool_size=4)
    yield db
    await db.dispose()


@pytest.fixture
def statements(engine: AsyncEngine) -> list[str]:
    """The statements the engine sends (a pool's ping is not one of them)."""
    sent: list[str] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def record(*args: Any) -> None:
        sent.append(args[2])

    return sent


@pytest.fixture
async def groups(engine: AsyncEngine) -> AsyncIterator[GroupCommit]:
    repo = JobRepository(engine, dispatch_topic="dispatch", events_topic="events")
    group_commit = GroupCommit(repo, max_items=256, wait_s=0.002, writers=2)
    stop = asyncio.Event()
    runner = asyncio.create_task(group_commit.run(stop))
    yield group_commit
    stop.set()
    await runner


async def counts(engine: AsyncEngine) -> tuple[int, int]:
    async with engine.connect() as conn:
        stored = await conn.scalar(select(func.count()).select_from(jobs))
        records = await conn.scalar(select(func.count()).select_from(outbox))
    return int(stored or 0), int(records or 0)


async def test_concurrent_submits_land_in_one_statement(
    groups: GroupCommit, engine: AsyncEngine, statements: list[str]
) -> None:
    answers = await asyncio.gather(*(groups.submit(new(f"Document {i}.")) for i in range(50)))
    assert len(statements) == 1  # one statement: its own transaction, one commit
    assert "INSERT INTO jobs" in statements[0]
    assert all(created for _, created in answers)
    ids = [job.id for job, _ in answers]
    assert len(set(ids)) == 50
    assert await counts(engine) == (50, 50)
    async with engine.connect() as conn:
        keys = (await conn.execute(select(outbox.c.key).order_by(outbox.c.id))).scalars().all()
    assert list(keys) == ids  # dispatch records in submission order


async def test_idempotent_replays_inside_and_across_groups(
    groups: GroupCommit, engine: AsyncEngine, statements: list[str]
) -> None:
    (first, created), *_ = await asyncio.gather(groups.submit(new(key="k0")))
    assert created
    statements.clear()
    answers = await asyncio.gather(
        groups.submit(new(key="k1")),
        groups.submit(new(key="k1")),  # the same request again, in the same group
        groups.submit(new(key="k1", digest="other")),  # the same key, another request
        groups.submit(new(key="k0")),  # a replay of a job stored by an earlier group
        groups.submit(new()),
        return_exceptions=True,
    )
    assert sum("INSERT INTO jobs" in s for s in statements) == 1
    k1, k1_again, conflict, k0_again, plain = answers
    assert isinstance(k1, tuple)
    assert isinstance(k1_again, tuple)
    assert isinstance(k0_again, tuple)
    assert isinstance(plain, tuple)
    assert k1[1] is True
    assert k1_again[0].id == k1[0].id
    assert k1_again[1] is False
    assert isinstance(conflict, IdempotencyConflict)
    assert k0_again[0].id == first.id
    assert k0_again[1] is False
    assert plain[1] is True
    assert await counts(engine) == (3, 3)  # k0, k1 and the plain one; no extra records


async def test_an_empty_idempotency_key_is_a_key(groups: GroupCommit, engine: AsyncEngine) -> None:
    """An empty Idempotency-Key header is stored as the key "" (no request hash): a second
    submit with it is a replay, as it always was."""
    empty = new(key="")
    assert (empty.idempotency_key, empty.request_hash) == ("", None)
    (job, created), (again, replayed) = await asyncio.gather(
        groups.submit(empty), groups.submit(empty)
    )
    assert created
    assert (again.id, replayed) == (job.id, False)
    assert await counts(engine) == (1, 1)


async def test_one_bad_submit_does_not_fail_the_others(
    groups: GroupCommit, engine: AsyncEngine
) -> None:
    texts = [f"Document {i}." for i in range(9)]
    texts[4] = "A NUL \x00 is refused by PostgreSQL."
    answers = await asyncio.gather(*(groups.submit(new(t)) for t in texts), return_exceptions=True)
    for text, answer in zip(texts, answers, strict=True):
        if "\x00" in text:
            assert isinstance(answer, DBAPIError)
            assert getattr(answer.orig, "sqlstate", None) == "22021"
        else:
            assert isinstance(answer, tuple)
            assert answer[1] is True
    assert await counts(engine) == (8, 8)


async def test_stop_flushes_what_is_gathered(engine: AsyncEngine) -> None:
    repo = JobRepository(engine, dispatch_topic="dispatch", events_topic="events")
    group_commit = GroupCommit(repo, max_items=256, wait_s=60.0, writers=1)
    stop = asyncio.Event()
    runner = asyncio.create_task(group_commit.run(stop))
    submits = [asyncio.create_task(group_commit.submit(new(f"D{i}."))) for i in range(30)]
    await asyncio.sleep(0)  # gathered; the first group may be on its way
    stop.set()
    async with asyncio.timeout(30):
        await runner
    answers = await asyncio.gather(*submits)
    assert all(created for _, created in answers)
    assert await counts(engine) == (30, 30)


async def test_kept_connections_carry_lone_submits_and_a_closed_one_is_replaced(
    engine: AsyncEngine,
) -> None:
    """A lone submit's statement runs on the connection kept open from the one before (not
    taken from the pool again); one the server closed is dropped unused, and replaced."""
    checkouts = 0

    @event.listens_for(engine.sync_engine, "checkout")
    def counted(*args: Any) -> None:
        nonlocal checkouts
        checkouts += 1

    repo = JobRepository(engine, dispatch_topic="dispatch", events_topic="events", kept=1)
    try:
        await repo.submit_group([new("first")])
        await repo.submit_group([new("second")])
        assert checkouts == 1
        async with engine.connect() as conn:  # the server closes the kept connection
            await conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        await asyncio.sleep(0.2)  # asyncpg sees its socket close
        before = checkouts
        await repo.submit_group([new("third")])
        assert checkouts == before + 1  # a new one: the closed one was not used
    finally:
        await repo.close()
    assert await counts(engine) == (3, 3)
