"""Many writers, one transaction.

A write that may wait a little (a job's end on a worker, a presence report, a periodic
reading on the API) ``join``s the process's unit of work. It waits up to ``linger_s`` for
the next transaction the process opens anyway (a group of submits, a worker's claim), which
``take``s the writes waiting and runs them on its connection (``Unit.run``), so that all
commit together: one commit and one WAL flush instead of several. A write that no
transaction took within ``linger_s`` runs alone, as it would have without the unit of work;
given ``lock`` and other writes waiting, it runs them all in one transaction of its own,
their rows locked first in one order (``plumbing.lock_store``).

The records of the rows this process published at once (``plumbing.publish_at_once``) wait here
too (``add_published``), for the next statement that can record them in passing
(``Unit.take_published``); ``plumbing.publish_at_once`` writes the ones that waited too long alone.

A transaction that fails takes its unit's writes with it: each write's ``undo`` runs, the
published records wait again, and each write runs alone (so does one whose caller gave up).
A write runs in a carrier only while it is cheap: one that took over ``MAX_JOINED_S`` in a
carrier (a count over a backlog grown large) runs alone for the next ``SLOW_FOR_S``, so
that it does not hold up carriers (a group of submits waits for its commit to answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from sqlalchemy import Executable
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.db import transaction
from plumbing.metrics import JOINED
from plumbing.published_store import Published
from plumbing.published_store import params as recorded

T = TypeVar("T")

Write = Callable[["Unit"], Awaitable[T]]
Lock = Callable[[AsyncConnection, Sequence[str]], Awaitable[None]]

_ALONE: Any = object()  # the answer to a write whose transaction failed: run alone
MAX_JOINED_S = 0.02  # a write that took longer in a carrier runs alone
SLOW_FOR_S = 10.0  # for this long


@dataclass(eq=False)
class _JoinedWrite:
    write: Write[Any]
    undo: Callable[[], None] | None
    locks: Sequence[str]
    done: asyncio.Future[Any]
    kind: str  # what it writes (its function's name): a slow one runs alone for a while


@dataclass(eq=False)
class Unit:
    """The writes one transaction took: it runs them (``run``) on its connection, and they
    are settled once it ended (``settling``)."""

    work: UnitOfWork
    writes: list[_JoinedWrite] = field(default_factory=list)
    conn: AsyncConnection | None = None
    carried: bool = False  # it ran joined writes or took published records
    _results: list[Any] = field(default_factory=list)
    _published: list[Published] = field(default_factory=list)

    @property
    def locks(self) -> list[str]:
        """The rows its writes lock."""
        return [key for w in self.writes for key in w.locks]

    @property
    def connection(self) -> AsyncConnection:
        assert self.conn is not None, "the unit runs on no connection yet"
        return self.conn

    def take_published(self) -> list[Published]:
        """The published records waiting, for the statement being written to record; they
        wait again if the transaction fails."""
        taken = self.work.published_taken()
        self._published += taken
        self.carried = self.carried or bool(taken)
        return taken

    def recording(
        self, plain: Executable, recording: Executable, params: dict[str, Any]
    ) -> tuple[Executable, dict[str, Any]]:
        """The statement to run: ``plain``, or ``recording`` (``plain`` with
        ``published_store.RECORDING``) when published records wait, taken for it."""
        records = self.take_published()
        if not records:
            return plain, params
        return recording, {**params, **recorded(records)}

    @asynccontextmanager
    async def settling(self) -> AsyncIterator[Unit]:
        """Around the carrier's transaction: settles the unit once it ended."""
        try:
            yield self
        except BaseException:
            self.settle(committed=False)
            raise
        self.settle(committed=True)

    async def run(self, conn: AsyncConnection) -> None:
        """The writes on ``conn``, in the carrier's transaction (which then writes its
        own statement on the unit's ``connection``)."""
        self.conn = conn
        self.carried = self.carried or bool(self.writes)
        for w in self.writes:
            began = time.monotonic()
            self._results.append(await w.write(self))
            ended = time.monotonic()
            if ended - began > MAX_JOINED_S:
                self.work.slow_until[w.kind] = ended + SLOW_FOR_S

    def settle(self, committed: bool) -> None:
        """Committed: each write gets its result; else each is undone and runs alone, and
        the published records wait again."""
        for w, result in zip(self.writes, self._results, strict=False):
            if not committed and w.undo is not None:
                w.undo()
            if not w.done.done():
                w.done.set_result(result if committed else _ALONE)
        for w in self.writes[len(self._results) :]:  # not run: their carrier failed first
            if not w.done.done():
                w.done.set_result(_ALONE)
        if not committed:
            self.work.add_published(self._published, first=True)
        self.writes, self._results, self._published = [], [], []


class UnitOfWork:
    def __init__(self, engine: AsyncEngine, *, linger_s: float, lock: Lock | None = None) -> None:
        """``linger_s``: how long a write waits for a transaction (0: every write alone);
        ``lock``: writes that waited in vain run together, their rows locked by it first
        (None: each alone)."""
        self.engine = engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.linger_s = linger_s
        self._lock = lock
        self._waiting: list[_JoinedWrite] = []
        self._published: list[Published] = []
        self.published_since: float | None = None  # when the oldest record waiting came
        self.published_returned = asyncio.Event()
        self.slow_until: dict[str, float] = {}  # by kind: runs alone until then

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def published_waiting(self) -> int:
        return len(self._published)

    def add_published(self, records: Sequence[Published], *, first: bool = False) -> None:
        """Records of rows published, to be written by the next statement that takes them
        (``first``: given back by a statement that failed, which ``published_returned``
        tells the publisher, whose own records it knows of)."""
        if records:
            before, after = (records, self._published) if first else (self._published, records)
            self._published = [*before, *after]
            self.published_since = self.published_since or time.monotonic()
            if first:
                self.published_returned.set()

    def published_taken(self) -> list[Published]:
        taken, self._published, self.published_since = self._published, [], None
        return taken

    def take(self) -> Unit:
        """The writes waiting, taken by a transaction opening now."""
        unit = Unit(self, writes=self._waiting)
        self._waiting = []
        return unit

    async def alone(
        self, write: Write[T], *, in_transaction: bool = False, on: AsyncEngine | None = None
    ) -> T:
        """``write`` in a unit of its own (with the published records waiting): one
        statement on an autocommit connection, or ``in_transaction``; on a connection of
        ``on`` (by default the unit of work's engine)."""
        unit = Unit(self)
        engine = on or self._autocommit
        opened = transaction(engine) if in_transaction else engine.connect()
        async with unit.settling(), opened as conn:
            await unit.run(conn)
            return await write(unit)

    async def join(
        self,
        write: Write[T],
        *,
        locks: Sequence[str] = (),
        undo: Callable[[], None] | None = None,
        in_transaction: bool = False,
        alone_on: AsyncEngine | None = None,
        kind: str | None = None,
    ) -> T:
        """``write``'s result once a transaction that ran it committed; alone (see
        ``alone``, on ``alone_on``) when none took it within ``linger_s``. ``kind``: what
        it writes (by default its function's name)."""
        done = asyncio.get_running_loop().create_future()
        waiting = _JoinedWrite(write, undo, locks, done, kind or write.__qualname__)
        if self.linger_s <= 0 or time.monotonic() < self.slow_until.get(waiting.kind, 0.0):
            return await self.alone(write, in_transaction=in_transaction, on=alone_on)
        self._waiting.append(waiting)
        try:
            result = await asyncio.wait_for(asyncio.shield(waiting.done), self.linger_s)
        except TimeoutError:
            if waiting in self._waiting and (self._lock is None or len(self._waiting) == 1):
                self._waiting.remove(waiting)  # no transaction came: alone
                JOINED.labels(outcome="alone").inc()
                return await self.alone(write, in_transaction=in_transaction, on=alone_on)
            if waiting in self._waiting:  # it carries the others waiting
                await self._together(self.take())
            result = await waiting.done  # taken: its transaction is ending
        except asyncio.CancelledError:
            if waiting in self._waiting:
                self._waiting.remove(waiting)
            raise
        if result is _ALONE:
            JOINED.labels(outcome="alone").inc()
            return await self.alone(write, in_transaction=in_transaction, on=alone_on)
        JOINED.labels(outcome="joined").inc()
        return cast(T, result)

    async def _together(self, unit: Unit) -> None:
        """The writes that waited in vain, in one transaction, their rows locked first."""
        assert self._lock is not None
        with contextlib.suppress(Exception):  # they run alone
            async with unit.settling(), transaction(self.engine) as conn:
                await self._lock(conn, unit.locks)
                await unit.run(conn)


async def joining(
    work: UnitOfWork | None, engine: AsyncEngine, run: Callable[[AsyncConnection], Awaitable[T]]
) -> T:
    """``run`` joining ``work``'s next transaction, or on a connection of ``engine`` when
    there is no unit of work or no transaction took it (the unit of work's own connections
    are its carriers', such as the API's few for its groups of submits)."""
    if work is None:
        async with engine.connect() as conn:
            return await run(conn)

    async def write(unit: Unit) -> T:
        return await run(unit.connection)

    return await work.join(write, alone_on=engine, kind=run.__qualname__)
