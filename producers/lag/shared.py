"""One lag reader per replica set: the API replica holding the reader's advisory lock reads
the worker group's lag (``KafkaLagSource``: the broker's committed offsets, the rest from
PostgreSQL) and stores each reading in ``lag_readings``; every other replica reads that row
instead of the broker. A reader that dies drops its session and with it the lock, and the
next replica to try takes it over at its next interval; one whose broker read fails lets
the lock go, so that another replica may try.

A follower's reading carries its age by the database's clock (``now() - taken_at``), so the
staleness bound holds as for a reading of its own: once the reader stops writing, the
reading ages past ``lag_stale_after_s`` on every replica and the lag is unknown there.
A follower reads the row each ``lag_interval_s``, so its reading is at most about two
intervals old instead of one.

The reader stores its reading in the statement that reads it from PostgreSQL
(``producers.lag.repository.Share``), and in one of its own only when it reused a reading
without asking PostgreSQL (``producers.lag.kafka``).

Quiet, with ``stale_after_s`` and an ``Activity`` (the process's LISTEN connection): the
reader rewrites the row only when the reading changed, or once the row is half
``stale_after_s`` old (so it never goes stale while the reader lives); a follower reads it
(trying the reader's lock in the same statement) only when it heard something since its last
look, or when its copy is ``FOLLOW_AFTER`` of ``stale_after_s`` old: by then the reader has
rewritten it, or is gone and the follower takes its lock.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from datetime import datetime

from aiokafka.errors import KafkaError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.selectable import CTE

from plumbing.activity import Activity
from producers.lag.kafka import KafkaLagSource
from producers.lag.reading_store import ReadingStore
from producers.lag.rule import Reading
from producers.metrics import LAG_READER

log = logging.getLogger(__name__)

REWRITE_AFTER = 0.5  # of stale_after_s: the reader rewrites an unchanged reading this old
FOLLOW_AFTER = 0.6  # of stale_after_s: a follower that heard nothing looks again this old


class SharedLagSource:
    """A ``LagSource`` shared by the API replicas of one database, topic and group."""

    def __init__(
        self,
        local: KafkaLagSource,
        *,
        url: str,
        topic: str,
        group: str,
        model: str = "",
        stale_after_s: float | None = None,
        activity: Activity | None = None,
    ) -> None:
        """``model``: the pool's, the label of ``sluicegate_lag_reader``. Without
        ``stale_after_s`` and ``activity``, every reading is written and every replica not
        reading looks at each read (and tries the lock)."""
        self._model = model
        self._local = local
        self._store = ReadingStore(url, topic=topic, group=group)
        self._name = f"{socket.gethostname()}:{os.getpid()}"
        self._reader = False
        self._last: datetime | None = None  # when the last reading handed over began
        self._stale_s = stale_after_s if activity is not None else None
        self._activity = activity
        self._written: tuple[Reading, float] | None = None  # the reader's last row, when
        self._heard = 0  # the activity's version as the follower last looked
        self._copy_at: float | None = None  # when (monotonic) the follower's copy began

    @property
    def reader(self) -> bool:
        """Whether this replica reads the broker for the others."""
        return self._reader

    async def read(self, tally: Callable[[], int] | None = None) -> Reading | None:
        """``tally`` is read as this replica's own readings' snapshots begin; a reading
        another replica took has none."""
        try:
            if self._reader:
                return await self._take(tally)
            if not self._due():
                return None
            heard = self._activity.version if self._activity is not None else 0
            locked, found = await self._store.lock_or_latest()
            if locked:
                self._is_reader(True)
                of = f" of {self._model}" if self._model else ""
                log.info("lag%s: this replica (%s) now reads the lag for all", of, self._name)
                return await self._take(tally)
            self._heard = heard
            return self._follow(found)
        except DBAPIError:
            self._is_reader(False)  # its lock, if it held one, goes with its session
            await self._store.drop()
            raise

    async def _take(self, tally: Callable[[], int] | None) -> Reading:
        began = time.monotonic()
        rewrite_after_s = None if self._stale_s is None else REWRITE_AFTER * self._stale_s
        share = _Share(self._store, self._name, rewrite_after_s, began)
        reads = self._local.pg_reads
        try:
            reading = await self._local.read(tally, share)
        except (KafkaError, OSError, TimeoutError):
            self._is_reader(False)
            await self._store.unlock()
            raise
        taken = time.monotonic() - began
        if self._local.pg_reads != reads:  # its statement stored it, where it had to
            if share.wrote:
                self._written = (reading, began)
        elif self._rewrite(reading, began):  # reused: no statement ran to store it
            await self._store.write(reading, taken_s=taken, reader=self._name)
            self._written = (reading, began)
        return Reading(
            reading.ends,
            reading.committed,
            reading.unpublished,
            reading.open,
            age_s=taken,
            tally=reading.tally,
        )

    def _rewrite(self, reading: Reading, began: float) -> bool:
        """Whether the row must be written: always without ``stale_after_s``; else when
        the reading changed, or the row is half as old as a stale one."""
        if self._stale_s is None or self._written is None:
            return True
        written, at = self._written
        if began - at >= REWRITE_AFTER * self._stale_s:
            return True
        return _values(written) != _values(reading)

    def _due(self) -> bool:
        """Whether a follower looks now: always without ``stale_after_s``; else when it
        heard something since it last looked, or its copy is getting old."""
        if self._stale_s is None or self._activity is None:
            return True
        if not self._activity.quiet_since(self._heard) or self._copy_at is None:
            return True
        return time.monotonic() - self._copy_at >= FOLLOW_AFTER * self._stale_s

    def _follow(self, found: tuple[datetime, Reading] | None) -> Reading | None:
        if found is None:
            self._copy_at = None
            return None
        self._copy_at = time.monotonic() - found[1].age_s
        if found[0] == self._last:
            return None
        self._last = found[0]
        return found[1]

    def _is_reader(self, reader: bool) -> None:
        self._reader = reader
        LAG_READER.labels(model=self._model).set(1 if reader else 0)

    async def close(self) -> None:
        self._is_reader(False)
        await self._store.close()
        await self._local.close()


class _Share:
    """The reader's ``Share``: its reading stored by the statement that reads it, which
    keeps the rewrite rule of ``SharedLagSource._rewrite``."""

    def __init__(
        self, store: ReadingStore, reader: str, rewrite_after_s: float | None, began: float
    ) -> None:
        self._store = store
        self._reader = reader
        self._rewrite_after_s = rewrite_after_s
        self._began = began
        self.wrote = False

    def written(self, reading: CTE, committed: Mapping[int, int]) -> CTE:
        return self._store.written(
            reading,
            committed=committed,
            taken_s=time.monotonic() - self._began,
            reader=self._reader,
            rewrite_after_s=self._rewrite_after_s,
        )

    def done(self, wrote: bool) -> None:
        self.wrote = wrote


def _values(reading: Reading) -> tuple[object, ...]:
    return (reading.ends, reading.committed, reading.unpublished, reading.open)
