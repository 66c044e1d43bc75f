"""A job's end, written by the attempt that ran it: the terminal state and its event in one
statement, which also records the events this worker published at once since its last
statement (``plumbing.publish_at_once``). The statement waits a little to join the worker's next
claim transaction (one commit for both, ``plumbing.unit_of_work``); when no claim came, it
is its own transaction."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import CTE, column, text
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.publish_at_once import AtOncePublisher
from plumbing.published_store import RECORDING, OutboxRow, cte
from plumbing.unit_of_work import Unit, UnitOfWork
from schemas.envelopes import JobEvent
from schemas.states import JobState
from workers.graph.part_store import GraphChild, child_end
from workers.graph.repository import GraphWriter
from workers.repository import ClaimedJob

_ENDING: tuple[CTE, ...] = (
    cte(
        "written",
        """UPDATE jobs SET state = :state, result = CAST(:result AS jsonb),
                    error = CAST(:error AS jsonb), decoded_tokens = :decoded_tokens,
                    finished_at = :at, updated_at = :at
    WHERE id = CAST(:id AS uuid) AND state = 'running' AND attempt = :attempt
    RETURNING id""",
    ),
    cte(
        "announced",
        """INSERT INTO outbox (topic, key, payload, publish_after)
    SELECT :topic, :key, :payload, now() + CAST(:grace_s AS float8) * interval '1 second'
    FROM written
    RETURNING id""",
    ),
)
_EVENT = text("SELECT (SELECT id FROM announced) AS event_id").columns(column("event_id"))
FINISH = _EVENT.add_cte(*_ENDING)
# With the records of the events this worker published at once (``plumbing.published_store``).
FINISH_RECORDING = _EVENT.add_cte(*_ENDING, *RECORDING)


class EndRepository:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        events_topic: str,
        at_once: AtOncePublisher | None = None,
        work: UnitOfWork | None = None,
        graphs: GraphWriter | None = None,
    ) -> None:
        """``at_once``: publishes the events at once; ``work``: the claims the ends join;
        ``graphs``: writes the step a document's job's end triggers (by default, for the
        events topic and the first pool)."""
        self._events_topic = events_topic
        self.at_once = at_once
        self._work = work or UnitOfWork(engine, linger_s=0.0)
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

        async def write(unit: Unit) -> int | None:
            found = await unit.connection.scalar(*unit.recording(FINISH, FINISH_RECORDING, params))
            return None if found is None else int(found)

        event_id = await self._work.join(write, locks=[job.id])
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

        async def write(unit: Unit) -> bool:
            counted = await child_end(
                unit.connection,
                child,
                job_id=job.id,
                attempt=job.attempt,
                state=state,
                result=result,
                error=error,
                decoded_tokens=decoded_tokens,
                at=now,
            )
            await self.graphs.after_end(unit.connection, child, counted, state, error, now)
            return counted.written

        locks = [child.parent_id, job.id]
        return bool(await self._work.join(write, locks=locks, in_transaction=True))
