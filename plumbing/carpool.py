"""Writes that ride in another transaction instead of committing alone.

A write that may wait a little (a job's end on a worker, a periodic reading on the API)
``ride``s: it waits up to ``linger_s`` for the next transaction the process opens anyway (a
worker's claim, a group of submits), which ``board``s it: runs it on its connection, inside
its transaction, so that both commit together (one commit, one WAL flush instead of two).
A rider that no transaction boarded within ``linger_s`` runs ``alone``, as it would have
without the pool; or, given a ``carry`` and other riders waiting, it carries them all in one
transaction of its own.

A write rides only while it is cheap: one that took over ``MAX_RIDE_S`` in a carrier (a
count over a backlog grown large) runs alone at once for the next ``SLOW_FOR_S``, then
tries again, so that it does not keep holding up carriers (a group of submits waits for its
commit before it answers).

A boarding transaction that fails takes its riders' writes with it: each is undone
(``undo``) and runs alone; so does one whose caller gave up. Riders name the rows they lock
(``locks``), so that the carrier can lock them with its own rows in one order
(``plumbing.lock_store``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.metrics import RIDES

T = TypeVar("T")

_ALONE: Any = object()  # the answer to a rider whose carrier failed: run alone
MAX_RIDE_S = 0.02  # a write that took longer in a carrier runs alone
SLOW_FOR_S = 10.0  # for this long


@dataclass(eq=False)
class _Rider:
    write: Callable[[AsyncConnection], Awaitable[Any]]
    undo: Callable[[], None] | None
    locks: Sequence[str]
    done: asyncio.Future[Any]

    @property
    def kind(self) -> str:
        """What it writes (its function): a slow one runs alone for a while."""
        return str(getattr(self.write, "__qualname__", ""))


@dataclass
class Boarded:
    """The riders a transaction ran, to be told how it ended (``settle``)."""

    riders: list[_Rider] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)
    slow_until: dict[str, float] = field(default_factory=dict)  # the carpool's, by kind

    @property
    def locks(self) -> list[str]:
        """The rows the riders lock."""
        return [key for rider in self.riders for key in rider.locks]

    @asynccontextmanager
    async def settling(self) -> AsyncIterator[None]:
        """Around the carrier's transaction: settles the riders once it ended."""
        try:
            yield
        except BaseException:
            self.settle(committed=False)
            raise
        self.settle(committed=True)

    async def run(self, conn: AsyncConnection) -> None:
        """Run the riders' writes on ``conn``, in its transaction."""
        for rider in self.riders:
            began = time.monotonic()
            self.results.append(await rider.write(conn))
            ended = time.monotonic()
            if ended - began > MAX_RIDE_S:
                self.slow_until[rider.kind] = ended + SLOW_FOR_S

    def settle(self, committed: bool) -> None:
        """Committed: each rider gets its write's result; else each is undone and runs
        alone."""
        for rider, result in zip(self.riders, self.results, strict=False):
            if not committed and rider.undo is not None:
                rider.undo()
            if not rider.done.done():
                rider.done.set_result(result if committed else _ALONE)
        for rider in self.riders[len(self.results) :]:  # not run: their carrier failed first
            if not rider.done.done():
                rider.done.set_result(_ALONE)
        self.riders, self.results = [], []


class Carpool:
    def __init__(
        self, linger_s: float, carry: Callable[[Boarded], Awaitable[None]] | None = None
    ) -> None:
        """``linger_s``: how long a rider waits for a transaction (0: every write alone);
        ``carry``: runs several riders in one transaction (and raises if it failed)."""
        self.linger_s = linger_s
        self.carry = carry
        self._waiting: list[_Rider] = []
        self._slow_until: dict[str, float] = {}  # by kind: runs alone until then

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def ride(
        self,
        write: Callable[[AsyncConnection], Awaitable[T]],
        alone: Callable[[], Awaitable[T]],
        *,
        locks: Sequence[str] = (),
        undo: Callable[[], None] | None = None,
    ) -> T:
        """``write``'s result once a transaction that ran it committed, or ``alone``'s."""
        rider = _Rider(write, undo, locks, asyncio.get_running_loop().create_future())
        if self.linger_s <= 0 or time.monotonic() < self._slow_until.get(rider.kind, 0.0):
            return await alone()
        self._waiting.append(rider)
        try:
            result = await asyncio.wait_for(asyncio.shield(rider.done), self.linger_s)
        except TimeoutError:
            if rider in self._waiting and (self.carry is None or len(self._waiting) == 1):
                self._waiting.remove(rider)  # no transaction came: alone
                RIDES.labels(outcome="alone").inc()
                return await alone()
            if rider in self._waiting:  # it carries the others waiting
                await self._carried(self.board())
            result = await rider.done  # boarded: its transaction is ending
        except asyncio.CancelledError:
            if rider in self._waiting:
                self._waiting.remove(rider)
            raise
        if result is _ALONE:
            RIDES.labels(outcome="alone").inc()
            return await alone()
        RIDES.labels(outcome="boarded").inc()
        return cast(T, result)

    async def _carried(self, boarded: Boarded) -> None:
        assert self.carry is not None
        with contextlib.suppress(Exception):  # its riders run alone
            async with boarded.settling():
                await self.carry(boarded)

    def board(self) -> Boarded:
        """The waiting riders, taken by a transaction: it runs them (``Boarded.run``) and
        settles them once it ended."""
        boarded = Boarded(riders=self._waiting, slow_until=self._slow_until)
        self._waiting = []
        return boarded


async def on(
    carpool: Carpool | None, engine: AsyncEngine, run: Callable[[AsyncConnection], Awaitable[T]]
) -> T:
    """``run`` riding in ``carpool``'s next transaction, or on a connection of ``engine``'s
    (autocommit: a statement is its own transaction) when none boards it."""

    async def alone() -> T:
        async with engine.connect() as conn:
            return await run(conn)

    if carpool is None:
        return await alone()
    return await carpool.ride(run, alone)
