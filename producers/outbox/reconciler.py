"""The reconciler: finds jobs whose dispatch record is gone and dispatches them again.

The relay records where the broker put each job's newest dispatch record: the log (the
broker cluster's id), the partition and the offset. Every ``reconcile_interval_s`` the
reconciler reads the broker's view of the dispatch topic (cluster id; first, end and
worker-group committed offset per partition) and takes a record for gone when

- it was written to another log (the cluster id changed: a broker that lost its data),
- it lies before the partition's first offset (retention deleted it unread),
- it lies at or past the partition's end (the log was truncated or recreated; only on a
  broker whose end offsets are exact, ``kafka_exact_end_offsets``), or
- the job has not started although the worker group committed past its record (a record
  the group consumed without running the job).

A ``dispatched`` job whose record is gone gets a new one at once; a ``running`` job only
once its attempt has run ``reconcile_running_after_s`` (its worker may still be decoding; a
new record makes a new attempt that fences the old one). A job is judged gone only if both
the view read before the database query and the one read after it say so, so a record
published meanwhile is never mistaken for a lost one. The new dispatch record goes through
the outbox like any other, conditional on the position still being the one judged.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from sqlalchemy import and_, or_, select, tuple_
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from producers.metrics import RECONCILED
from producers.outbox.repository import OutboxStore, redispatch
from schemas.states import JobState
from schemas.tables import jobs
from sluicegate.aio import wait_first
from sluicegate.kafka import GroupReader, cluster_id
from sluicegate.settings import Settings

log = logging.getLogger(__name__)

CHUNK = 1000


@dataclass(frozen=True, kw_only=True)
class LogView:
    """The broker's dispatch topic as the reconciler saw it."""

    log: str | None
    first: dict[int, int]
    end: dict[int, int]
    exact_end: bool  # False: the end may trail the last record (Tansu)
    committed: dict[int, int]

    def gone(self, position: tuple[str | None, int, int], *, started: bool) -> bool:
        """Whether the record at ``position`` (log, partition, offset) is gone."""
        record_log, partition, offset = position
        if record_log != self.log or offset < self.first.get(partition, 0):
            return True
        if self.exact_end and offset >= self.end.get(partition, 0):
            return True
        return not started and offset < self.committed.get(partition, 0)


class LogReader:
    """Reads a LogView with a consumer that has the worker group's id and never joins it."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._reader = GroupReader(settings.require_kafka(), settings.consumer_group)

    async def read(self) -> LogView:
        s = self._settings
        consumer = await self._reader.consumer()
        parts = [TopicPartition(s.dispatch_topic, p) for p in range(s.partitions)]
        try:
            found = await cluster_id(s.require_kafka())
            first = await consumer.beginning_offsets(parts)
            end = await consumer.end_offsets(parts)
            committed = {tp.partition: (await consumer.committed(tp)) or 0 for tp in parts}
        except (KafkaError, OSError):
            await self.close()
            raise
        return LogView(
            log=found,
            first={tp.partition: o for tp, o in first.items()},
            end={tp.partition: o for tp, o in end.items()},
            exact_end=s.kafka_exact_end_offsets,
            committed=committed,
        )

    async def close(self) -> None:
        await self._reader.close()


class Reconciler:
    def __init__(self, settings: Settings, db: AsyncEngine, reader: LogReader) -> None:
        self._settings = settings
        self._db = db
        self._reader = reader
        self._store = OutboxStore(db, dispatch_topic=settings.dispatch_topic)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    await self.once()
                except (KafkaError, OSError, TimeoutError, DBAPIError) as exc:
                    log.warning("reconciler: cannot reconcile now: %r", exc)
                await wait_first(stop, limit_s=self._settings.reconcile_interval_s)
        finally:
            await self._reader.close()

    async def once(self) -> int:
        """One pass; returns how many jobs were dispatched again."""
        async with asyncio.timeout(max(self._settings.reconcile_interval_s, 30.0)):
            before = await self._reader.read()
            await self._fix_ends(before)
            suspects = await self._suspects(before)
            if not suspects:
                return 0
            after = await self._reader.read()
        lost = [
            (job_id, position)
            for job_id, (position, started) in suspects.items()
            if after.gone(position, started=started)
        ]
        done = 0
        for start in range(0, len(lost), CHUNK):
            chunk = lost[start : start + CHUNK]
            async with self._db.begin() as conn:
                ids = await redispatch(
                    conn,
                    self._settings.dispatch_topic,
                    or_(
                        *(
                            and_(
                                jobs.c.id == job_id,
                                tuple_(
                                    jobs.c.dispatch_log,
                                    jobs.c.dispatch_partition,
                                    jobs.c.dispatch_offset,
                                )
                                == position,
                            )
                            for job_id, position in chunk
                        )
                    ),
                )
            done += len(ids)
        if done:
            RECONCILED.inc(done)
            log.warning("reconciler: %d jobs had lost their dispatch record; sent again", done)
        return done

    async def _suspects(self, view: LogView) -> dict[str, tuple[tuple[str | None, int, int], bool]]:
        """Jobs whose record ``view`` takes for gone: id → (position, started)."""
        s = self._settings
        old_enough = datetime.now(UTC) - timedelta(seconds=s.reconcile_running_after_s)
        per_partition = []
        for p in range(s.partitions):
            # Offsets that cannot be in the log: before its first, at or past its end, and
            # (not started only) before the group's commit point.
            out_of_log = [jobs.c.dispatch_offset < view.first.get(p, 0)]
            if view.exact_end:
                out_of_log.append(jobs.c.dispatch_offset >= view.end.get(p, 0))
            skipped = and_(
                jobs.c.state == JobState.DISPATCHED.value,
                jobs.c.dispatch_offset < view.committed.get(p, 0),
            )
            per_partition.append(and_(jobs.c.dispatch_partition == p, or_(*out_of_log, skipped)))
        gone = or_(
            jobs.c.dispatch_log.is_distinct_from(view.log),
            *per_partition,
        )
        startable = or_(
            jobs.c.state == JobState.DISPATCHED.value,
            and_(jobs.c.state == JobState.RUNNING.value, jobs.c.started_at < old_enough),
        )
        async with self._db.connect() as conn:
            rows = (
                await conn.execute(
                    select(
                        jobs.c.id,
                        jobs.c.state,
                        jobs.c.dispatch_log,
                        jobs.c.dispatch_partition,
                        jobs.c.dispatch_offset,
                    ).where(
                        jobs.c.state.in_([JobState.DISPATCHED.value, JobState.RUNNING.value]),
                        jobs.c.dispatch_offset.is_not(None),
                        startable,
                        gone,
                    )
                )
            ).all()
        return {
            str(r.id): (
                (r.dispatch_log, r.dispatch_partition, r.dispatch_offset),
                r.state == JobState.RUNNING.value,
            )
            for r in rows
        }

    async def _fix_ends(self, view: LogView) -> None:
        """Recorded partition ends of another log would keep the lag huge (the new log's
        commit points start again at zero): replace them with this log's."""
        if view.log is None:
            return
        void = await self._store.reset_ends(view.log, view.end)
        if void:
            log.warning("reconciler: the broker's log is new (%s); partition ends reset", view.log)
