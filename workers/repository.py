"""The worker side's one home for SQL: claim jobs (or drop them), write their terminal
states, and re-read the states of the jobs running here."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, case, cast, func, insert, literal, select, text, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.db import transaction
from plumbing.lock_store import locking_in_order
from plumbing.unit_of_work import Unit, UnitOfWork
from schemas import reasons
from schemas.jobs import JobKind
from schemas.states import CLAIMABLE_STATES, JobState
from schemas.tables import jobs, outbox
from workers.dead_letter_store import set_aside
from workers.engines.base import SamplingParams
from workers.gate import Candidate, Drop, candidate_of, event_row, reason_of
from workers.graph.part_store import GRAPHED, lease_of, split_rows, with_documents
from workers.graph.repository import GraphWriter, document_error

Judge = Callable[[Candidate], Drop | None]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ClaimedJob:
    """A job this worker now owns, fenced by its attempt number."""

    id: str
    tenant: str
    kind: JobKind
    input: str
    max_tokens: int
    deadline: datetime
    created_at: datetime
    attempt: int
    callback_url: str | None
    abandon_after_s: float | None = None  # the caller's heartbeat lease
    in_batch: bool | None = None  # one of a batch's jobs (None: not known)
    prompt_tokens: int = 0
    sampling: SamplingParams | None = None  # the request's model and sampling parameters
    parent_id: str | None = None  # a job of a document's graph: its document
    level: int | None = None  # and its level (0: a chunk)


@dataclass(frozen=True, kw_only=True)
class StoppedJob:
    """A job running here whose row says it must stop (or already stopped)."""

    job_id: str
    state: JobState
    reason: str


_CLAIM_COLUMNS = (
    jobs.c.id,
    jobs.c.tenant,
    jobs.c.kind,
    jobs.c.state,
    jobs.c.input,
    jobs.c.max_tokens,
    jobs.c.deadline,
    jobs.c.created_at,
    jobs.c.attempt,
    jobs.c.callback_url,
    jobs.c.abandon_after_s,
    jobs.c.last_seen_at,
    jobs.c.error,
    jobs.c.params,
    jobs.c.batch_id,
    jobs.c.parent_id,
    jobs.c.level,
)


def _lapsed(ids: list[str]) -> Select[tuple[Any]]:
    """Of ``ids``, the running jobs whose heartbeat lease lapsed, locked, skipping any
    another transaction holds (a terminal write, a cancel): the sweep never waits for a
    row, so it can never be half of a deadlock; a skipped job is looked at next sweep."""
    return (
        select(jobs.c.id)
        .where(
            jobs.c.id.in_(ids),
            jobs.c.state == JobState.RUNNING.value,
            jobs.c.abandon_after_s.is_not(None),
            jobs.c.last_seen_at < func.now() - jobs.c.abandon_after_s * text("interval '1 second'"),
        )
        .with_for_update(skip_locked=True)
    )


class WorkerRepository:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        events_topic: str,
        dead_letter_topic: str = "dead-letter",
        work: UnitOfWork | None = None,
        dispatch_topic: str = "jobs.dispatch",
        partitions: int = 0,
    ) -> None:
        """``work``: the job ends (and reports) joining the next claim; ``dispatch_topic``
        and ``partitions``: the pool's, for its graphs' parts (``GraphWriter``)."""
        self._engine = engine
        self._events_topic = events_topic
        self._dead_letter_topic = dead_letter_topic
        self.work = work or UnitOfWork(engine, linger_s=0.0)
        self.graphs = GraphWriter(
            engine, events_topic=events_topic, dispatch_topic=dispatch_topic, partitions=partitions
        )

    async def set_aside(self, *, subject: str, reason: str, payload: bytes) -> None:
        """A dispatch record this worker cannot run, dead-lettered with the reason."""
        async with transaction(self._engine) as conn:
            await set_aside(
                conn,
                dead_letter_topic=self._dead_letter_topic,
                source="dispatch",
                subject=subject,
                reason=reason,
                payload=payload,
            )

    async def claim_batch(
        self, job_ids: list[str], judge: Judge, count_tokens: Callable[[str], int]
    ) -> dict[str, ClaimedJob | Drop | None]:
        """Judge and claim the jobs of a batch of records in one transaction.

        Their rows are read in one query and stay locked while ``judge`` (the pre-decode
        gate) decides, so a cancel that arrives meanwhile waits for this transaction and
        then finds the job either running (it is aborted) or dropped (the cancel is a
        conflict): one terminal state either way. A job judged fit is claimed (``running``,
        a new attempt); a dropped one gets its terminal state and event here, unless it
        already had one. Unknown ids map to None. The job ends waiting in the unit of work are
        written in the same transaction, before the claim.
        """
        if self.work.waiting:
            try:
                return await self._claim_with(job_ids, judge, count_tokens, self.work.take())
            except DBAPIError as exc:  # its ends run alone; the claim is tried again alone
                if exc.connection_invalidated:
                    raise
                log.warning("a claim carrying job ends failed; claiming alone: %r", exc)
        return await self._claim_with(job_ids, judge, count_tokens, Unit(self.work))

    async def _claim_with(
        self,
        job_ids: list[str],
        judge: Judge,
        count_tokens: Callable[[str], int],
        unit: Unit,
    ) -> dict[str, ClaimedJob | Drop | None]:
        now = datetime.now(UTC)
        out: dict[str, ClaimedJob | Drop | None] = dict.fromkeys(job_ids)
        async with unit.settling(), transaction(self._engine) as conn:
            if unit.writes:
                await lock_rows(conn, [*job_ids, *unit.locks])
            await unit.run(conn)
            rows, documents = split_rows(await self._read(conn, job_ids))
            fit: dict[str, tuple[Mapping[Any, Any], int]] = {}
            drops: dict[str, tuple[Mapping[Any, Any], Drop]] = {}
            for row in rows:
                job_id = str(row["id"])
                if row["graphed"]:  # its graph runs: its record is let go
                    out[job_id] = Drop(
                        state=JobState.RUNNING, reason=reasons.GRAPHED, store_state=False
                    )
                    continue
                prompt_tokens = count_tokens(row["input"])
                document = documents.get(row["parent_id"])
                drop = judge(candidate_of(row, prompt_tokens, document))
                if drop is None:  # a part keeps its document's lease
                    fit[job_id] = ({**row, **lease_of(document)}, prompt_tokens)
                else:
                    out[job_id] = drop
                    if drop.store_state:
                        drops[job_id] = (row, drop)
            if fit:
                claimed = await self._claim(conn, list(fit), now)
                for job_id, attempt in claimed.items():
                    out[job_id] = _claimed(*fit[job_id], attempt)
            if drops:
                await self._drop(conn, drops, now)
        return out

    async def _read(self, conn: AsyncConnection, job_ids: list[str]) -> Sequence[Any]:
        """``job_ids``' rows and their documents' (no input), locked document first."""
        wanted = jobs.c.id.in_(job_ids)
        query = (
            select(
                *(c for c in _CLAIM_COLUMNS if c is not jobs.c.input),
                case((wanted, jobs.c.input)).label("input"),
                wanted.label("wanted"),
                GRAPHED,
                func.now().label("db_now"),
            )
            .where(with_documents(job_ids))
            .order_by(jobs.c.id)
            .with_for_update(of=jobs)
        )
        return (await conn.execute(query)).mappings().all()

    async def _claim(
        self, conn: AsyncConnection, job_ids: list[str], now: datetime
    ) -> dict[str, int]:
        result = await conn.execute(
            update(jobs)
            .where(
                jobs.c.id.in_(job_ids),
                jobs.c.state.in_([s.value for s in CLAIMABLE_STATES]),
            )
            .values(
                state=JobState.RUNNING.value,
                attempt=jobs.c.attempt + 1,
                started_at=now,
                updated_at=now,
                dispatched_at=func.coalesce(jobs.c.dispatched_at, now),
            )
            .returning(jobs.c.id, jobs.c.attempt)
        )
        return {str(r.id): r.attempt for r in result}

    async def _drop(
        self,
        conn: AsyncConnection,
        drops: dict[str, tuple[Mapping[Any, Any], Drop]],
        now: datetime,
    ) -> None:
        groups: dict[Drop, list[str]] = defaultdict(list)
        documents: dict[str, Drop] = {}
        for job_id, (_, drop) in drops.items():
            groups[drop].append(job_id)
        events = []
        for drop, ids in groups.items():
            result = await conn.execute(
                update(jobs)
                .where(jobs.c.id.in_(ids), jobs.c.state.in_([s.value for s in CLAIMABLE_STATES]))
                .values(
                    state=drop.state.value,
                    error=drop.error("before_decode"),
                    decoded_tokens=0,
                    finished_at=now,
                    updated_at=now,
                )
                .returning(jobs.c.id)
            )
            for r in result:
                row = drops[str(r.id)][0]
                if row["parent_id"] is not None:  # its document ends with it, and announces
                    documents.setdefault(str(row["parent_id"]), drop)
                    continue
                events.append(
                    event_row(
                        self._events_topic,
                        row,
                        drop.state,
                        row["attempt"],
                        now,
                        drop.error("before_decode"),
                    )
                )
        if events:
            await conn.execute(insert(outbox), events)
        for parent_id, drop in documents.items():
            await self.graphs.end_document(
                conn,
                parent_id,
                drop.state,
                document_error(drop.state, drop.error("before_decode")),
                now,
            )

    async def stopped(
        self, running: Mapping[str, int], documents: Sequence[str] = ()
    ) -> list[StoppedJob]:
        """Of the jobs running here (id -> attempt), those that must stop.

        Abandons the jobs whose heartbeat lease lapsed (first the ``documents`` of the
        parts running here, with all their parts); then reads which jobs are no longer
        running under our attempt (a missed cancel, a takeover). One transaction.
        """
        if not running:
            return []
        now = datetime.now(UTC)
        ids = list(running)
        error = Drop(state=JobState.ABANDONED, reason=reasons.HEARTBEAT_LAPSED).error("decode")
        topic = self._events_topic
        async with transaction(self._engine) as conn:
            if documents:
                await self.graphs.abandon_lapsed(conn, documents, now)
            lapsed = (
                (
                    await conn.execute(
                        update(jobs)
                        .where(jobs.c.id.in_(_lapsed(ids).scalar_subquery()))
                        .values(
                            state=JobState.ABANDONED.value,
                            error=error,
                            finished_at=now,
                            updated_at=now,
                        )
                        .returning(*_CLAIM_COLUMNS)
                    )
                )
                .mappings()
                .all()
            )
            if lapsed:
                await conn.execute(
                    insert(outbox),
                    [
                        event_row(topic, r, JobState.ABANDONED, r["attempt"], now, error)
                        for r in lapsed
                    ],
                )
            rows = (
                await conn.execute(
                    select(jobs.c.id, jobs.c.state, jobs.c.attempt, jobs.c.error).where(
                        jobs.c.id.in_(ids)
                    )
                )
            ).all()
        return [
            StoppedJob(
                job_id=str(r.id), state=JobState(r.state), reason=reason_of(r.error, r.state)
            )
            for r in rows
            if r.state != JobState.RUNNING.value or r.attempt != running[str(r.id)]
        ]

    async def is_terminal(self, job_id: str) -> bool:
        """Whether the job ended (any attempt's, a cancel's) or became a graph of parts."""
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(select(jobs.c.state, GRAPHED).where(jobs.c.id == job_id))
            ).first()
        return row is None or JobState(row.state).terminal or bool(row.graphed)

    async def record_decoded(self, job: ClaimedJob, tokens: int) -> None:
        """The tokens an attempt decoded before it was stopped by someone else's write
        (a cancel or a disconnect): marks the stop as made mid-decode."""
        stage = cast(literal({"stage": "decode"}, JSONB), JSONB)
        async with transaction(self._engine) as conn:
            await conn.execute(
                update(jobs)
                .where(jobs.c.id == job.id, jobs.c.attempt == job.attempt)
                .values(
                    decoded_tokens=tokens,
                    error=func.coalesce(jobs.c.error, cast(literal({}, JSONB), JSONB)).op("||")(
                        stage
                    ),
                )
            )


def _claimed(row: Mapping[Any, Any], prompt_tokens: int, attempt: int) -> ClaimedJob:
    return ClaimedJob(
        id=str(row["id"]),
        tenant=row["tenant"],
        kind=JobKind(row["kind"]),
        input=row["input"],
        max_tokens=row["max_tokens"],
        deadline=row["deadline"],
        created_at=row["created_at"],
        attempt=attempt,
        callback_url=row["callback_url"],
        abandon_after_s=row["abandon_after_s"],
        in_batch=row["batch_id"] is not None,
        prompt_tokens=prompt_tokens,
        sampling=SamplingParams.from_stored(row["params"]),
        parent_id=str(row["parent_id"]) if row["parent_id"] is not None else None,
        level=row["level"],
    )


async def lock_rows(conn: AsyncConnection, job_ids: Sequence[str]) -> None:
    """``job_ids``' rows and their documents' locked, in one order (``plumbing.lock_store``):
    what a transaction that writes several jobs' ends does first."""
    if job_ids:
        await conn.execute(locking_in_order(jobs, with_documents(job_ids)))
