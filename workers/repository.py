"""The worker side's one home for SQL: claim a job, write its terminal state."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, update
from sqlalchemy.ext.asyncio import AsyncEngine

from schemas.envelopes import JobEvent
from schemas.jobs import JobKind
from schemas.states import CLAIMABLE_STATES, JobState
from schemas.tables import jobs, outbox


@dataclass(frozen=True, kw_only=True)
class Claimed:
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


class WorkerRepository:
    def __init__(self, engine: AsyncEngine, *, events_topic: str) -> None:
        self._engine = engine
        self._events_topic = events_topic

    async def claim(self, job_id: str) -> Claimed | None:
        """Move the job to ``running`` with a new attempt; None if it is not claimable."""
        now = datetime.now(UTC)
        async with self._engine.begin() as conn:
            row = (
                (
                    await conn.execute(
                        update(jobs)
                        .where(
                            jobs.c.id == job_id,
                            jobs.c.state.in_([s.value for s in CLAIMABLE_STATES]),
                        )
                        .values(
                            state=JobState.RUNNING.value,
                            attempt=jobs.c.attempt + 1,
                            started_at=now,
                            updated_at=now,
                            dispatched_at=func.coalesce(jobs.c.dispatched_at, now),
                        )
                        .returning(
                            jobs.c.id,
                            jobs.c.tenant,
                            jobs.c.kind,
                            jobs.c.input,
                            jobs.c.max_tokens,
                            jobs.c.deadline,
                            jobs.c.created_at,
                            jobs.c.attempt,
                            jobs.c.callback_url,
                        )
                    )
                )
                .mappings()
                .first()
            )
        if row is None:
            return None
        return Claimed(
            id=str(row["id"]),
            tenant=row["tenant"],
            kind=JobKind(row["kind"]),
            input=row["input"],
            max_tokens=row["max_tokens"],
            deadline=row["deadline"],
            created_at=row["created_at"],
            attempt=row["attempt"],
            callback_url=row["callback_url"],
        )

    async def finish(
        self,
        job: Claimed,
        state: JobState,
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> bool:
        """Write the terminal state if this attempt still owns the job (fencing).

        The job event goes into the outbox in the same transaction. Returns False when the
        job was cancelled meanwhile or a newer attempt took it over.
        """
        if not state.terminal:
            raise ValueError(f"{state} is not terminal")
        now = datetime.now(UTC)
        async with self._engine.begin() as conn:
            written = (
                await conn.execute(
                    update(jobs)
                    .where(
                        jobs.c.id == job.id,
                        jobs.c.state == JobState.RUNNING.value,
                        jobs.c.attempt == job.attempt,
                    )
                    .values(
                        state=state.value,
                        result=result,
                        error=error,
                        finished_at=now,
                        updated_at=now,
                    )
                )
            ).rowcount
            if written != 1:
                return False
            event = JobEvent(
                job_id=job.id,
                tenant=job.tenant,
                state=state,
                attempt=job.attempt,
                at=now,
                callback_url=job.callback_url,
                error_code=(error or {}).get("code"),
            )
            await conn.execute(
                insert(outbox).values(
                    topic=self._events_topic, key=job.id, payload=event.to_bytes()
                )
            )
        return True
