"""The lag monitor: how far the worker group is behind on the dispatch topic, and how fast
it drains.

Lag = Σ over partitions (end offset - committed offset of the worker group), plus accepted jobs
the relay has not published yet (they are backlog too). Ends come from
the relay's acknowledged sends (exact: it is the only writer); committed offsets from the
broker. The drain rate μ is measured from committed-offset movement, the arrival rate λ from
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
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from producers.metrics import ARRIVAL_RATE, DRAIN_RATE, LAG, LAG_KNOWN
from schemas.tables import outbox, partition_ends
from sluicegate.aio import wait_first
from sluicegate.kafka import GroupReader

log = logging.getLogger(__name__)

Clock = Callable[[], float]


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


class LagSource(Protocol):
    async def read(self) -> tuple[dict[int, int], dict[int, int], int]:
        """(end offset, committed offset) per partition, and accepted jobs not yet published."""
        ...


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
        self._committed: dict[int, int] = {}
        self._read_at: float | None = None
        self._mu: float | None = None
        self._lambda: float | None = None
        self._updated = asyncio.Event()
        self._cause: str | None = None
        self._unpublished = 0
        self._per_partition: dict[int, int] = {}
        self._total = 0
        # Called as a reading starts; its value is kept as ``mark`` once the reading lands,
        # so that a caller can count what it did after the reading began.
        self.marker: Callable[[], int] = lambda: 0
        self.mark = 0

    def update(
        self, ends: Mapping[int, int], committed: Mapping[int, int], unpublished: int = 0
    ) -> None:
        """Take a new reading (the loop calls this; tests call it directly)."""
        now = self._clock()
        if self._read_at is not None and now > self._read_at:
            dt = now - self._read_at
            drained = sum(committed.values()) - sum(self._committed.values())
            arrived = sum(ends.values()) - sum(self._ends.values())
            backlog = sum(self._lag(self._ends, self._committed).values())
            # An idle group drains nothing because nothing is there: that is no measurement.
            if drained > 0 or backlog > 0:
                self._mu = self._smooth(self._mu, max(drained, 0) / dt)
            self._lambda = self._smooth(self._lambda, max(arrived, 0) / dt)
        self._ends, self._committed, self._read_at = dict(ends), dict(committed), now
        self._unpublished = unpublished
        self._per_partition = self._lag(self._ends, self._committed)
        self._total = sum(self._per_partition.values()) + unpublished
        self._cause = None
        snapshot = self.snapshot()
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
        )

    async def next_update(self, limit_s: float | None = None) -> None:
        """Wait for the next reading (or ``limit_s``)."""
        await wait_first(self._updated, limit_s=limit_s)

    async def refresh(self) -> bool:
        """One reading; False (and the old reading ages) when the lag cannot be read."""
        mark = self.marker()
        try:
            async with asyncio.timeout(self._stale_after_s):
                ends, committed, unpublished = await self._source.read()
        except (KafkaError, OSError, TimeoutError, DBAPIError) as exc:
            log.warning("lag monitor: cannot read lag: %r", exc)
            database = isinstance(exc, DBAPIError | OSError) and not isinstance(exc, KafkaError)
            self._cause = "database_unavailable" if database else "broker_unavailable"
            LAG_KNOWN.set(1 if self.snapshot().known else 0)
            return False
        self.update(ends, committed, unpublished)
        self.mark = mark
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.refresh()
            await wait_first(stop, limit_s=self._interval_s)


class KafkaLagSource:
    """Ends from the relay's record in PostgreSQL, committed offsets from the broker (a
    consumer with the group id and ``committed()``; it never joins the group)."""

    def __init__(
        self, *, db: AsyncEngine, bootstrap: str, topic: str, group_id: str, partitions: int
    ) -> None:
        self._db = db
        self._topic = topic
        self._partitions = partitions
        self._reader = GroupReader(bootstrap, group_id)

    async def read(self) -> tuple[dict[int, int], dict[int, int], int]:
        # One snapshot for both queries: the relay moves rows from "unpublished" to the ends
        # in one transaction, and reading the two apart could miss them in both.
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
        ends = {p: 0 for p in range(self._partitions)} | {r[0]: int(r[1]) for r in rows}
        consumer = await self._reader.consumer()
        committed: dict[int, int] = {}
        try:
            for partition in ends:
                offset = await consumer.committed(TopicPartition(self._topic, partition))
                committed[partition] = offset or 0
        except (KafkaError, OSError):
            await self.close()
            raise
        return ends, committed, int(unpublished)

    async def close(self) -> None:
        await self._reader.close()
