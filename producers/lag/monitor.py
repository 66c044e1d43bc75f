"""The lag monitor: how far the worker group is behind on the dispatch topic, and how fast
it drains.

Consumer lag = Σ over partitions (end offset - committed offset of the worker group). Ends
come from the relay's acknowledged sends (exact: it is the only writer); committed offsets from
the broker. A worker runs many jobs of a partition at once and commits only up to its oldest
unfinished one (invariant 5), so the consumer lag also counts records whose jobs have already
ended. With ``lag_measure = "open"`` (the default) the lag is instead the records past the
committed offset whose job has not ended: PostgreSQL knows, since the relay records each
job's dispatch position. Either way, accepted jobs the relay has not published yet are added
(they are backlog too).

The drain rate μ is the records leaving that lag per second, the arrival rate λ is from
end-offset movement, both smoothed. A reading older than ``stale_after_s`` is "unknown".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
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
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from producers.metrics import ARRIVAL_RATE, CONSUMER_LAG, DRAIN_RATE, LAG, LAG_KNOWN
from schemas.states import JobState
from schemas.tables import jobs, outbox, partition_ends
from sluicegate.aio import wait_first
from sluicegate.kafka import GroupReader

log = logging.getLogger(__name__)

Clock = Callable[[], float]
# A job in these states still owes its dispatch record's work (the partial index's states).
OPEN_STATES = (JobState.DISPATCHED, JobState.RUNNING)


@dataclass(frozen=True, kw_only=True)
class LagSnapshot:
    known: bool
    lag: int
    per_partition: Mapping[int, int]
    drain_rate: float | None  # μ, records/s; None until measured
    arrival_rate: float | None  # λ, records/s
    age_s: float
    # Why the last reading failed: "database_unavailable" or "broker_unavailable".
    cause: str | None = None
    # Seconds for which there was a backlog and nothing left it (0 while it moves or is
    # empty): a long stall with no job running means no worker consumes.
    stalled_s: float = 0.0

    def drain_time_s(self, records: int) -> float | None:
        """Seconds to drain ``records`` at μ; None when μ is unknown or zero."""
        if records <= 0:
            return 0.0
        if not self.drain_rate:
            return None
        return records / self.drain_rate


UNKNOWN = LagSnapshot(
    known=False, lag=0, per_partition={}, drain_rate=None, arrival_rate=None, age_s=float("inf")
)


@dataclass(frozen=True)
class Reading:
    ends: Mapping[int, int]  # end offset per partition
    committed: Mapping[int, int]  # the group's committed offset per partition
    unpublished: int = 0  # accepted jobs not yet published
    # Per partition, the records past the committed offset whose job has not ended; None:
    # not read, the lag is the consumer lag.
    open: Mapping[int, int] | None = None


class LagSource(Protocol):
    async def read(self) -> Reading: ...


class LagMonitor:
    def __init__(
        self,
        source: LagSource,
        *,
        interval_s: float,
        stale_after_s: float,
        smoothing: float = 0.3,
        clock: Clock = time.monotonic,
    ) -> None:
        self._source = source
        self._interval_s = interval_s
        self._stale_after_s = stale_after_s
        self._alpha = smoothing
        self._clock = clock
        self._ends: dict[int, int] = {}
        self._read_at: float | None = None
        self._mu: float | None = None
        self._lambda: float | None = None
        self._updated = asyncio.Event()
        self._cause: str | None = None
        self._unpublished = 0
        self._per_partition: dict[int, int] = {}
        self._total = 0
        self._moved_at: float | None = None  # the last reading with no backlog or a drain
        # Called as a reading starts; its value is kept as ``mark`` once the reading lands,
        # so that a caller can count what it did after the reading began.
        self.marker: Callable[[], int] = lambda: 0
        self.mark = 0

    def update(
        self,
        ends: Mapping[int, int],
        committed: Mapping[int, int],
        unpublished: int = 0,
        open: Mapping[int, int] | None = None,
    ) -> None:
        """Take a new reading (the loop calls this; tests call it directly)."""
        now = self._clock()
        consumer = self._lag(ends, committed)
        per_partition = (
            consumer
            if open is None
            else {p: min(records, open.get(p, 0)) for p, records in consumer.items()}
        )
        if self._read_at is not None and now > self._read_at:
            dt = now - self._read_at
            arrived = sum(ends.values()) - sum(self._ends.values())
            backlog = sum(self._per_partition.values())
            # What left the lag: records that arrived, less the lag's growth.
            drained = arrived - (sum(per_partition.values()) - backlog)
            # An idle group drains nothing because nothing is there: that is no measurement.
            if drained > 0 or backlog > 0:
                self._mu = self._smooth(self._mu, max(drained, 0) / dt)
            self._lambda = self._smooth(self._lambda, max(arrived, 0) / dt)
            if drained > 0:
                self._moved_at = now
        if self._moved_at is None or not any(per_partition.values()):
            self._moved_at = now
        self._ends, self._read_at = dict(ends), now
        self._unpublished = unpublished
        self._per_partition = per_partition
        self._total = sum(per_partition.values()) + unpublished
        self._cause = None
        snapshot = self.snapshot()
        CONSUMER_LAG.set(sum(consumer.values()))
        LAG.set(snapshot.lag)
        LAG_KNOWN.set(1)
        DRAIN_RATE.set(snapshot.drain_rate or 0.0)
        ARRIVAL_RATE.set(snapshot.arrival_rate or 0.0)
        self._updated.set()
        self._updated = asyncio.Event()

    def _smooth(self, previous: float | None, sample: float) -> float:
        return sample if previous is None else previous + self._alpha * (sample - previous)

    @staticmethod
    def _lag(ends: Mapping[int, int], committed: Mapping[int, int]) -> dict[int, int]:
        return {p: max(end - committed.get(p, 0), 0) for p, end in ends.items()}

    def snapshot(self) -> LagSnapshot:
        if self._read_at is None:
            return replace(UNKNOWN, cause=self._cause)
        age = self._clock() - self._read_at
        return LagSnapshot(  # O(1): the sums are made once per reading, in update()
            known=age <= self._stale_after_s,
            lag=self._total,
            per_partition=self._per_partition,
            drain_rate=self._mu,
            arrival_rate=self._lambda,
            age_s=age,
            cause=self._cause,
            stalled_s=0.0 if self._moved_at is None else self._read_at - self._moved_at,
        )

    async def next_update(self, limit_s: float | None = None) -> None:
        """Wait for the next reading (or ``limit_s``)."""
        await wait_first(self._updated, limit_s=limit_s)

    async def refresh(self) -> bool:
        """One reading; False (and the old reading ages) when the lag cannot be read."""
        mark = self.marker()
        try:
            async with asyncio.timeout(self._stale_after_s):
                reading = await self._source.read()
        except (KafkaError, OSError, TimeoutError, DBAPIError) as exc:
            log.warning("lag monitor: cannot read lag: %r", exc)
            database = isinstance(exc, DBAPIError | OSError) and not isinstance(exc, KafkaError)
            self._cause = "database_unavailable" if database else "broker_unavailable"
            LAG_KNOWN.set(1 if self.snapshot().known else 0)
            return False
        self.update(reading.ends, reading.committed, reading.unpublished, reading.open)
        self.mark = mark
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.refresh()
            await wait_first(stop, limit_s=self._interval_s)


class KafkaLagSource:
    """Committed offsets from the broker (a consumer with the group id and ``committed()``; it
    never joins the group), then in one PostgreSQL snapshot: the ends from the relay's record,
    the unpublished jobs and (``count_open``) the jobs not yet ended past the commit points."""

    def __init__(
        self,
        *,
        db: AsyncEngine,
        bootstrap: str,
        topic: str,
        group_id: str,
        partitions: int,
        count_open: bool = True,
    ) -> None:
        self._db = db
        self._topic = topic
        self._partitions = partitions
        self._count_open = count_open
        self._reader = GroupReader(bootstrap, group_id)

    async def read(self) -> Reading:
        # The commit points first: the ends and the open jobs read after them are at or
        # past them.
        consumer = await self._reader.consumer()
        committed: dict[int, int] = {}
        try:
            for partition in range(self._partitions):
                offset = await consumer.committed(TopicPartition(self._topic, partition))
                committed[partition] = offset or 0
        except (KafkaError, OSError):
            await self.close()
            raise
        # One snapshot for the rest: the relay moves rows from "unpublished" to the ends, and
        # records the jobs' positions, in one transaction.
        async with self._db.connect() as conn:
            await conn.execution_options(isolation_level="REPEATABLE READ")
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
        return Reading(ends, committed, int(unpublished), open)

    async def _open(self, conn: AsyncConnection, committed: dict[int, int]) -> dict[int, int]:
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
                jobs.c.dispatch_offset.is_not(None),
                jobs.c.dispatch_offset >= points.c.offset,
                jobs.c.dispatch_log.is_not_distinct_from(partition_ends.c.log),
            )
            .group_by(jobs.c.dispatch_partition),
            {"partitions": list(committed), "offsets": list(committed.values())},
        )
        return {int(p): int(n) for p, n in rows}

    async def close(self) -> None:
        await self._reader.close()
