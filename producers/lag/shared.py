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
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import datetime

from aiokafka.errors import KafkaError
from sqlalchemy.exc import DBAPIError

from producers.lag.kafka import KafkaLagSource
from producers.lag.reading_store import ReadingStore
from producers.lag.rule import Reading
from producers.metrics import LAG_READER

log = logging.getLogger(__name__)


class SharedLagSource:
    """A ``LagSource`` shared by the API replicas of one database, topic and group."""

    def __init__(
        self, local: KafkaLagSource, *, url: str, topic: str, group: str, model: str = ""
    ) -> None:
        """``model``: the pool's, the label of ``sluicegate_lag_reader``."""
        self._model = model
        self._local = local
        self._store = ReadingStore(url, topic=topic, group=group)
        self._name = f"{socket.gethostname()}:{os.getpid()}"
        self._reader = False
        self._last: datetime | None = None  # when the last reading handed over began

    @property
    def reader(self) -> bool:
        """Whether this replica reads the broker for the others."""
        return self._reader

    async def read(self, mark: Callable[[], int] | None = None) -> Reading | None:
        """``mark`` is read as this replica's own readings' snapshots begin; a reading
        another replica took has none."""
        try:
            if not self._reader and await self._store.try_lock():
                self._is_reader(True)
                of = f" of {self._model}" if self._model else ""
                log.info("lag%s: this replica (%s) now reads the lag for all", of, self._name)
            if self._reader:
                return await self._take(mark)
            return await self._follow()
        except DBAPIError:
            self._is_reader(False)  # its lock, if it held one, goes with its session
            await self._store.drop()
            raise

    async def _take(self, mark: Callable[[], int] | None) -> Reading:
        began = time.monotonic()
        try:
            reading = await self._local.read(mark)
        except (KafkaError, OSError, TimeoutError):
            self._is_reader(False)
            await self._store.unlock()
            raise
        taken = time.monotonic() - began
        await self._store.write(reading, taken_s=taken, reader=self._name)
        return Reading(
            reading.ends,
            reading.committed,
            reading.unpublished,
            reading.open,
            age_s=taken,
            mark=reading.mark,
        )

    async def _follow(self) -> Reading | None:
        found = await self._store.latest()
        if found is None or found[0] == self._last:
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
