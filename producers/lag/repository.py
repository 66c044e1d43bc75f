"""The lag monitor's SQL: in one statement (so one PostgreSQL snapshot, with no transaction
around it), the dispatch topic's partition ends (from the relay's record), the accepted jobs
not yet published, and per partition the jobs not yet ended past the worker group's commit
points. The replica that reads the lag for the others (``producers.lag.shared``) stores the
reading in the same statement (``Share``), so sharing it costs no statement of its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sqlalchemy import (
    BigInteger,
    Integer,
    ScalarSelect,
    Select,
    and_,
    column,
    func,
    literal,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

from plumbing.unit_of_work import UnitOfWork, joining
from producers.lag.rule import Reading
from producers.outbox.repository import of_pool
from schemas.states import JobState
from schemas.tables import jobs, outbox, partition_ends

# A job in these states still owes its dispatch record's work (the partial index's states).
OPEN_STATES = (JobState.DISPATCHED, JobState.RUNNING)


class Share(Protocol):
    """How a reading is stored for the other replicas in the statement that reads it."""

    def written(self, reading: CTE, committed: Mapping[int, int]) -> CTE:
        """The statement that stores ``reading`` (its columns ``ends``, ``unpublished``
        and ``open``) taken at the commit points ``committed``, returning a row if it
        wrote."""

    def done(self, wrote: bool) -> None:
        """Told whether the statement wrote the reading."""


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
        work: UnitOfWork | None = None,
    ) -> None:
        """``first``: the first pool's topic (its jobs include those stored before pools);
        ``work``: the reading joins the next submit's transaction when one comes."""
        self._db = db
        self._work = work
        self._topic = topic
        self._first = first
        self._partitions = partitions
        self._count_open = count_open

    async def reading(
        self,
        committed: Mapping[int, int],
        tally: Callable[[], int] | None = None,
        share: Share | None = None,
    ) -> Reading:
        """The reading at the commit points ``committed`` (read first: the ends and the open
        jobs read after them are at or past them). One statement, so one snapshot: the relay
        moves rows from "unpublished" to the ends, and records the jobs' positions, in one
        transaction. ``tally`` is read before the statement (``Reading.tally``); with
        ``share``, the statement also stores the reading for the other replicas."""
        # Every partition, 0 where the relay recorded no end yet (as a follower shows it).
        zeros = literal({str(p): 0 for p in range(self._partitions)}, JSONB())
        ends = (
            select(
                zeros.op("||")(
                    func.coalesce(
                        func.jsonb_object_agg(
                            partition_ends.c.partition, partition_ends.c.end_offset
                        ),
                        literal_column("'{}'::jsonb"),
                    )
                )
            )
            .where(partition_ends.c.topic == self._topic)
            .scalar_subquery()
        )
        unpublished = (
            select(func.count())
            .select_from(outbox)
            .where(outbox.c.published_at.is_(None), outbox.c.topic == self._topic)
            .scalar_subquery()
        )
        open_jobs = self._open(committed) if self._count_open else literal(None, JSONB())
        query = select(
            ends.label("ends"), unpublished.label("unpublished"), open_jobs.label("open")
        )
        if share is not None:
            query = _shared(query, share, committed)

        async def read(conn: AsyncConnection) -> tuple[int | None, Any]:
            taken = tally() if tally is not None else None  # as its snapshot begins
            return taken, (await conn.execute(query)).one()

        taken, row = await joining(self._work, self._db, read)
        if share is not None:
            share.done(bool(row.wrote))
        ends_of = {int(p): int(n) for p, n in row.ends.items()}
        opened = {int(p): int(n) for p, n in row.open.items()} if self._count_open else None
        return Reading(ends_of, committed, int(row.unpublished), opened, tally=taken)

    def _open(self, committed: Mapping[int, int]) -> ScalarSelect[Any]:
        """Per partition, the jobs not yet ended whose record (in the cluster of the recorded
        end) lies at or past the commit point, as one JSON object (the open jobs are found by
        index: ix_jobs_state or the partial ix_jobs_dispatch_position)."""
        points = (
            func.unnest(
                literal(list(committed), ARRAY(Integer())),
                literal(list(committed.values()), ARRAY(BigInteger())),
            )
            .table_valued(column("partition", Integer()), column("offset", BigInteger()))
            .render_derived(name="points")
        )
        # The states as literals, so that a prepared statement's generic plan can still use
        # the partial index (ix_jobs_dispatch_position) where the planner prefers it.
        open_states: list[ColumnElement[str]] = [
            literal_column(f"'{state.value}'") for state in OPEN_STATES
        ]
        counts = (
            select(jobs.c.dispatch_partition.label("partition"), func.count().label("n"))
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
                jobs.c.dispatch_cluster_id.is_not_distinct_from(partition_ends.c.cluster_id),
            )
            .group_by(jobs.c.dispatch_partition)
            .subquery("open_counts")
        )
        return select(
            func.coalesce(
                func.jsonb_object_agg(counts.c.partition, counts.c.n),
                literal_column("'{}'::jsonb"),
            )
        ).scalar_subquery()


def _shared(query: Select[Any], share: Share, committed: Mapping[int, int]) -> Select[Any]:
    """``query``'s one row, and whether ``share`` stored it (``wrote``), in one statement:
    the reading is a CTE that both read (so it is evaluated once)."""
    reading = query.cte("reading")
    written = share.written(reading, committed)
    wrote = select(func.count()).select_from(written).scalar_subquery()
    return select(reading.c.ends, reading.c.unpublished, reading.c.open, wrote.label("wrote"))
