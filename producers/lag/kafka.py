"""The lag monitor's reader: the worker group's committed offsets from the broker, then the rest
of the reading from PostgreSQL (``LagRepository``).

With an ``Activity`` (the process's LISTEN connection on the outbox and jobs channels), a
reading whose PostgreSQL part cannot have changed reuses it instead of asking again: the last
one counted no unpublished job, the commit points are the same, and nothing was heard since
its statement began (no outbox row written, no job ended, no reconnect). Then no job can
have been published or dispatched (the relay publishes only unpublished rows), none can have
ended, and the ends only move with a publish: the statement would return what it returned.
It is asked again anyway every ``QUIET_S``, and the reused reading keeps the tally of the
statement it came from, so that what this process admitted since counts as unseen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from aiokafka.errors import KafkaError
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.activity import QUIET_S, Activity
from plumbing.unit_of_work import UnitOfWork
from producers.lag.group_reader import GroupReader
from producers.lag.repository import LagRepository, Share
from producers.lag.rule import Reading


@dataclass(frozen=True)
class _Settled:
    """A reading with nothing unpublished, and the activity's version as it was taken."""

    reading: Reading
    version: int
    at: float  # time.monotonic() as its statement began


class KafkaLagSource:
    """Committed offsets from the broker (``GroupReader``: the admin API), then in one
    PostgreSQL snapshot: the ends from the relay's record, the unpublished jobs and
    (``count_open``) the jobs not yet ended past the commit points."""

    def __init__(
        self,
        *,
        db: AsyncEngine,
        bootstrap: str,
        topic: str,
        group_id: str,
        partitions: int,
        count_open: bool = True,
        first: bool = True,
        activity: Activity | None = None,
        work: UnitOfWork | None = None,
    ) -> None:
        """``activity``: what this process hears (None: PostgreSQL is read every time);
        ``work``: PostgreSQL's part joins the next submit's transaction."""
        self._topic = topic
        self._partitions = partitions
        self._reader = GroupReader(bootstrap, group_id)
        self._repository = LagRepository(
            db,
            topic=topic,
            partitions=partitions,
            count_open=count_open,
            first=first,
            work=work,
        )
        self._activity = activity
        self._settled: _Settled | None = None
        self.pg_reads = 0  # readings that asked PostgreSQL

    async def read(
        self, tally: Callable[[], int] | None = None, share: Share | None = None
    ) -> Reading:
        """``tally`` is read as the PostgreSQL snapshot begins (``Reading.tally``); ``share``
        stores the reading in the same statement, when one runs (``pg_reads`` grows)."""
        # The commit points first: the ends and the open jobs read after them are at or
        # past them.
        committed = await self.committed()
        reused = self._reuse(committed)
        if reused is not None:
            return reused
        version = self._activity.version if self._activity is not None else 0
        began = time.monotonic()
        reading = await self._repository.reading(committed, tally, share)
        self.pg_reads += 1
        settled = self._activity is not None and reading.unpublished == 0
        self._settled = _Settled(reading, version, began) if settled else None
        return reading

    def _reuse(self, committed: dict[int, int]) -> Reading | None:
        """The last reading again, where PostgreSQL's part of it cannot have changed."""
        last = self._settled
        if last is None or self._activity is None:
            return None
        if not self._activity.quiet_since(last.version) or time.monotonic() - last.at > QUIET_S:
            return None
        if dict(last.reading.committed) != committed:
            return None
        return replace(last.reading, age_s=0.0)

    async def committed(self) -> dict[int, int]:
        """The worker group's committed offset per partition (0 where none)."""
        try:
            return await self._reader.committed(self._topic, self._partitions)
        except (KafkaError, OSError):
            await self.close()
            raise

    async def close(self) -> None:
        await self._reader.close()
