"""The lag monitor's SQL: in one PostgreSQL snapshot, the dispatch topic's partition ends
(from the relay's record), the accepted jobs not yet published, and per partition the jobs not
yet ended past the worker group's commit points."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sqlalchemy import (
    BigInteger,
    Integer,
    and_,
    bindparam,
    column,
    func,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from producers.lag.rule import Reading
from producers.outbox.repository import of_pool
from schemas.states import JobState
from schemas.tables import jobs, outbox, partition_ends

# A job in these states still owes its dispatch record's work (the partial index's states).
OPEN_STATES = (JobState.DISPATCHED, JobState.RUNNING)


class LagRepository:
    """Reads what PostgreSQL knows of the dispatch topic ``topic``'s lag."""

    def __init__(
        self,
        db: AsyncEngine,
        *,
        topic: str,
        partitions: int,
        count_open: bool = True,
        first: bool = True,
    ) -> None:
        """``first``: the first pool's topic (its jobs include those stored before pools)."""
        self._db = db
        self._topic = topic
        self._first = first
        self._partitions = partitions
        self._count_open = count_open

    async def reading(
        self, committed: Mapping[int, int], marker: Callable[[], int] | None = None
    ) -> Reading:
        """The reading at the commit points ``committed`` (read first: the ends and the open
        jobs read after them are at or past them). One snapshot: the relay moves rows from
        "unpublished" to the ends, and records the jobs' positions, in one transaction.
        ``marker`` is read as the snapshot begins (``Reading.mark``)."""
        async with self._db.connect() as conn:
            await conn.execution_options(isolation_level="REPEATABLE READ")
            mark = marker() if marker is not None else None
            rows = (
                await conn.execute(
                    select(partition_ends.c.partition, partition_ends.c.end_offset).where(
                        partition_ends.c.topic == self._topic
                    )
                )
            ).all()
            unpublished = (
                await conn.execute(
                    select(func.count())
                    .select_from(outbox)
                    .where(outbox.c.published_at.is_(None), outbox.c.topic == self._topic)
                )
            ).scalar_one()
            open = await self._open(conn, committed) if self._count_open else None
        ends = {p: 0 for p in range(self._partitions)} | {r[0]: int(r[1]) for r in rows}
        return Reading(ends, committed, int(unpublished), open, mark=mark)

    async def _open(self, conn: AsyncConnection, committed: Mapping[int, int]) -> dict[int, int]:
        """Per partition, the jobs not yet ended whose record of this log lies at or past the
        commit point (the open jobs are found by index: ix_jobs_state or the partial
        ix_jobs_dispatch_position)."""
        points = (
            func.unnest(
                bindparam("partitions", type_=ARRAY(Integer())),
                bindparam("offsets", type_=ARRAY(BigInteger())),
            )
            .table_valued(column("partition", Integer()), column("offset", BigInteger()))
            .render_derived(name="points")
        )
        # The states as literals, so that a prepared statement's generic plan can still use
        # the partial index (ix_jobs_dispatch_position) where the planner prefers it.
        open_states: list[ColumnElement[str]] = [
            literal_column(f"'{state.value}'") for state in OPEN_STATES
        ]
        rows = await conn.execute(
            select(jobs.c.dispatch_partition, func.count())
            .select_from(
                points.join(jobs, jobs.c.dispatch_partition == points.c.partition).join(
                    partition_ends,
                    and_(
                        partition_ends.c.topic == self._topic,
                        partition_ends.c.partition == points.c.partition,
                    ),
                )
            )
            .where(
                jobs.c.state.in_(open_states),
                of_pool(self._topic, self._first),
                jobs.c.dispatch_offset.is_not(None),
                jobs.c.dispatch_offset >= points.c.offset,
                jobs.c.dispatch_log.is_not_distinct_from(partition_ends.c.log),
            )
            .group_by(jobs.c.dispatch_partition),
            {"partitions": list(committed), "offsets": list(committed.values())},
        )
        return {int(p): int(n) for p, n in rows}
