"""The overview's SQL: jobs by model and state (not ended, and ended in a window), drops by
reason, the workers' rows (``workers``, written by ``workers.presence``) and the webhook
deliveries waiting."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.unit_of_work import UnitOfWork, joining
from producers.jobs.repository import job_model
from schemas.states import TERMINAL_STATES, JobState
from schemas.tables import jobs, webhook_deliveries, workers
from schemas.webhooks import DeliveryState

# The states of jobs not ended, named (not "not terminal"), so that the planner reads only
# their entries of ix_jobs_state: rows bounded by admission, not the retained history.
UNENDED = [s.value for s in JobState if s not in TERMINAL_STATES]
_DROPS = [JobState.EXPIRED.value, JobState.CANCELLED.value, JobState.ABANDONED.value]
# As a literal, so that a prepared statement's generic plan can still use the partial index
# ix_webhook_deliveries_due (WHERE state = 'pending').
_PENDING: ColumnElement[str] = literal_column(f"'{DeliveryState.PENDING.value}'")


@dataclass(frozen=True, kw_only=True)
class WorkerRow:
    id: str
    model: str
    engine: str
    capacity: int
    running: int
    kv_usage: float | None
    started_at: datetime
    seen_at: datetime
    age_s: float  # since seen_at, by the database's clock
    context_tokens: int | None = None  # one request's prompt and output, on its engine


@dataclass(frozen=True, kw_only=True)
class DeliveryCounts:
    pending: int  # not delivered or dead: due, leased by a dispatcher, or awaiting a retry
    due: int  # due now and not claimed: a claim leases a row by moving next_attempt_at ahead
    oldest_due_s: float | None  # since the oldest due one came due, by the database's clock


def unended_counts(tenant: str | None) -> Select[Any]:
    """One GROUP BY over the jobs not ended (of one tenant, or of all)."""
    model = job_model().label("model")
    query = select(model, jobs.c.state, func.count()).where(jobs.c.state.in_(UNENDED))
    if tenant is not None:
        query = query.where(jobs.c.tenant == tenant)
    return query.group_by(model, jobs.c.state)


class OverviewStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def job_counts(self, tenant: str | None, window_s: float) -> list[tuple[str, str, int]]:
        """(model, state, count): the jobs not ended, and those ended in the window."""
        model = job_model().label("model")
        ended_since = func.now() - timedelta(seconds=window_s)
        ended = select(model, jobs.c.state, func.count()).where(jobs.c.finished_at > ended_since)
        if tenant is not None:
            ended = ended.where(jobs.c.tenant == tenant)
        async with self._engine.connect() as conn:
            rows = [
                *(await conn.execute(unended_counts(tenant))).all(),
                *(await conn.execute(ended.group_by(model, jobs.c.state))).all(),
            ]
        return sorted((str(m), str(s), int(n)) for m, s, n in rows)

    async def unended(self, work: UnitOfWork | None = None) -> list[tuple[str, str, int]]:
        """(model, state, count) of every tenant's jobs not ended (the jobs-by-state gauge),
        joining ``work``'s next transaction when one comes."""

        async def read(conn: AsyncConnection) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in await conn.execute(unended_counts(None))]

        rows = await joining(work, self._engine, read)
        return sorted((str(m), str(s), int(n)) for m, s, n in rows)

    async def drops(self, tenant: str | None, window_s: float) -> list[tuple[str, str, int]]:
        """(state, reason, count) of the jobs dropped in the window, most first."""
        reason = func.coalesce(jobs.c.error["reason"].astext, jobs.c.state).label("reason")
        query = select(jobs.c.state, reason, func.count()).where(
            jobs.c.finished_at > func.now() - timedelta(seconds=window_s),
            jobs.c.state.in_(_DROPS),
        )
        if tenant is not None:
            query = query.where(jobs.c.tenant == tenant)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query.group_by(jobs.c.state, reason))).all()
        return sorted(((str(s), str(r), int(n)) for s, r, n in rows), key=lambda d: -d[2])

    async def workers(self) -> list[WorkerRow]:
        age = func.extract("epoch", func.now() - workers.c.seen_at).label("age_s")
        async with self._engine.connect() as conn:
            rows = (
                (await conn.execute(select(workers, age).order_by(workers.c.id))).mappings().all()
            )
        return [WorkerRow(**{**dict(r), "age_s": float(r["age_s"])}) for r in rows]

    async def deliveries(self, tenant: str | None) -> DeliveryCounts:
        """The pending deliveries (of one tenant, or of all), those due, and the oldest due's
        wait, in one statement over the pending rows (found through the partial index
        ix_webhook_deliveries_due, never a pass over the ended ones kept for retention)."""
        d = webhook_deliveries.c
        due = d.next_attempt_at <= func.now()
        oldest = func.min(d.next_attempt_at).filter(due)
        query = select(
            func.count(),
            func.count().filter(due),
            func.extract("epoch", func.now() - oldest),
        ).where(d.state == _PENDING)
        if tenant is not None:
            query = query.where(d.tenant == tenant)
        async with self._engine.connect() as conn:
            pending, due_now, waited = (await conn.execute(query)).one()
        return DeliveryCounts(
            pending=int(pending),
            due=int(due_now),
            oldest_due_s=None if waited is None else float(waited),
        )
