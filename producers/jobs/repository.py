"""The producer side's one home for SQL: jobs and their outbox rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import uuid_utils
from sqlalchemy import Update, and_, func, insert, select, text, tuple_, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from schemas import reasons
from schemas.envelopes import DispatchEnvelope, JobEvent
from schemas.errors import (
    IdempotencyConflict,
    JobAlreadyTerminal,
    JobNotFound,
    SluicegateError,
)
from schemas.jobs import Job, NewJob, estimate_tokens, job_from_row
from schemas.states import CANCELLABLE_STATES, TERMINAL_STATES, JobState, sources_of
from schemas.tables import jobs, outbox

FLOW_WINDOW_S = 60.0

_TERMINAL = [s.value for s in TERMINAL_STATES]
_ABANDONABLE = [s.value for s in sources_of(JobState.ABANDONED)]
_NOT_STARTED = [JobState.QUEUED.value, JobState.DISPATCHED.value]

# A job as stored, and whether this submit created it (False: an idempotent replay).
Stored = tuple[Job, bool]

# Single submits, grouped: the jobs and their dispatch records in one statement. A job whose
# (tenant, idempotency key) is taken already is skipped, and so is its record (the join);
# its answer is read after. Keyed rows go in key order, so that two groups that share keys
# take their locks in the same order (no deadlock); the records go in submission order.
_SUBMIT_GROUP = text(
    """
WITH given AS (
    SELECT * FROM unnest(
        CAST(:ids AS uuid[]), CAST(:tenants AS text[]), CAST(:kinds AS text[]),
        CAST(:priorities AS text[]), CAST(:inputs AS text[]), CAST(:max_tokens AS int[]),
        CAST(:deadlines AS timestamptz[]), CAST(:callback_urls AS text[]),
        CAST(:keys AS text[]), CAST(:hashes AS text[]),
        CAST(:abandon_on_disconnect AS boolean[]), CAST(:abandon_after_s AS float8[]),
        CAST(:payloads AS bytea[])
    ) WITH ORDINALITY AS t(id, tenant, kind, priority, input, max_tokens, deadline,
                           callback_url, idempotency_key, request_hash,
                           abandon_on_disconnect, abandon_after_s, payload, n)
), new_jobs AS (
    INSERT INTO jobs (id, tenant, kind, state, priority, input, max_tokens, deadline,
                      callback_url, idempotency_key, request_hash, abandon_on_disconnect,
                      abandon_after_s)
    SELECT id, tenant, kind, 'queued', priority, input, max_tokens, deadline, callback_url,
           idempotency_key, request_hash, abandon_on_disconnect, abandon_after_s
    FROM given
    ORDER BY tenant, idempotency_key, n
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, deadline, created_at, updated_at, last_seen_at, attempt
), new_outbox AS (
    INSERT INTO outbox (topic, key, payload)
    SELECT :topic, CAST(given.id AS text), given.payload
    FROM given JOIN new_jobs ON new_jobs.id = given.id
    ORDER BY given.n
    RETURNING 1
)
SELECT id, deadline, created_at, updated_at, last_seen_at, attempt FROM new_jobs
"""
).columns(
    jobs.c.id,
    jobs.c.deadline,
    jobs.c.created_at,
    jobs.c.updated_at,
    jobs.c.last_seen_at,
    jobs.c.attempt,
)


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


def new_job_id() -> str:
    """Time-ordered and unguessable: UUIDv7 (48-bit ms timestamp + 74 random bits)."""
    return str(uuid_utils.uuid7())


def _dispatch(job_id: str, new: NewJob) -> bytes:
    """The job's dispatch record, as the outbox keeps it."""
    return DispatchEnvelope(
        job_id=job_id,
        tenant=new.tenant,
        kind=new.kind,
        priority=new.priority,
        max_tokens=new.max_tokens,
        prompt_tokens=estimate_tokens(new.input),
        deadline=new.deadline.astimezone(UTC),  # as the database gives it back
    ).to_bytes()


def _created(new: NewJob, row: Row[Any]) -> Job:
    """The job just stored: what the submit gave, and what the database set."""
    return Job(
        id=str(row.id),
        tenant=new.tenant,
        kind=new.kind,
        state=JobState.QUEUED,
        priority=new.priority,
        max_tokens=new.max_tokens,
        deadline=row.deadline,
        callback_url=new.callback_url,
        idempotency_key=new.idempotency_key,
        created_at=row.created_at,
        updated_at=row.updated_at,
        dispatched_at=None,
        started_at=None,
        finished_at=None,
        attempt=row.attempt,
        result=None,
        error=None,
        abandon_on_disconnect=new.abandon_on_disconnect,
        abandon_after_s=_float(new.abandon_after_s),
        last_seen_at=row.last_seen_at,
        decoded_tokens=None,
    )


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _replay(new: NewJob, first: tuple[Job, str | None] | None) -> Stored | SluicegateError:
    """The answer to a submit whose (tenant, key) was stored before: the job stored first
    (with its request hash), if the request is the same."""
    if first is None:  # its row was there to conflict with, and is gone: cannot happen
        return SluicegateError(f"the job of Idempotency-Key {new.idempotency_key} is gone")
    job, request_hash = first
    if request_hash != new.request_hash:
        return IdempotencyConflict("this Idempotency-Key was already used with a different request")
    return job, False


class JobRepository:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        dispatch_topic: str,
        events_topic: str,
        autocommit: AsyncEngine | None = None,
    ) -> None:
        """``autocommit``: an engine of autocommit connections for the submits (one
        statement each, its own transaction); by default, ``engine``'s connections, set to
        autocommit when taken (their ping costs two round trips more)."""
        self._engine = engine
        self._autocommit = autocommit or engine.execution_options(isolation_level="AUTOCOMMIT")
        self._dispatch_topic = dispatch_topic
        self._events_topic = events_topic

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    async def ping(self) -> None:
        async with self._engine.connect() as conn:
            await conn.execute(select(1))

    async def submit(self, new: NewJob) -> tuple[Job, bool]:
        """Store the job and its dispatch outbox row in one transaction.

        Returns the job and whether it was created; an idempotent replay returns the job
        stored first for the same (tenant, key).
        """
        stored = (await self.submit_group([new]))[0]
        if isinstance(stored, SluicegateError):
            raise stored
        return stored

    async def submit_group(self, group: Sequence[NewJob]) -> list[Stored | SluicegateError]:
        """Store several jobs with their dispatch outbox rows in one statement: one
        transaction, one round trip, one WAL flush, whatever their number.

        Answers each job in order: (job, created), or the error that is its own (an
        idempotency key reused with another request) and leaves the others stored. A
        statement that fails stores none of them and raises.
        """
        ids = [new_job_id() for _ in group]
        params = {
            "ids": ids,
            "tenants": [n.tenant for n in group],
            "kinds": [n.kind.value for n in group],
            "priorities": [n.priority.value for n in group],
            "inputs": [n.input for n in group],
            "max_tokens": [n.max_tokens for n in group],
            "deadlines": [n.deadline for n in group],
            "callback_urls": [n.callback_url for n in group],
            "keys": [n.idempotency_key for n in group],
            "hashes": [n.request_hash for n in group],
            "abandon_on_disconnect": [n.abandon_on_disconnect for n in group],
            "abandon_after_s": [_float(n.abandon_after_s) for n in group],
            "payloads": [_dispatch(job_id, n) for job_id, n in zip(ids, group, strict=True)],
            "topic": self._dispatch_topic,
        }
        async with self._autocommit.connect() as conn:
            # One statement is its own transaction: its answer comes after its commit.
            rows = (await conn.execute(_SUBMIT_GROUP, params)).all()
            created = {r.id: r for r in rows}
            missing = [n for job_id, n in zip(ids, group, strict=True) if job_id not in created]
            replayed = await self._replays(conn, missing) if missing else {}
        answers: list[Stored | SluicegateError] = []
        for job_id, new in zip(ids, group, strict=True):
            row = created.get(job_id)
            if row is not None:
                answers.append((_created(new, row), True))
            else:
                answers.append(_replay(new, replayed.get((new.tenant, new.idempotency_key))))
        return answers

    async def _replays(
        self, conn: AsyncConnection, group: Sequence[NewJob]
    ) -> dict[tuple[str, str | None], tuple[Job, str | None]]:
        """The job stored first for the (tenant, key) of each of ``group``, and the hash of
        its request."""
        pairs = list(
            {(n.tenant, n.idempotency_key) for n in group if n.idempotency_key is not None}
        )
        rows = (
            (
                await conn.execute(
                    select(jobs).where(tuple_(jobs.c.tenant, jobs.c.idempotency_key).in_(pairs))
                )
            )
            .mappings()
            .all()
        )
        return {
            (r["tenant"], r["idempotency_key"]): (job_from_row(r), r["request_hash"]) for r in rows
        }

    async def get(self, tenant: str, job_id: str) -> Job:
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
        async with self._engine.begin() as conn:
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
        async with self._engine.begin() as conn:
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
        return True

    async def _event(self, conn: AsyncConnection, job: Job, at: datetime, code: str) -> None:
        """The job's state change, to the events topic through the outbox."""
        await conn.execute(insert(outbox).values(event_row(self._events_topic, job, at, code)))

    async def cancel(self, tenant: str, job_id: str) -> Job:
        """Move a non-terminal job to ``cancelled``; a terminal one is a conflict."""
        now = datetime.now(UTC)
        async with self._engine.begin() as conn:
            row = (await conn.execute(cancelling(_owned(tenant, job_id), now))).mappings().first()
            if row is None:
                current = (
                    await conn.execute(select(jobs.c.state).where(_owned(tenant, job_id)))
                ).scalar_one_or_none()
                if current is None:
                    raise JobNotFound(f"no job {job_id}")
                raise JobAlreadyTerminal(f"job {job_id} is already {current}")
            job = job_from_row(row)
            await self._event(conn, job, now, "cancelled")
        return job

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
        tenant: str,
        *,
        batch_id: str | None,
        states: list[JobState],
        after: str | None,
        limit: int,
    ) -> tuple[list[Job], bool]:
        """The tenant's jobs, oldest first, after the job id ``after``; and whether more
        follow."""
        query = select(jobs).where(jobs.c.tenant == tenant)
        if batch_id is not None:
            query = query.where(jobs.c.batch_id == batch_id)
        if states:
            query = query.where(jobs.c.state.in_([s.value for s in states]))
        if after is not None:
            query = query.where(jobs.c.id > after)
        query = query.order_by(jobs.c.id).limit(limit + 1)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [job_from_row(r) for r in rows[:limit]], len(rows) > limit

    async def flow(self) -> Flow:
        """In-flight jobs (L) and the mean submit-to-terminal time (W) of recent ones."""
        async with self._engine.connect() as conn:
            in_flight, running = (
                await conn.execute(
                    select(
                        func.count(),
                        func.count().filter(jobs.c.state == JobState.RUNNING.value),
                    )
                    .select_from(jobs)
                    .where(jobs.c.state.not_in(_TERMINAL))
                )
            ).one()
            timed = and_(
                jobs.c.state == JobState.SUCCEEDED.value,
                jobs.c.decoded_tokens > 0,
                jobs.c.started_at.is_not(None),
            )
            per_token = (
                func.extract("epoch", jobs.c.finished_at - jobs.c.started_at)
                / jobs.c.decoded_tokens
            )
            recent = (
                await conn.execute(
                    select(
                        func.count(),
                        func.avg(func.extract("epoch", jobs.c.finished_at - jobs.c.created_at)),
                        func.count().filter(timed),
                        func.percentile_cont(0.5).within_group(per_token).filter(timed),
                    ).where(jobs.c.finished_at > func.now() - timedelta(seconds=FLOW_WINDOW_S))
                )
            ).one()
        return Flow(
            in_flight=int(in_flight),
            running=int(running),
            finished_recently=int(recent[0]),
            mean_latency_s=float(recent[1]) if recent[1] is not None else None,
            timed_jobs=int(recent[2]),
            token_time_s=float(recent[3]) if recent[3] is not None else None,
        )


def cancelling(which: ColumnElement[bool], now: datetime) -> Update:
    """Cancel the jobs ``which`` picks that have not ended yet, returning their rows."""
    return (
        update(jobs)
        .where(which, jobs.c.state.in_([s.value for s in CANCELLABLE_STATES]))
        .values(
            state=JobState.CANCELLED.value,
            finished_at=now,
            updated_at=now,
            error=reasons.error(JobState.CANCELLED, reasons.CANCELLED),
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
    return {"topic": topic, "key": job.id, "payload": event.to_bytes()}


def _owned(tenant: str, job_id: str) -> ColumnElement[bool]:
    return and_(jobs.c.id == job_id, jobs.c.tenant == tenant)
