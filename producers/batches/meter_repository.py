"""The meter's SQL: in one transaction, under an advisory lock (one meter at a time, however
many API replicas run one), expire the held jobs whose deadline passed, count the backlog,
and release the next held jobs, round-robin over the tenants, into the outbox."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain, zip_longest
from typing import Any

from sqlalchemy import Select, exists, func, insert, literal_column, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from plumbing.db import transaction
from producers.jobs.repository import event_row
from producers.outbox.repository import dispatch_row, of_pool
from schemas import reasons
from schemas.jobs import job_from_row
from schemas.states import JobState
from schemas.tables import jobs, outbox

# pg_try_advisory_xact_lock's key: "sluicegate meter".
LOCK_KEY = 0x5347_4D74
BACKLOG_STATES = (JobState.QUEUED.value, JobState.DISPATCHED.value, JobState.RUNNING.value)


# The tenants holding jobs are found by a loose index scan (one probe of ix_jobs_held per
# tenant, not a pass over every held job); each gives up to :wanted of its held jobs,
# earliest deadline first, skipping rows another transaction holds and jobs already past
# their deadline (the expiry step ends those); they are ranked by turn (every tenant's
# first, then every tenant's second, ...) and the first :wanted are released.
_RELEASE = text(
    """
WITH RECURSIVE tenants(tenant) AS (
    (SELECT tenant FROM jobs WHERE held ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT j.tenant FROM jobs j WHERE j.held AND j.tenant > t.tenant
            ORDER BY j.tenant LIMIT 1)
    FROM tenants t WHERE t.tenant IS NOT NULL
), candidates AS (
    SELECT c.id, c.tenant,
           row_number() OVER (PARTITION BY c.tenant ORDER BY c.deadline, c.id) AS turn
    FROM tenants t CROSS JOIN LATERAL (
        SELECT id, tenant, deadline FROM jobs
        WHERE held AND tenant = t.tenant AND deadline > :now
              AND (dispatch_topic = :topic OR (:first AND dispatch_topic IS NULL))
        ORDER BY deadline, id LIMIT :wanted
        FOR UPDATE SKIP LOCKED
    ) c
    WHERE t.tenant IS NOT NULL
), picked AS (
    SELECT id FROM candidates ORDER BY turn, tenant LIMIT :wanted
)
UPDATE jobs SET held = false, updated_at = :now
FROM picked WHERE jobs.id = picked.id AND jobs.held
RETURNING jobs.id, jobs.tenant, jobs.kind, jobs.priority, jobs.max_tokens, jobs.deadline,
          jobs.input
"""
)


@dataclass(frozen=True, kw_only=True)
class Backlog:
    """The jobs released (or submitted singly) and not ended: queued in the outbox,
    dispatched, or running; ``batch_jobs`` of them are batches' jobs."""

    jobs: int
    batch_jobs: int


@dataclass(frozen=True, kw_only=True)
class MeterRound:
    wanted: int  # the room the budget gave
    released: int  # fewer than wanted: nothing more was held (or free to take)
    expired: int
    backlog: Backlog | None  # None: another meter held the lock; this round did nothing
    held: bool = True  # False: the pool held no job as the round began (it did nothing else)


Budget = Callable[[Backlog], int]


class MeterStore:
    def __init__(
        self, engine: AsyncEngine, *, dispatch_topic: str, events_topic: str, first: bool = True
    ) -> None:
        """The meter of the pool whose dispatch topic is ``dispatch_topic`` (``first``: the
        first pool, whose jobs include those stored before pools): its held jobs, its
        backlog; one meter per pool at a time."""
        self._engine = engine
        self._dispatch_topic = dispatch_topic
        self._first = first
        self._pool = of_pool(dispatch_topic, first)
        self._events_topic = events_topic

    async def round(
        self, budget: Budget, now: datetime, *, expire: bool = True, expire_limit: int = 1000
    ) -> MeterRound:
        """Expire up to ``expire_limit`` overdue held jobs (with ``expire``), then release
        as many held jobs as ``budget`` allows for the backlog counted in the same
        transaction. With no job held, one statement counts the backlog and finds none held:
        there is nothing to expire or release, and no transaction (nor lock) is needed."""
        async with self._engine.connect() as conn:
            backlog, held = await _backlog_and_held(conn, self._pool)
        if not held:
            return MeterRound(
                wanted=budget(backlog), released=0, expired=0, backlog=backlog, held=False
            )
        async with transaction(self._engine) as conn:
            locked = await conn.scalar(
                select(
                    func.pg_try_advisory_xact_lock(LOCK_KEY, func.hashtext(self._dispatch_topic))
                )
            )
            if not locked:
                return MeterRound(wanted=0, released=0, expired=0, backlog=None)
            expired = await self._expire(conn, now, expire_limit) if expire else 0
            backlog = await _backlog(conn, self._pool)
            wanted = budget(backlog)
            released = await self._release(conn, wanted, now) if wanted > 0 else 0
        return MeterRound(wanted=wanted, released=released, expired=expired, backlog=backlog)

    async def _expire(self, conn: AsyncConnection, now: datetime, limit: int) -> int:
        """Held jobs whose deadline passed end ``expired`` (deadline_passed), never
        dispatched; each with its event, as a worker's drop before decode writes it."""
        overdue = (
            select(jobs.c.id)
            .where(jobs.c.held, jobs.c.deadline <= now, self._pool)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        rows = (
            (
                await conn.execute(
                    update(jobs)
                    .where(jobs.c.id.in_(overdue.scalar_subquery()), jobs.c.held)
                    .values(
                        state=JobState.EXPIRED.value,
                        held=False,
                        finished_at=now,
                        updated_at=now,
                        error=reasons.error(
                            JobState.EXPIRED, reasons.DEADLINE_PASSED, "before_decode"
                        ),
                    )
                    .returning(*jobs.c)
                )
            )
            .mappings()
            .all()
        )
        if rows:
            events = [
                event_row(self._events_topic, job_from_row(r), now, reasons.DEADLINE_PASSED)
                for r in rows
            ]
            await conn.execute(insert(outbox), events)
        return len(rows)

    async def _release(self, conn: AsyncConnection, wanted: int, now: datetime) -> int:
        """Up to ``wanted`` held jobs, round-robin over the tenants that hold any (each
        tenant's earliest deadline first), are released: no longer held, and their dispatch
        records written to the outbox. Rows another transaction holds are skipped, never
        waited for."""
        given = {"wanted": wanted, "now": now, "topic": self._dispatch_topic, "first": self._first}
        rows = (await conn.execute(_RELEASE, given)).mappings().all()
        if rows:
            records = [dispatch_row(self._dispatch_topic, r) for r in interleaved(rows)]
            await conn.execute(insert(outbox), records)
        return len(rows)


def interleaved(rows: Sequence[Mapping[Any, Any]]) -> list[Mapping[Any, Any]]:
    """The released jobs in dispatch order: a turn of each tenant (each tenant's own in
    deadline order), then the next turn, so that no tenant's jobs queue behind another's."""
    by_tenant: dict[str, list[Mapping[Any, Any]]] = {}
    for row in sorted(rows, key=lambda r: (r["deadline"], str(r["id"]))):
        by_tenant.setdefault(row["tenant"], []).append(row)
    turns = zip_longest(*(by_tenant[t] for t in sorted(by_tenant)))
    return [row for row in chain.from_iterable(turns) if row is not None]


def _backlog_query(pool: ColumnElement[bool]) -> Select[int, int]:
    """Counted on the partial index ix_jobs_backlog (its predicate, as literals)."""
    states = ", ".join(f"'{s}'" for s in BACKLOG_STATES)
    return select(func.count(), func.count(jobs.c.batch_id)).where(
        ~jobs.c.held, literal_column(f"jobs.state IN ({states})"), pool
    )


async def _backlog(conn: AsyncConnection, pool: ColumnElement[bool]) -> Backlog:
    row = (await conn.execute(_backlog_query(pool))).one()
    return Backlog(jobs=int(row[0]), batch_jobs=int(row[1]))


async def _backlog_and_held(
    conn: AsyncConnection, pool: ColumnElement[bool]
) -> tuple[Backlog, bool]:
    """The backlog, and whether the pool holds any job (one probe of ix_jobs_held)."""
    counted = _backlog_query(pool).subquery("backlog")
    held = exists().where(jobs.c.held, pool)
    row = (await conn.execute(select(*counted.c, held.label("held")))).one()
    return Backlog(jobs=int(row[0]), batch_jobs=int(row[1])), bool(row[2])
