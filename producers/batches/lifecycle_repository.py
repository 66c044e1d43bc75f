"""The lifecycle's SQL (``producers.batches.lifecycle``): check a ``validating`` batch's
lines and make its jobs, or fail it with its bad lines; mark a batch whose every job ended
``finalizing``; write a finalizing batch's output and error files and end it. Each step is
one transaction on a row taken with SKIP LOCKED, so API replicas share the work and a step
cut short (a crash, a restart) is rolled back and taken again by the next sweep."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Exists, exists, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.db import transaction
from producers.batches.input import CHUNK, FileValidation, RequestChecker
from producers.batches.repository import (
    INSERT_JOBS,
    BatchRequest,
    BatchStore,
    NewBatch,
    batch_counts,
    job_params,
)
from producers.batches.results import result_lines
from producers.files.repository import FileStore
from schemas.batches import Status, batch_status
from schemas.batches.output import ResultPart, result_file_id
from schemas.files import FileNotFound
from schemas.jobs import Priority
from schemas.states import TERMINAL_STATES
from schemas.tables import batches, jobs

_TERMINAL = [s.value for s in TERMINAL_STATES]
BATCH_OUTPUT = "batch_output"

_GONE = {"code": "file_not_found", "param": "input_file_id", "line": None}

# The checker of a validating batch's lines: the url its lines must name (None: theirs).
Checker = Callable[[str | None], RequestChecker]


def _new_batch(row: Mapping[Any, Any]) -> NewBatch:
    return NewBatch(
        tenant=row["tenant"],
        endpoint=row["endpoint"] or None,
        completion_window=row["completion_window"],
        deadline=row["deadline"],
        priority=Priority(row["priority"]),
        callback_url=row["callback_url"],
        metadata=row["metadata"],
        idempotency_key=row["idempotency_key"],
        request_hash=row["request_hash"],
        input_file_id=row["input_file_id"],
    )


class LifecycleStore:
    def __init__(self, engine: AsyncEngine, batches: BatchStore, files: FileStore) -> None:
        self._engine = engine
        self._batches = batches
        self._files = files

    async def validate_next(self, checker: Checker) -> tuple[str, Status] | None:
        """Check the next ``validating`` batch: ``in_progress`` with its jobs (held for
        the meter), or ``failed`` with its bad lines and no job; None when none waits."""
        async with transaction(self._engine) as conn:
            row = await _take_next(conn, "validating", batches.c.created_at)
            if row is None:
                return None
            batch_id = str(row["id"])
            check = FileValidation(checker(row["endpoint"] or None))
            savepoint = await conn.begin_nested()
            try:
                total = await self._write_jobs(conn, row, check)
                errors = check.errors()
            except FileNotFound:
                total, errors = 0, [{**_GONE, "message": f"file {row['input_file_id']} is gone"}]
            if errors:
                await savepoint.rollback()
                values: dict[str, Any] = {"status": "failed", "errors": errors, "total": 0}
                values["finished_at"] = datetime.now(UTC)
                status: Status = "failed"
            else:
                await savepoint.commit()
                endpoint = check.checker.finish()
                values = {"status": "in_progress", "total": total, "endpoint": endpoint}
                values["in_progress_at"] = datetime.now(UTC)
                status = "in_progress"
            await conn.execute(update(batches).where(batches.c.id == batch_id).values(values))
        return batch_id, status

    async def _write_jobs(
        self, conn: AsyncConnection, row: Mapping[Any, Any], check: FileValidation
    ) -> int:
        """Check every line of the batch's file, writing its jobs a chunk at a time until
        the first bad line (then only checking, to name the bad lines); the jobs written."""
        new = _new_batch(row)
        batch_id = str(row["id"])
        chunk: list[BatchRequest] = []
        total = 0
        async for number, line in self._files.lines(row["tenant"], row["input_file_id"]):
            if (request := check.feed(number, line)) is not None:
                chunk.append(request)
            if check.done:
                break
            if len(chunk) >= CHUNK:
                await conn.execute(
                    INSERT_JOBS, job_params(new, batch_id, chunk, self._batches.topic_of)
                )
                total, chunk = total + len(chunk), []
        if chunk and not check.checker.problems:
            await conn.execute(
                INSERT_JOBS, job_params(new, batch_id, chunk, self._batches.topic_of)
            )
            total += len(chunk)
        return total

    async def pending(self) -> bool:
        """In one statement: whether any batch waits for a step (validating, finalizing,
        or in progress or cancelling with every job ended)."""
        waiting = exists().where(batches.c.status.in_(("validating", "finalizing")))
        ready = exists().where(batches.c.status.in_(("in_progress", "cancelling")), ~_unended())
        async with self._engine.connect() as conn:
            return bool(await conn.scalar(select(or_(waiting, ready))))

    async def mark_finalizing(self, limit: int = 100) -> int:
        """Batches in progress (or cancelling) whose every job ended become
        ``finalizing``; how many."""
        ready = (
            select(batches.c.id)
            .where(batches.c.status.in_(("in_progress", "cancelling")), ~_unended())
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        async with transaction(self._engine) as conn:
            result = await conn.execute(
                update(batches)
                .where(batches.c.id.in_(ready.scalar_subquery()))
                .values(status="finalizing", finalizing_at=datetime.now(UTC))
            )
        return int(result.rowcount)

    async def finalize_next(self) -> tuple[str, Status] | None:
        """Write the next finalizing batch's output and error files (stored files, purpose
        ``batch_output``; none for a part without lines) and end it: completed, expired or
        cancelled. None when none is finalizing."""
        async with transaction(self._engine) as conn:
            row = await _take_next(conn, "finalizing", batches.c.finalizing_at)
            if row is None:
                return None
            batch_id = str(row["id"])
            made = {part: await self._result_file(conn, row, part) for part in ("output", "error")}
            counts, _ = await batch_counts(conn, batch_id)
            ended = batch_status(row["cancelled_at"], counts, row["total"])
            await conn.execute(
                update(batches)
                .where(batches.c.id == batch_id)
                .values(
                    status=ended,
                    finished_at=datetime.now(UTC),
                    output_file_id=made["output"],
                    error_file_id=made["error"],
                )
            )
        return batch_id, ended

    async def _result_file(
        self, conn: AsyncConnection, row: Mapping[Any, Any], part: ResultPart
    ) -> str | None:
        batch_id = str(row["id"])
        lines = result_lines(self._batches, batch_id, row["endpoint"], part=part)
        made = await self._files.create_in(
            conn,
            result_file_id(batch_id, part),
            row["tenant"],
            f"batch_{batch_id}_{part}.jsonl",
            BATCH_OUTPUT,
            lines,
            keep_empty=False,
        )
        return None if made is None else made.id


def _unended() -> Exists:
    """The batch has a job not ended (correlated with ``batches``)."""
    return exists().where(jobs.c.batch_id == batches.c.id, jobs.c.state.notin_(_TERMINAL))


async def _take_next(
    conn: AsyncConnection, status: str, oldest: ColumnElement[Any]
) -> Mapping[Any, Any] | None:
    """The next batch in ``status`` (the oldest by ``oldest``), locked for this transaction;
    one another API's round holds is passed over (SKIP LOCKED)."""
    query = (
        select(batches)
        .where(batches.c.status == status)
        .order_by(oldest)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    return (await conn.execute(query)).mappings().first()
