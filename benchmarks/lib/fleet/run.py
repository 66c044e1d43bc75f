"""One run of the fleet on one group configuration: admission set from the fleet's
capacity, the workers started and settled, the arrivals and the storm played, the wait
until every job is terminal and the group has caught up, then the jobs and their terminal
events read."""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from benchmarks.lib.callers import REFUSALS, TENANT, call
from benchmarks.lib.engine import LAG_HARD_S, LAG_SOFT_S
from benchmarks.lib.fleet.configs import Config
from benchmarks.lib.fleet.figures import Served, summarize
from benchmarks.lib.fleet.members import Fleet
from benchmarks.lib.fleet.plan import Move, Plan, Roofline
from benchmarks.lib.fleet.sampler import Sample, sampler
from benchmarks.lib.stack import TERMINAL, Bench, alter_system, job_rows, pipeline
from benchmarks.lib.trace import Arrival
from plumbing.db import make_engine
from producers.lag.kafka import KafkaLagSource
from schemas.envelopes import JobEvent
from schemas.tables import jobs, outbox
from sluicegate.local.embedded import EmbeddedPostgres

MAX_CONNECTIONS = 600


async def raise_max_connections(pg: EmbeddedPostgres) -> None:
    """Room for a fleet's connections on the embedded PostgreSQL."""
    await alter_system(pg, "max_connections", str(MAX_CONNECTIONS))


def overrides(args: argparse.Namespace, config: Config, roof: Roofline) -> dict[str, object]:
    fleet_jobs_per_s = args.workers * roof.jobs_per_s / args.time_scale
    p99_s = roof.service_p99_s * args.time_scale
    return {
        "partitions": args.partitions,
        "worker_group_protocol": config.protocol,
        "worker_session_timeout_ms": args.session_ms,
        "sim_time_scale": args.time_scale,
        "sim_max_num_seqs": args.max_num_seqs,
        "worker_db_pool_size": args.db_pool,
        "drain_timeout_s": args.drain_s,
        # Admission as the overload benchmark sets it: capacity x (p99 service + s).
        "lag_soft": round(fleet_jobs_per_s * (p99_s + LAG_SOFT_S)),
        "lag_hard": round(fleet_jobs_per_s * (p99_s + LAG_HARD_S)),
        "max_blocked": 1024,
        "max_block_ms": 3000,
        "expected_token_time_s": roof.decode_s_per_token * args.time_scale,
        "retry_after_max_s": 10.0,
        "max_input_bytes": 1_000_000,
    }


async def run_config(
    admin: str,
    bootstrap: str,
    config: Config,
    args: argparse.Namespace,
    roof: Roofline,
    sched: Plan,
) -> dict[str, Any]:
    REFUSALS.clear()
    settings = overrides(args, config, roof)
    started = time.monotonic()
    async with pipeline(admin, bootstrap, **settings) as bench:
        bench.start_relay()
        fleet = Fleet(bench, args, config)
        settle_s = await fleet.start(args.workers, args.start_max_s)
        print(f"{config.name}: {args.workers} workers settled in {settle_s:.1f}s", flush=True)
        accepted: dict[str, Arrival] = {}
        samples: list[Sample] = []
        served: list[Served] = []
        moves: list[dict[str, Any]] = []
        t0, wall0 = time.monotonic(), datetime.now(UTC)
        calls = [call(bench, a, t0, wall0, accepted) for a in sched.arrivals]
        sampling = asyncio.create_task(
            sampler(fleet, t0, lambda: due(sched, t0), accepted, samples)
        )
        tracking = asyncio.create_task(track_served(fleet, t0, served))
        storming = asyncio.create_task(storm(fleet, sched.moves, t0, moves))
        await asyncio.gather(*calls)
        await storming
        end_s = time.monotonic() - t0
        terminal = await wait_terminal(bench, accepted, args.drain_max_s)
        drained_s = time.monotonic() - t0
        caught = await caught_up(bench, within_s=30.0)
        sampling.cancel()
        tracking.cancel()
        await asyncio.gather(sampling, tracking, return_exceptions=True)
        await asyncio.sleep(1.0)  # aborted attempts write their tokens last
        rows = await job_rows(
            bench,
            jobs.c.id,
            jobs.c.state,
            jobs.c.attempt,
            jobs.c.deadline,
            jobs.c.created_at,
            jobs.c.finished_at,
            jobs.c.result,
            jobs.c.error,
            where=jobs.c.tenant == TENANT,
        )
        events = await terminal_events(bench)
        stopping = time.monotonic()
        await fleet.stop()
        stop_s = time.monotonic() - stopping
    rows = [r for r in rows if r["id"] in accepted]
    result = {
        "config": config.name,
        "about": config.about,
        "protocol": config.protocol,
        "policy": args.policy,
        "settle_s": round(settle_s, 1),
        "arrivals_end_s": round(end_s, 1),
        "all_terminal": terminal,
        "all_terminal_s": round(drained_s, 1),
        "caught_up": caught,
        "stop_s": round(stop_s, 1),
        "run_s": round(time.monotonic() - started, 1),
        "refusals_by_reason": dict(REFUSALS),
        "moves": moves,
    }
    return summarize(result, rows, events, samples, served, sched, wall0, args)


def due(sched: Plan, t0: float) -> int:
    """Arrivals due by now (each submits at its time, or a moment after)."""
    now = time.monotonic() - t0
    return sum(1 for a in sched.arrivals if a.at_s <= now)


async def storm(fleet: Fleet, moves: list[Move], t0: float, log: list[dict[str, Any]]) -> None:
    for move in moves:
        await asyncio.sleep(max(0.0, move.at_s - (time.monotonic() - t0)))
        entry = await fleet.apply(move)
        entry.update(at_s=round(time.monotonic() - t0, 2))
        log.append(entry)


async def track_served(fleet: Fleet, t0: float, out: list[Served]) -> None:
    """Every 0.1 s: the partitions live members hold, and which members hold some."""
    while True:
        held = {m.index: m.holds() for m in fleet.alive()}
        out.append(
            Served(
                at_s=round(time.monotonic() - t0, 2),
                partitions=frozenset().union(*held.values()),
                holders=frozenset(i for i, h in held.items() if h),
                settled=fleet.settled(),
            )
        )
        await asyncio.sleep(0.1)


async def wait_terminal(bench: Bench, accepted: dict[str, Arrival], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        rows = await job_rows(bench, jobs.c.id, jobs.c.state, where=jobs.c.tenant == "bench")
        if all(r["state"] in TERMINAL for r in rows if r["id"] in accepted):
            return True
        await asyncio.sleep(1.0)
    return False


async def caught_up(bench: Bench, within_s: float) -> dict[str, Any]:
    """Whether the group's committed offsets reach the relay's ends on every partition."""
    s = bench.settings
    source = KafkaLagSource(
        db=make_engine(s.require_database_url(), pool_size=1),
        bootstrap=s.require_kafka(),
        topic=s.dispatch_topic,
        group_id=s.consumer_group,
        partitions=s.partitions,
    )
    behind: dict[int, int] = {}
    deadline = time.monotonic() + within_s
    try:
        while True:
            reading = await source.read()
            behind = {
                p: end - reading.committed.get(p, 0)
                for p, end in reading.ends.items()
                if end - reading.committed.get(p, 0) > 0
            }
            if not behind or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
    finally:
        await source.close()
    return {"caught_up": not behind, "partitions_behind": behind}


async def terminal_events(bench: Bench) -> list[JobEvent]:
    db = make_engine(bench.settings.require_database_url(), pool_size=1)
    try:
        async with db.connect() as conn:
            payloads = await conn.scalars(
                select(outbox.c.payload).where(outbox.c.topic == bench.settings.events_topic)
            )
            events = [JobEvent.model_validate_json(p) for p in payloads]
    finally:
        await db.dispose()
    return [e for e in events if e.state.value in TERMINAL]
