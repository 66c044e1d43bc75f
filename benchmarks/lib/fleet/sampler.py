"""The fleet, sampled every second: members alive and holding partitions, their generations,
the admission's lag and the consumer lag, jobs in the engines and running in the database,
submits and refusals, the engines' clocks and this process's CPU."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import func, select

from benchmarks.lib.callers import REFUSALS
from benchmarks.lib.fleet.members import Fleet
from benchmarks.lib.stack import Bench
from benchmarks.lib.trace import Arrival
from plumbing.db import make_engine
from schemas.tables import jobs


@dataclass(frozen=True, kw_only=True)
class Sample:
    at_s: float
    alive: int
    assigned: int  # live members holding partitions
    generations: int  # distinct generations among live members
    generation: int  # the highest
    settled: bool  # every partition held by one live member, every live member holding some
    served: int  # partitions held by a live member
    lag: int  # the admission's reading (open jobs past the commit points, plus unpublished)
    consumer_lag: int  # Σ end - committed
    lag_known: bool
    engine_running: int
    engine_waiting: int
    db_running: int
    submitted: int
    accepted: int
    refused: int  # refused attempts so far, retried or not
    engine_s: float  # Σ engine seconds of every engine so far
    busy_s: float  # Σ wall seconds the engines had work
    cpu_s: float
    late_ms: float  # how late the sampler woke (the event loop's lag)


async def running_in_db(bench: Bench) -> int:
    db = make_engine(bench.settings.require_database_url(), pool_size=1)
    try:
        async with db.connect() as conn:
            query = select(func.count()).where(jobs.c.state == "running")
            return int((await conn.execute(query)).scalar_one())
    finally:
        await db.dispose()


async def sampler(
    fleet: Fleet,
    t0: float,
    submitted: Callable[[], int],
    accepted: dict[str, Arrival],
    out: list[Sample],
) -> None:
    monitor = fleet.bench.app.state.monitor
    late = 0.0
    while True:
        alive = fleet.alive()
        snapshot = monitor.snapshot()
        generations = {g for g in (m.generation() for m in alive) if g is not None}
        engines = fleet.engines()
        caps = [m.engine.capacity() for m in alive]
        out.append(
            Sample(
                at_s=round(time.monotonic() - t0, 2),
                alive=len(alive),
                assigned=sum(1 for m in alive if m.assigned()),
                generations=len(generations),
                generation=max(generations, default=0),
                settled=fleet.settled(),
                served=len(set().union(*(m.holds() for m in alive))),
                lag=snapshot.lag,
                consumer_lag=int(monitor._state.consumer_lag),
                lag_known=snapshot.known,
                engine_running=sum(c.running for c in caps),
                engine_waiting=sum(c.waiting for c in caps),
                db_running=await running_in_db(fleet.bench),
                submitted=submitted(),
                accepted=len(accepted),
                refused=sum(REFUSALS.values()),
                engine_s=sum(e.engine.simulated_s for e in engines),
                busy_s=sum(e.busy_s() for e in engines),
                cpu_s=time.process_time(),
                late_ms=round(late * 1000, 1),
            )
        )
        slept = time.monotonic()
        await asyncio.sleep(1.0)
        late = time.monotonic() - slept - 1.0
