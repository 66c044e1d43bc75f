"""The shared lag reading's SQL (``producers/lag/shared.py``): the reader's advisory lock, and
the ``lag_readings`` row of one dispatch topic and worker group, on one connection of its own
(the lock is the session's: it goes when the connection does)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Interval, Select, and_, func, literal, or_, select
from sqlalchemy.dialects.postgresql import JSONB, Insert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

from plumbing.db import make_engine
from producers.lag.rule import Reading
from schemas.tables import lag_readings

# pg_try_advisory_lock's first key: "sluicegate lag reader"; the second is the topic's
# and group's hash.
LOCK_CLASS = 0x5167_1A60
KEYS = ["topic", "consumer_group"]
VALUES = ("ends", "committed", "open", "unpublished")  # a reading's, compared to rewrite


def _keyed(partitions: Mapping[int, int] | None) -> dict[str, int] | None:
    return None if partitions is None else {str(p): int(n) for p, n in partitions.items()}


def _partitions(found: Mapping[str, Any] | None) -> dict[int, int] | None:
    return None if found is None else {int(p): int(n) for p, n in found.items()}


def _found(found: Any) -> tuple[datetime, Reading]:
    reading = Reading(
        _partitions(found.ends) or {},
        _partitions(found.committed) or {},
        int(found.unpublished),
        _partitions(found.open),
        age_s=max(float(found.age), 0.0),
    )
    return found.taken_at, reading


class ReadingStore:
    def __init__(self, url: str, *, topic: str, group: str) -> None:
        self._db = make_engine(url, pool_size=1)
        self._topic = topic
        self._group = group
        self._conn: AsyncConnection | None = None

    async def try_lock(self) -> bool:
        """Take the reader's lock if no other session holds it."""
        return bool(await (await self._connection()).scalar(self._lock("pg_try_advisory_lock")))

    async def unlock(self) -> None:
        await (await self._connection()).execute(self._lock("pg_advisory_unlock"))

    async def write(self, reading: Reading, *, taken_s: float, reader: str) -> None:
        """Store ``reading``, begun ``taken_s`` ago by the database's clock."""
        values: dict[str, ColumnElement[Any]] = {
            "ends": literal(_keyed(reading.ends), JSONB()),
            "open": literal(_keyed(reading.open), JSONB()),
            "unpublished": literal(reading.unpublished),
        }
        statement = self._upsert(values, reading.committed, taken_s, reader, None)
        await (await self._connection()).execute(statement)

    def written(
        self,
        reading: CTE,
        *,
        committed: Mapping[int, int],
        taken_s: float,
        reader: str,
        rewrite_after_s: float | None,
    ) -> CTE:
        """The statement that stores ``reading`` (a CTE of ``ends``, ``unpublished`` and
        ``open``: ``producers.lag.repository``), begun ``taken_s`` ago by the database's
        clock. With ``rewrite_after_s``, an unchanged row younger than that is left as it
        is. Returns a row if it wrote."""
        values = {name: reading.c[name] for name in ("ends", "open", "unpublished")}
        statement = self._upsert(values, committed, taken_s, reader, rewrite_after_s)
        return statement.returning(literal(1).label("wrote")).cte("shared")

    def _upsert(
        self,
        values: Mapping[str, ColumnElement[Any]],
        committed: Mapping[int, int],
        taken_s: float,
        reader: str,
        rewrite_after_s: float | None,
    ) -> Insert:
        """The row of this topic and group inserted, or rewritten (with
        ``rewrite_after_s``: only when a value changed or the row is that old)."""
        row: dict[str, ColumnElement[Any]] = {
            "topic": literal(self._topic),
            "consumer_group": literal(self._group),
            "reader": literal(reader),
            "taken_at": func.now() - literal(timedelta(seconds=taken_s), Interval()),
            "committed": literal(_keyed(committed), JSONB()),
            **values,
        }
        statement = pg_insert(lag_readings).from_select(list(row), select(*row.values()))
        new = statement.excluded
        update = {k: new[k] for k in row if k not in KEYS}
        where = None
        if rewrite_after_s is not None:
            old = lag_readings.c
            where = or_(
                *(old[k].is_distinct_from(new[k]) for k in VALUES),
                old.taken_at
                < new.taken_at - literal(timedelta(seconds=rewrite_after_s), Interval()),
            )
        return statement.on_conflict_do_update(index_elements=KEYS, set_=update, where=where)

    async def latest(self) -> tuple[datetime, Reading] | None:
        """The stored reading and when it began; its ``age_s`` by the database's clock."""
        found = (await (await self._connection()).execute(self._latest())).first()
        return None if found is None else _found(found)

    async def lock_or_latest(self) -> tuple[bool, tuple[datetime, Reading] | None]:
        """In one statement: take the reader's lock if no other session holds it, and the
        stored reading (as ``latest``), for a replica that is not the reader yet."""
        lock = self._lock("pg_try_advisory_lock").scalar_subquery().label("locked")
        keys = and_(
            lag_readings.c.topic == self._topic, lag_readings.c.consumer_group == self._group
        )
        one = select(literal(1).label("one")).subquery("one")
        age = func.extract("epoch", func.now() - lag_readings.c.taken_at).label("age")
        query = select(lock, lag_readings, age).select_from(one.outerjoin(lag_readings, keys))
        found = (await (await self._connection()).execute(query)).one()
        return bool(found.locked), None if found.taken_at is None else _found(found)

    def _latest(self) -> Select[Any]:
        age = func.extract("epoch", func.now() - lag_readings.c.taken_at)
        return select(lag_readings, age.label("age")).where(
            lag_readings.c.topic == self._topic,
            lag_readings.c.consumer_group == self._group,
        )

    def _lock(self, function: str) -> Select[Any]:
        key = func.hashtext(f"{self._topic} {self._group}")  # no space in a topic name
        return select(getattr(func, function)(LOCK_CLASS, key))

    async def _connection(self) -> AsyncConnection:
        if self._conn is None or self._conn.closed:
            self._conn = await self._db.connect()
        return self._conn

    async def drop(self) -> None:
        """Close the session (and so let its lock go); never back to the pool with it."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(DBAPIError, OSError):
                await conn.invalidate()
            await conn.close()

    async def close(self) -> None:
        await self.drop()
        await self._db.dispose()
