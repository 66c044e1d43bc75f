"""The jobs' SQL beyond the submit (``producers.jobs.submit_repository``): reads, polls and
heartbeats, cancels and abandons with their events, and the flow (L and W) of recent jobs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Update, and_, func, insert, select, true, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from plumbing.db import transaction
from plumbing.lock_store import end_children
from plumbing.publish_at_once import AtOncePublisher
from plumbing.unit_of_work import UnitOfWork, joining
from producers.jobs.submit_repository import SubmitRepository
from producers.outbox.repository import of_pool
from schemas import reasons
from schemas.constants import DEFAULT_MODEL
from schemas.envelopes import JobEvent
from schemas.errors import JobAlreadyTerminal, JobNotFound, JobOfDocument
from schemas.jobs import GraphProgress, Job, job_from_row
from schemas.states import CANCELLABLE_STATES, TERMINAL_STATES, JobState, sources_of
from schemas.tables import graphs, jobs, outbox

FLOW_WINDOW_S = 60.0

_TERMINAL = [s.value for s in TERMINAL_STATES]
_ABANDONABLE = [s.value for s in sources_of(JobState.ABANDONED)]
_NOT_STARTED = [JobState.QUEUED.value, JobState.DISPATCHED.value]


@dataclass(frozen=True, kw_only=True)
class Part:
    id: str
    seq: int
    state: str


@dataclass(frozen=True, kw_only=True)
class DocumentOutline:
    """A summarize job as its page shows it: its input's first lines and its graph's parts
    by level (empty for a document that fitted one request)."""

    head: list[str]
    levels: dict[int, list[Part]]


@dataclass(frozen=True, kw_only=True)
class Flow:
    in_flight: int
    running: int  # started on a worker, not yet terminal
    finished_recently: int
    mean_latency_s: float | None
    # Of the jobs that succeeded in the window: how many decoded at least one token, and the
    # median of their seconds per output token, started to finished (prefill included).
    timed_jobs: int = 0
    token_time_s: float | None = None


class JobRepository(SubmitRepository):
    """The jobs' SQL: submits (``SubmitRepository``), reads, heartbeats, cancels and
    abandons, and the flow the admission controller estimates with."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        dispatch_topic: str,
        events_topic: str,
        autocommit: AsyncEngine | None = None,
        topic_of: Callable[[str | None], str] | None = None,
        work: UnitOfWork | None = None,
        at_once: AtOncePublisher | None = None,
        kept: int = 0,
    ) -> None:
        """``autocommit``, ``topic_of``, ``work``, ``at_once``, ``kept``: see
        ``SubmitRepository``."""
        super().__init__(
            engine,
            dispatch_topic=dispatch_topic,
            autocommit=autocommit,
            topic_of=topic_of,
            work=work,
            at_once=at_once,
            kept=kept,
        )
        self._events_topic = events_topic

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    async def ping(self) -> None:
        async with self._engine.connect() as conn:
            await conn.execute(select(1))

    async def get(self, tenant: str | None, job_id: str) -> Job:
        async with self._engine.connect() as conn:
            row = (
                (await conn.execute(select(jobs).where(_owned(tenant, job_id)))).mappings().first()
            )
        if row is None:
            raise JobNotFound(f"no job {job_id}")
        return job_from_row(row)

    async def get_many(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], Job]:
        """Jobs by (tenant, id), in one query; the missing ones are left out."""
        ids = [job_id for _, job_id in keys]
        async with self._engine.connect() as conn:
            rows = (await conn.execute(select(jobs).where(jobs.c.id.in_(ids)))).mappings().all()
        found = {(r["tenant"], str(r["id"])): job_from_row(r) for r in rows}
        return {key: found[key] for key in keys if key in found}

    async def poll(self, tenant: str, job_id: str) -> Job:
        """Read the job; a poll is its caller's heartbeat, so renew its lease if it has one.

        One statement whatever the job: the lease is renewed (``last_seen_at``, by the
        database's clock) only on a job that is not terminal and has ``abandon_after_s``.
        """
        touched = (
            update(jobs)
            .where(
                _owned(tenant, job_id),
                jobs.c.abandon_after_s.is_not(None),
                jobs.c.state.not_in(_TERMINAL),
            )
            .values(last_seen_at=func.now())
            .returning(*jobs.c)
            .cte("touched")
        )
        untouched = select(jobs).where(_owned(tenant, job_id), ~select(touched.c.id).exists())
        async with transaction(self._engine) as conn:
            row = (await conn.execute(select(touched).union_all(untouched))).mappings().first()
        if row is None:
            raise JobNotFound(f"no job {job_id}")
        return job_from_row(row)

    async def touch(self, tenant: str, job_id: str) -> Job:
        """An explicit heartbeat: renew the lease of a job that is not terminal yet."""
        job = await self.poll(tenant, job_id)
        if job.state.terminal:
            raise JobAlreadyTerminal(f"job {job_id} is already {job.state}")
        return job

    async def abandon(self, tenant: str, job_id: str, reason: str) -> bool:
        """Move the job to ``abandoned`` unless it is terminal already, with its event.

        Returns whether this call wrote it (False: the job had already ended).
        """
        now = datetime.now(UTC)
        error = reasons.error(JobState.ABANDONED, reason)
        async with transaction(self._engine) as conn:
            row = (
                (
                    await conn.execute(
                        update(jobs)
                        .where(_owned(tenant, job_id), jobs.c.state.in_(_ABANDONABLE))
                        .values(
                            state=JobState.ABANDONED.value,
                            finished_at=now,
                            updated_at=now,
                            error=error,
                        )
                        .returning(*jobs.c)
                    )
                )
                .mappings()
                .first()
            )
            if row is None:
                return False
            await self._event(conn, job_from_row(row), now, JobState.ABANDONED.value)
            await end_children(conn, [job_id], JobState.ABANDONED, now)
        return True

    async def _event(self, conn: AsyncConnection, job: Job, at: datetime, code: str) -> None:
        """The job's state change, to the events topic through the outbox."""
        await conn.execute(insert(outbox).values(event_row(self._events_topic, job, at, code)))

    async def cancel(self, tenant: str | None, job_id: str) -> Job:
        """Move a non-terminal job to ``cancelled``; a terminal one is a conflict."""
        now = datetime.now(UTC)
        async with transaction(self._engine) as conn:
            whole = _owned(tenant, job_id) & jobs.c.parent_id.is_(None)
            row = (await conn.execute(cancelling(whole, now))).mappings().first()
            if row is None:
                current = (
                    await conn.execute(
                        select(jobs.c.state, jobs.c.parent_id).where(_owned(tenant, job_id))
                    )
                ).first()
                if current is None:
                    raise JobNotFound(f"no job {job_id}")
                if current.parent_id is not None and not JobState(current.state).terminal:
                    raise JobOfDocument(
                        f"job {job_id} is a part of document {current.parent_id}: cancel "
                        "the document"
                    )
                raise JobAlreadyTerminal(f"job {job_id} is already {current.state}")
            job = job_from_row(row)
            await self._event(conn, job, now, "cancelled")
            await end_children(conn, [job.id], JobState.CANCELLED, now)
        return job

    async def graph(self, job_id: str) -> GraphProgress | None:
        """The progress of the job's graph; None when it is not a document cut into one."""
        async with self._engine.connect() as conn:
            row = (
                (await conn.execute(select(graphs).where(graphs.c.job_id == job_id)))
                .mappings()
                .first()
            )
        if row is None:
            return None
        return GraphProgress(
            chunks=row["chunks"],
            level=row["level"],
            levels=max(row["levels"], row["level"] + 1),
            total=row["total"],
            ended=row["ended"],
            prompt_tokens=int(row["prompt_tokens"]),
            output_tokens=int(row["output_tokens"]),
        )

    async def document(self, job_id: str, head_chars: int = 1200) -> DocumentOutline:
        """What a summarize job's page shows of it: its input's first lines, its summary,
        and its graph's parts by level (each part's id, place and state)."""
        async with self._engine.connect() as conn:
            head = await conn.scalar(
                select(func.left(jobs.c.input, head_chars)).where(jobs.c.id == job_id)
            )
            parts = (
                await conn.execute(
                    select(jobs.c.id, jobs.c.level, jobs.c.seq, jobs.c.state)
                    .where(jobs.c.parent_id == job_id)
                    .order_by(jobs.c.level, jobs.c.seq)
                )
            ).all()
        levels: dict[int, list[Part]] = {}
        for p in parts:
            levels.setdefault(p.level, []).append(Part(id=str(p.id), seq=p.seq, state=p.state))
        lines = (head or "").splitlines()
        return DocumentOutline(head=[line for line in lines[:12]], levels=levels)

    async def queue_position(self, job: Job) -> int:
        """Jobs not started yet that were submitted before this one, of every tenant (ids
        are time-ordered): the shared queue ahead of it."""
        async with self._engine.connect() as conn:
            count = await conn.scalar(
                select(func.count())
                .select_from(jobs)
                .where(jobs.c.state.in_(_NOT_STARTED), jobs.c.id < job.id)
            )
        return int(count or 0)

    async def page(
        self,
        tenant: str | None,
        *,
        batch_id: str | None,
        states: list[JobState],
        after: str | None,
        limit: int,
        model: str | None = None,
    ) -> tuple[list[Job], bool]:
        """The tenant's jobs (every tenant's for None), oldest first, after the job id
        ``after``; and whether more follow. ``model``: the request's model
        (``constants.DEFAULT_MODEL``: those that named none)."""
        query = select(jobs)
        if tenant is not None:
            query = query.where(jobs.c.tenant == tenant)
        if batch_id is not None:
            query = query.where(jobs.c.batch_id == batch_id)
        if states:
            query = query.where(jobs.c.state.in_([s.value for s in states]))
        if model is not None:
            query = query.where(job_model() == model)
        if after is not None:
            query = query.where(jobs.c.id > after)
        query = query.order_by(jobs.c.id).limit(limit + 1)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [job_from_row(r) for r in rows[:limit]], len(rows) > limit

    async def flow(
        self, topic: str | None = None, first: bool = True, work: UnitOfWork | None = None
    ) -> Flow:
        """In-flight jobs (L) and the mean submit-to-terminal time (W) of recent ones: of
        the pool whose dispatch topic is ``topic`` (``first``: the first pool), or of all;
        joining ``work``'s next transaction when one comes."""
        pool = of_pool(topic, first) if topic is not None else true()
        now = (
            select(
                func.count().label("in_flight"),
                func.count().filter(jobs.c.state == JobState.RUNNING.value).label("running"),
            )
            .select_from(jobs)
            .where(jobs.c.state.not_in(_TERMINAL), pool)
            .subquery("now")
        )
        timed = and_(
            jobs.c.state == JobState.SUCCEEDED.value,
            jobs.c.decoded_tokens > 0,
            jobs.c.started_at.is_not(None),
        )
        per_token = (
            func.extract("epoch", jobs.c.finished_at - jobs.c.started_at) / jobs.c.decoded_tokens
        )
        recent = (
            select(
                func.count().label("finished"),
                func.avg(func.extract("epoch", jobs.c.finished_at - jobs.c.created_at)).label(
                    "latency"
                ),
                func.count().filter(timed).label("timed"),
                func.percentile_cont(0.5).within_group(per_token).filter(timed).label("per_token"),
            )
            .where(jobs.c.finished_at > func.now() - timedelta(seconds=FLOW_WINDOW_S), pool)
            .subquery("recent")
        )
        # One statement: both aggregates give one row each.
        query = select(now, recent).select_from(now.join(recent, true()))

        async def read(conn: AsyncConnection) -> Row[Any]:
            return (await conn.execute(query)).one()

        row = await joining(work, self._engine, read)
        return Flow(
            in_flight=int(row.in_flight),
            running=int(row.running),
            finished_recently=int(row.finished),
            mean_latency_s=float(row.latency) if row.latency is not None else None,
            timed_jobs=int(row.timed),
            token_time_s=float(row.per_token) if row.per_token is not None else None,
        )


def job_model() -> ColumnElement[str]:
    """A job's model as lists and metrics name it: its request's, else the default."""
    return func.coalesce(jobs.c.params["model"].astext, DEFAULT_MODEL)


def cancellable() -> ColumnElement[bool]:
    """A job that a cancel may still end."""
    return jobs.c.state.in_([s.value for s in CANCELLABLE_STATES])


def cancelling(which: ColumnElement[bool], now: datetime) -> Update:
    """Cancel the jobs ``which`` picks that have not ended yet, returning their rows. Of
    several jobs, lock them first (``plumbing.lock_store``)."""
    return (
        update(jobs)
        .where(which, cancellable())
        .values(
            state=JobState.CANCELLED.value,
            finished_at=now,
            updated_at=now,
            error=reasons.error(JobState.CANCELLED, reasons.CANCELLED),
            held=False,  # a held batch job leaves the meter's queue
        )
        .returning(*jobs.c)
    )


def event_row(topic: str, job: Job, at: datetime, code: str) -> dict[str, object]:
    """The outbox row announcing a job's state change on the events topic."""
    event = JobEvent(
        job_id=job.id,
        tenant=job.tenant,
        state=job.state,
        attempt=job.attempt,
        at=at,
        callback_url=job.callback_url,
        error_code=code,
    )
    return event.outbox_row(topic, job.id)


def _owned(tenant: str | None, job_id: str) -> ColumnElement[bool]:
    """The job ``job_id`` of ``tenant`` (None: of any tenant, for an operator)."""
    if tenant is None:
        return jobs.c.id == job_id
    return and_(jobs.c.id == job_id, jobs.c.tenant == tenant)
