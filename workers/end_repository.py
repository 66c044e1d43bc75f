"""A job's end, written by the attempt that ran it: the terminal state and its event in one
statement, which also marks the events this worker published at once since its last
statement (``plumbing.at_once``). With a ``Carpool``, the statement waits a little to ride in
the worker's next claim transaction (one commit for both); else, or when no claim came, it
is its own transaction."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.at_once import AtOnce
from plumbing.carpool import Carpool
from plumbing.db import transaction
from plumbing.mark_store import MARKS, Mark, OutboxRow
from plumbing.mark_store import params as marked
from schemas.envelopes import JobEvent
from schemas.states import JobState
from workers.graph.part_store import GraphChild, child_end
from workers.graph.repository import GraphWriter
from workers.repository import ClaimedJob

_FINISH = """
WITH written AS (
    UPDATE jobs SET state = :state, result = CAST(:result AS jsonb),
                    error = CAST(:error AS jsonb), decoded_tokens = :decoded_tokens,
                    finished_at = :at, updated_at = :at
    WHERE id = CAST(:id AS uuid) AND state = 'running' AND attempt = :attempt
    RETURNING id
), announced AS (
    INSERT INTO outbox (topic, key, payload, publish_after)
    SELECT :topic, :key, :payload, now() + CAST(:grace_s AS float8) * interval '1 second'
    FROM written
    RETURNING id
)MARKS
SELECT (SELECT id FROM announced) AS event_id
"""
_ALONE = text(_FINISH.replace("MARKS", ""))
_MARKING = text(_FINISH.replace("MARKS", f", {MARKS}"))


class EndRepository:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        events_topic: str,
        at_once: AtOnce | None = None,
        carpool: Carpool | None = None,
        graphs: GraphWriter | None = None,
    ) -> None:
        """``graphs``: writes the step a document's job's end triggers (by default, for
        the events topic and the first pool)."""
        self._engine = engine
        self._events_topic = events_topic
        self.at_once = at_once  # publishes the events at once
        self._carpool = carpool or Carpool(0.0)
        self.graphs = graphs or GraphWriter(
            engine, events_topic=events_topic, dispatch_topic="jobs.dispatch"
        )

    async def finish(
        self,
        job: ClaimedJob,
        state: JobState,
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        decoded_tokens: int | None = None,
        at: datetime | None = None,
    ) -> bool:
        """Write the terminal state if this attempt still owns the job (fencing).

        ``at`` is when the job ended (default: now). The job event goes into the outbox in
        the same statement. Returns False when the job was cancelled meanwhile or a newer
        attempt took it over.
        """
        if not state.terminal:
            raise ValueError(f"{state} is not terminal")
        now = at or datetime.now(UTC)
        if job.parent_id is not None:
            child = GraphChild(parent_id=job.parent_id, level=job.level or 0)
            return await self._child(job, child, state, result, error, decoded_tokens, now)
        event = JobEvent(
            job_id=job.id,
            tenant=job.tenant,
            state=state,
            attempt=job.attempt,
            at=now,
            callback_url=job.callback_url,
            error_code=(error or {}).get("code"),
            in_batch=job.in_batch,
        )
        payload = event.to_bytes()
        params: dict[str, Any] = {
            "id": job.id,
            "attempt": job.attempt,
            "state": state.value,
            "result": json.dumps(result),
            "error": json.dumps(error),
            "decoded_tokens": decoded_tokens,
            "at": now,
            "topic": self._events_topic,
            "key": job.id,
            "payload": payload,
            "grace_s": self.at_once.grace_s if self.at_once is not None else None,
        }
        taken: list[Mark] = []

        def undo() -> None:  # its carrier failed: the marks wait for the next statement
            if self.at_once is not None:
                self.at_once.restore(taken)
            taken.clear()

        async def ride(conn: AsyncConnection) -> int | None:
            taken.extend(self.at_once.take() if self.at_once is not None else [])
            return await self._on(conn, params, taken)

        event_id = await self._carpool.ride(
            ride, lambda: self._write(params), locks=[job.id], undo=undo
        )
        if event_id is None:
            return False
        if self.at_once is not None:
            self.at_once.offer(
                [OutboxRow(id=event_id, topic=self._events_topic, key=job.id, payload=payload)]
            )
        return True

    async def _child(
        self,
        job: ClaimedJob,
        child: GraphChild,
        state: JobState,
        result: dict[str, Any] | None,
        error: dict[str, Any] | None,
        decoded_tokens: int | None,
        now: datetime,
    ) -> bool:
        """A document's job's end: no event of its own; counted in its graph, and the step
        that count triggers, in one transaction (the claim's it rides in, or its own)."""

        async def write(conn: AsyncConnection) -> bool:
            counted = await child_end(
                conn,
                child,
                job_id=job.id,
                attempt=job.attempt,
                state=state,
                result=result,
                error=error,
                decoded_tokens=decoded_tokens,
                at=now,
            )
            await self.graphs.after_end(conn, child, counted, state, error, now)
            return counted.written

        async def alone() -> bool:
            async with transaction(self._engine) as conn:
                return await write(conn)

        return bool(
            await self._carpool.ride(write, alone, locks=[child.parent_id, job.id], undo=None)
        )

    async def _write(self, params: dict[str, Any]) -> int | None:
        """The statement alone, with the marks waiting."""
        marks = self.at_once.take() if self.at_once is not None else []
        async with self._engine.connect() as conn:
            return await self._on(conn, params, marks)

    async def _on(
        self, conn: AsyncConnection, params: dict[str, Any], marks: list[Mark]
    ) -> int | None:
        """The statement on ``conn``, with ``marks`` (given back if it fails)."""
        try:
            if marks:
                found = await conn.scalar(_MARKING, {**params, **marked(marks, ())})
            else:
                found = await conn.scalar(_ALONE, params)
        except DBAPIError:
            if self.at_once is not None:
                self.at_once.restore(marks)
            marks.clear()
            raise
        return None if found is None else int(found)
