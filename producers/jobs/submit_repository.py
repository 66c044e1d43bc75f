"""The submits' SQL: single jobs with their dispatch records, a group of them in one
statement, and the answer to an idempotent replay."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC
from typing import Any

import uuid_utils
from sqlalchemy import select, tuple_
from sqlalchemy.engine import Row
from sqlalchemy.exc import DBAPIError, InterfaceError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.db import KeptConnections, transaction
from plumbing.publish_at_once import AtOncePublisher
from plumbing.published_store import OutboxRow
from plumbing.unit_of_work import Unit, UnitOfWork
from producers.jobs.submit_store import SUBMIT, SUBMIT_RECORDING
from schemas.envelopes import DispatchEnvelope
from schemas.errors import IdempotencyConflict, SluicegateError
from schemas.jobs import Job, NewJob, estimate_tokens, job_from_row
from schemas.states import JobState
from schemas.tables import jobs

# A job as stored, and whether this submit created it (False: an idempotent replay).
Stored = tuple[Job, bool]


def _json(value: dict[str, Any] | None) -> str | None:
    return json.dumps(value) if value is not None else None


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


class SubmitRepository:
    """Stores submitted jobs with their dispatch records (``JobRepository`` is one)."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        dispatch_topic: str,
        autocommit: AsyncEngine | None = None,
        topic_of: Callable[[str | None], str] | None = None,
        work: UnitOfWork | None = None,
        at_once: AtOncePublisher | None = None,
        kept: int = 0,
    ) -> None:
        """``autocommit``: an engine of autocommit connections for the submits (one
        statement each, its own transaction); by default, ``engine``'s connections, set to
        autocommit when taken. ``topic_of``: the dispatch topic of a model's pool (by
        default ``dispatch_topic`` for every model). ``work``: the writes that join a
        group's transaction (the periodic readings, the records of rows published at
        once); ``at_once``: publishes the dispatch records at once. ``kept``: how many of
        the submits' connections stay open between statements (``close`` closes them)."""
        self._engine = engine
        self._autocommit = autocommit or engine.execution_options(isolation_level="AUTOCOMMIT")
        self._topic_of = topic_of or (lambda _model: dispatch_topic)
        self.work = work or UnitOfWork(self._autocommit, linger_s=0.0)
        self.at_once = at_once
        self._kept = KeptConnections(self._autocommit, keep=kept)

    async def close(self) -> None:
        await self._kept.close()

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
        params: dict[str, Any] = {
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
            "params": [_json(n.params) for n in group],
            "payloads": [_dispatch(job_id, n) for job_id, n in zip(ids, group, strict=True)],
            "topics": [self._topic_of(n.model) for n in group],
        }
        params["grace_s"] = self.at_once.grace_s if self.at_once is not None else None
        created, replayed = await self._stored(group, ids, params)
        if self.at_once is not None:
            self.at_once.offer(
                [
                    OutboxRow(id=r.outbox_id, topic=topic, key=str(r.id), payload=payload)
                    for job_id, topic, payload in zip(
                        ids, params["topics"], params["payloads"], strict=True
                    )
                    if (r := created.get(job_id)) is not None
                ]
            )
        answers: list[Stored | SluicegateError] = []
        for job_id, new in zip(ids, group, strict=True):
            row = created.get(job_id)
            if row is not None:
                answers.append((_created(new, row), True))
            else:
                answers.append(_replay(new, replayed.get((new.tenant, new.idempotency_key))))
        return answers

    async def _stored(
        self, group: Sequence[NewJob], ids: list[str], params: dict[str, Any]
    ) -> tuple[dict[Any, Row[Any]], dict[tuple[str, str | None], tuple[Job, str | None]]]:
        """The group's statement with the unit of work's writes waiting: in one transaction
        when writes joined (they run first), else on its own (one statement is its own
        transaction: its answer comes after its commit). A statement that fails with
        joined writes or published records (a record may wait for a row a relay holds) is
        written again alone, unless its connection broke (its outcome is not known); what
        had joined it runs alone."""
        unit = self.work.take()
        opened = transaction(self._autocommit) if unit.writes else self._kept.connection()
        try:
            async with unit.settling(), opened as conn:
                await unit.run(conn)
                return await self._on(unit, group, ids, params)
        except DBAPIError as exc:
            if exc.connection_invalidated or isinstance(exc, InterfaceError):
                raise
            if not unit.carried:
                raise
        async with self._autocommit.connect() as conn:
            rows = list((await conn.execute(SUBMIT, params)).all())
            return await self._answers(conn, rows, group, ids)

    async def _on(
        self, unit: Unit, group: Sequence[NewJob], ids: list[str], params: dict[str, Any]
    ) -> tuple[dict[Any, Row[Any]], dict[tuple[str, str | None], tuple[Job, str | None]]]:
        """The group written on ``unit``'s connection, recording the rows published at once
        since the last statement, and the jobs first stored under the keys it replays."""
        found = await unit.connection.execute(*unit.recording(SUBMIT, SUBMIT_RECORDING, params))
        return await self._answers(unit.connection, list(found.all()), group, ids)

    async def _answers(
        self, conn: AsyncConnection, rows: list[Row[Any]], group: Sequence[NewJob], ids: list[str]
    ) -> tuple[dict[Any, Row[Any]], dict[tuple[str, str | None], tuple[Job, str | None]]]:
        created = {r.id: r for r in rows}
        missing = [n for job_id, n in zip(ids, group, strict=True) if job_id not in created]
        return created, await self._replays(conn, missing) if missing else {}

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
