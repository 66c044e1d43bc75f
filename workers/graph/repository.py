"""The SQL of a document's graph on the worker side: the graph written in place of the
document's own run, a child's end with its count, and the step the last end of a level
triggers (the next level's reduces with their dispatch records, or the document's end with
its one event). Every writer locks the document's row first (``plumbing.graph_store``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.db import transaction
from plumbing.lock_store import end_children
from schemas import reasons
from schemas.envelopes import DispatchEnvelope
from schemas.jobs import JobKind, Priority, estimate_tokens, reduce_levels
from schemas.states import JobState
from schemas.tables import graphs, jobs, outbox
from workers.gate import event_row
from workers.graph.ids import new_id, partition_of
from workers.graph.part_store import Counted, GraphChild, usage_of
from workers.graph.plan import SEPARATOR, Plan, group

# What a graph's writer reads of its document: never its input (up to 4 MiB) or result.
_DOCUMENT = (
    jobs.c.id,
    jobs.c.tenant,
    jobs.c.priority,
    jobs.c.max_tokens,
    jobs.c.deadline,
    jobs.c.params,
    jobs.c.dispatch_topic,
    jobs.c.callback_url,
    jobs.c.batch_id,
    jobs.c.attempt,
)
ROWS_A_STATEMENT = 1000  # a part's row has 16 columns


class GraphWriter:
    """Writes graphs and their steps for one worker (its events and dispatch topics)."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        events_topic: str,
        dispatch_topic: str,
        partitions: int = 0,
    ) -> None:
        """``partitions``: the dispatch topic's, over which a level's parts are spread in
        turn (``workers.graph.ids``); 0: left to their ids' hashes."""
        self._engine = engine
        self._partitions = partitions
        self._events_topic = events_topic
        self._dispatch_topic = dispatch_topic  # the pool's, for documents stored before pools

    async def make(self, job_id: str, attempt: int, plan: Plan, level_s: float) -> bool:
        """The document's graph in place of its run (``create``), in one transaction;
        False when this attempt no longer owns the job."""
        async with transaction(self._engine) as conn:
            return await self.create(
                conn,
                job_id=job_id,
                attempt=attempt,
                chunks=plan.chunks,
                budget_tokens=plan.budget_tokens,
                fan_in=plan.fan_in,
                level_s=level_s,
                now=datetime.now(UTC),
            )

    async def create(
        self,
        conn: AsyncConnection,
        *,
        job_id: str,
        attempt: int,
        chunks: Sequence[str],
        budget_tokens: int,
        fan_in: int,
        level_s: float,
        now: datetime,
    ) -> bool:
        """The document's graph in place of its run, if this attempt still owns it: its
        row, its chunks and their dispatch records. False when it was taken over, cancelled
        or graphed meanwhile (nothing written)."""
        parent = (
            (
                await conn.execute(
                    update(jobs)
                    .where(
                        jobs.c.id == job_id,
                        jobs.c.state == JobState.RUNNING.value,
                        jobs.c.attempt == attempt,
                        ~select(graphs.c.job_id).where(graphs.c.job_id == job_id).exists(),
                    )
                    .values(updated_at=now)
                    .returning(*_DOCUMENT)
                )
            )
            .mappings()
            .first()
        )
        if parent is None:
            return False
        levels = 1 + reduce_levels(len(chunks), fan_in)
        await conn.execute(
            insert(graphs).values(
                job_id=job_id,
                chunks=len(chunks),
                level=0,
                total=len(chunks),
                levels=levels,
                fan_in=fan_in,
                budget_tokens=budget_tokens,
                level_s=level_s,
                created_at=now,
                updated_at=now,
            )
        )
        deadline = parent["deadline"] - timedelta(seconds=level_s * (levels - 1))
        await self._children(conn, parent, 0, list(chunks), deadline, now)
        return True

    async def _children(
        self,
        conn: AsyncConnection,
        parent: Mapping[Any, Any],
        level: int,
        inputs: list[str],
        deadline: datetime,
        now: datetime,
    ) -> None:
        """A level's jobs with their dispatch records (the relay publishes them)."""
        topic = parent["dispatch_topic"] or self._dispatch_topic
        rows = []
        records = []
        first = partition_of(str(parent["id"]), self._partitions) if self._partitions else 0
        for seq, text_ in enumerate(inputs):
            child_id = new_id(first + seq, self._partitions)
            rows.append(
                {
                    "id": child_id,
                    "tenant": parent["tenant"],
                    "kind": JobKind.SUMMARIZE.value,
                    "state": JobState.QUEUED.value,
                    "priority": parent["priority"],
                    "input": text_,
                    "max_tokens": parent["max_tokens"],
                    "deadline": deadline,
                    "params": parent["params"],
                    "dispatch_topic": topic,
                    "parent_id": parent["id"],
                    "level": level,
                    "seq": seq,
                    "created_at": now,
                    "updated_at": now,
                    "last_seen_at": now,
                }
            )
            envelope = DispatchEnvelope(
                job_id=child_id,
                tenant=parent["tenant"],
                kind=JobKind.SUMMARIZE,
                priority=Priority(parent["priority"]),
                max_tokens=parent["max_tokens"],
                prompt_tokens=estimate_tokens(text_),
                deadline=deadline.astimezone(UTC),
            )
            records.append(envelope.outbox_row(topic, child_id))
        # One multi-row statement each (a list of rows would be one statement a row),
        # in slices under the protocol's 32,767 parameters.
        for start in range(0, len(rows), ROWS_A_STATEMENT):
            await conn.execute(insert(jobs).values(rows[start : start + ROWS_A_STATEMENT]))
            await conn.execute(insert(outbox).values(records[start : start + ROWS_A_STATEMENT]))

    async def after_end(
        self,
        conn: AsyncConnection,
        child: GraphChild,
        counted: Counted,
        state: JobState,
        error: dict[str, Any] | None,
        now: datetime,
    ) -> None:
        """The step a written child's end triggers: a failure (or a drop) ends the document
        and every job of it at once; the last success of a level makes the next level, or
        ends the document with the one summary left."""
        if not counted.written:
            return
        if state is not JobState.SUCCEEDED:
            await self.end_document(conn, child.parent_id, state, document_error(state, error), now)
        elif counted.last:
            await self._next_level(conn, child, now)

    async def end_document(
        self,
        conn: AsyncConnection,
        parent_id: str,
        state: JobState,
        error: dict[str, Any] | None,
        now: datetime,
        result: dict[str, Any] | None = None,
    ) -> bool:
        """The document's end, with its event, and its jobs not ended yet ended with it;
        False when it had ended already."""
        usage = select(graphs.c.output_tokens).where(graphs.c.job_id == parent_id)
        row = (
            (
                await conn.execute(
                    update(jobs)
                    .where(jobs.c.id == parent_id, jobs.c.state == JobState.RUNNING.value)
                    .values(
                        state=state.value,
                        result=result,
                        error=error,
                        decoded_tokens=usage.scalar_subquery(),
                        finished_at=now,
                        updated_at=now,
                    )
                    .returning(*_DOCUMENT)
                )
            )
            .mappings()
            .first()
        )
        if row is None:
            return False
        await conn.execute(
            insert(outbox).values(
                event_row(self._events_topic, row, state, row["attempt"], now, error or {})
            )
        )
        if state is not JobState.SUCCEEDED:
            await end_children(conn, [parent_id], _siblings_state(state), now)
        return True

    async def abandon_lapsed(
        self, conn: AsyncConnection, documents: Sequence[str], now: datetime
    ) -> None:
        """Of ``documents``, those whose caller stopped polling for longer than their
        lease, abandoned with every part (a row another transaction holds is skipped and
        looked at next time)."""
        lapsed = (
            select(jobs.c.id)
            .where(
                jobs.c.id.in_(documents),
                jobs.c.state == JobState.RUNNING.value,
                jobs.c.abandon_after_s.is_not(None),
                jobs.c.last_seen_at
                < func.now() - jobs.c.abandon_after_s * text("interval '1 second'"),
            )
            .order_by(jobs.c.id)
            .with_for_update(skip_locked=True)
        )
        error = reasons.error(JobState.ABANDONED, reasons.HEARTBEAT_LAPSED, "decode")
        for document in (await conn.execute(lapsed)).scalars().all():
            await self.end_document(conn, str(document), JobState.ABANDONED, error, now)

    async def _next_level(self, conn: AsyncConnection, child: GraphChild, now: datetime) -> None:
        graph = (
            (await conn.execute(select(graphs).where(graphs.c.job_id == child.parent_id)))
            .mappings()
            .one()
        )
        done = (
            (
                await conn.execute(
                    select(jobs.c.result)
                    .where(jobs.c.parent_id == child.parent_id, jobs.c.level == child.level)
                    .order_by(jobs.c.seq)
                )
            )
            .scalars()
            .all()
        )
        if len(done) == 1:
            await self.end_document(
                conn, child.parent_id, JobState.SUCCEEDED, None, now, _final(done[0], graph)
            )
            return
        runs = group([usage_of(r)[1] for r in done], graph["budget_tokens"], graph["fan_in"])
        inputs = [SEPARATOR.join(str(done[i]["text"]).strip() for i in run) for run in runs]
        parent = (
            (await conn.execute(select(*_DOCUMENT).where(jobs.c.id == child.parent_id)))
            .mappings()
            .one()
        )
        left = reduce_levels(len(inputs), graph["fan_in"])
        deadline = parent["deadline"] - timedelta(seconds=graph["level_s"] * left)
        await conn.execute(
            update(graphs)
            .where(graphs.c.job_id == child.parent_id)
            .values(level=child.level + 1, total=len(inputs), ended=0, updated_at=now)
        )
        await self._children(conn, parent, child.level + 1, inputs, deadline, now)


def _final(last: Mapping[str, Any], graph: Mapping[Any, Any]) -> dict[str, Any]:
    """The document's result: the last summary, with the usage of the whole graph."""
    result = dict(last)
    result["prompt_tokens"] = int(graph["prompt_tokens"])
    result["output_tokens"] = int(graph["output_tokens"])
    result["graph"] = {"chunks": int(graph["chunks"]), "levels": int(graph["level"]) + 1}
    return result


def document_error(state: JobState, error: Mapping[str, Any] | None) -> dict[str, Any]:
    body = dict(error or {"code": state.value})
    body["message"] = f"a part of the document ended {state.value}: {body.get('message', '')}"
    return body


def _siblings_state(state: JobState) -> JobState:
    """How the document's other jobs end: as it did, or cancelled when a part failed."""
    return JobState.CANCELLED if state in (JobState.FAILED, JobState.SUCCEEDED) else state


# A document already graphed is not run again when its record comes back.
