"""Fleet: 64 simulated GPU workers in one consumer group through a burst and a rebalance storm.

One dispatch topic of ``--partitions`` partitions (128 by default, two a worker) and
``--workers`` workers in one group, each a simulator engine (an 8B model on an 80 GB GPU, a
batch of ``--max-num-seqs`` sequences) whose steps sleep their roofline time times
``--time-scale``. The run, on a fresh database and fresh topics, is played twice with the
same seed and the same schedule: once with ``pull_policy="kv"``, once with ``"greedy"``.

The defaults, one sequence an engine at 10x its roofline time, follow from two limits.
This process's CPU bounds the fleet's throughput in wall time (about 10 jobs/s with
arrivals, claims, results and the relay all here), and every job's wall time is its
roofline service time (about 0.6 s) times the time scale whatever the batch: 64 engines of
``--max-num-seqs`` sequences at that throughput need a time scale of about
64 x (one engine's roofline jobs/s) / 10, so a bigger batch means proportionally longer
jobs in wall time, while Kafka's clocks (session timeout, the drain, rebalances) stay in
real seconds. One sequence keeps a job (about 6 s) shorter than the drain, as a real GPU's
jobs (about 1 s against 20 s) are; with 4 sequences at 40x a job takes about 33 s, every
rebalance aborts nearly all running work, and the storm measures the time scale more than
the pipeline (a trial run did that: no job succeeded for 50 s of the storm).

1. warm-up: Poisson arrivals of summarization jobs (the overload benchmark's mix, deadlines
   a log-normal spread of 2x-10x the engine's service time with its batch full) at
   ``--load`` times the fleet's roofline capacity;
2. a burst at ``--burst`` times capacity, then a settle at the warm-up rate;
3. a rebalance storm at the warm-up rate: every ``--storm-s / --moves`` seconds a worker
   leaves (drained or killed, in turn) and a new one joins;
4. a recovery tail at the warm-up rate, then a wait until every accepted job is terminal.

Callers submit through the API (``POST /v1/jobs`` with a deadline), retrying 429/503 after
``Retry-After`` while their deadline allows; a refusal is the admission doing its job.

Figures, every second: goodput (jobs that succeeded, necessarily by their deadline, and
their output tokens, from the database), the admission's lag reading and the plain consumer
lag, workers alive and holding partitions, jobs in the engines and running in the database,
acceptances and refusals. Per policy: goodput by phase, max and p95 lag, deadline misses
(jobs ended ``expired``, before or during decode), refusals, takeovers (jobs with attempt >
1), duplicates (more than one terminal event for a job, or a terminal event from an attempt
that does not own the job), the time for goodput to recover after the storm, and the
rebalances the group went through (each move's time until every live member holds
partitions of one generation again).

How it is simulated, and why honestly enough: the workers are asyncio tasks of this one
process (``workers.service.run_worker``), beside the API and the relay, each with its own
consumer, database pool and engine; PostgreSQL and the broker are processes of their own.
64 worker processes would not fit a 2-core machine, and their CPU would hide behind
scrapes. A worker's time goes to sleeping its steps; the time scale is chosen so that the
whole fleet keeps this process under one core, and every phase reports the check: engine
speed = engine seconds x time scale / wall seconds the engines were busy (1.0 when every
step took its roofline time), and this process's CPU share. Kafka's own clocks (session
timeout 10 s, the drain) are not scaled: in the simulated GPU's time the storm is
``--time-scale`` times as dense as it is in wall time.

A drained worker has its own stop event set: it finishes or aborts its jobs within
``--drain-s``, commits and leaves the group. A killed worker models SIGKILL: cancelling the
task alone would still drain, commit and send LeaveGroup (run_worker's ``finally`` blocks
and aiokafka's ``stop()``), so first its heartbeat task is cancelled, its LeaveGroup is
replaced by a no-op, its commits are disabled and its job tasks are cancelled (their jobs
stay ``running`` in the database, as after a kill), then the task is cancelled. The group
learns of it only when the session times out. The TCP connections are closed cleanly,
which a broker cannot tell from a kill either.

The anchor: the first worker started formed the group and is its leader. Tansu 0.6 (the
embedded broker) keeps an evicted leader as the leader and the group never forms again, so
the anchor is never stopped or killed (tests/faults/test_rebalance_storm.py does the same).
Tansu's high watermark can trail the true end by one record batch; the lag here uses the
relay's exact ends (``partition_ends``), as the API's lag monitor does.

The drain (``--drain-s``, 4 s) stays well inside the 10 s in which a member must rejoin a
rebalance on the embedded broker (tests/faults/test_rebalance_storm.py drains 3 s for the
same reason): every rebalance revokes every partition (aiokafka's eager protocol), so each
member's revoke waits for its running jobs, up to the drain, before it rejoins. A trial
with a 10 s drain expelled members that were still draining (commits failed with
UnknownMemberId and IllegalGeneration), each expelled member rejoined as a new one, and the
group rebalanced for about a minute after the storm's last move.

PostgreSQL's ``max_connections`` is raised to 600 on the embedded server (64 workers each
hold a small pool and a LISTEN connection); each worker's pool is ``--db-pool``.

Writes docs/bench/fleet.json and fleet.png.

    python -m benchmarks.fleet [--workers 64] [--time-scale 10] [--max-num-seqs 1] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import random
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import func, select

from benchmarks import overload
from benchmarks.fleet_plot import plot_fleet
from benchmarks.harness import (
    OUT_DIR,
    TERMINAL,
    Bench,
    alter_system,
    job_rows,
    percentile,
    pipeline,
    services,
    write_report,
)
from benchmarks.overload import Counting, call
from benchmarks.trace import Arrival, Mix, backlog, trace
from plumbing.db import make_engine
from producers.lag.kafka import KafkaLagSource
from schemas.envelopes import JobEvent
from schemas.jobs import JobKind
from schemas.tables import jobs, outbox
from sluicegate.local.embedded import EmbeddedPostgres
from workers.consumer import Worker
from workers.engines.base import GenerationRequest
from workers.engines.sim.engine import SimEngine
from workers.service import run_worker

OUT = OUT_DIR / "fleet.json"
POLICIES: tuple[Literal["kv", "greedy"], ...] = ("kv", "greedy")
MAX_CONNECTIONS = 600
PHASES = ("warm", "burst", "settle", "storm", "tail", "drain")
# Every caller waits for its job. Deadlines of 2x-10x the service time (median 4x), looser
# than the overload benchmark's 1x-5x: a job here also crosses the relay and a partition
# whose one worker may be busy, and a warm-up at 65 % load should accept nearly every job.
MIX = Mix(ttl_median=4.0, ttl_range=(2.0, 10.0), cancel_share=0.0, leave_share=0.0)
SEED = 20261207


# --- services ---------------------------------------------------------------------------


async def raise_max_connections(pg: EmbeddedPostgres) -> None:
    """Room for a fleet's connections on the embedded PostgreSQL."""
    await alter_system(pg, "max_connections", str(MAX_CONNECTIONS))


# --- the engine, timed -------------------------------------------------------------------


class Timed(Counting):
    """The counting engine, also timing the wall seconds it had work (a request in it)."""

    def __init__(self, engine: SimEngine) -> None:
        super().__init__(engine)
        self._inside = 0
        self._since = 0.0
        self._busy = 0.0

    def busy_s(self) -> float:
        open_s = time.monotonic() - self._since if self._inside else 0.0
        return self._busy + open_s

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        if self._inside == 0:
            self._since = time.monotonic()
        self._inside += 1
        try:
            async for piece in super().generate(request):
                yield piece
        finally:
            self._inside -= 1
            if self._inside == 0:
                self._busy += time.monotonic() - self._since


@dataclass(frozen=True, kw_only=True)
class Roofline:
    """One engine kept saturated, in its own clock (time scale 0)."""

    jobs_per_s: float
    service_s: float  # median time in the engine of a job, batch full
    service_p99_s: float
    decode_s_per_token: float


async def roofline(max_num_seqs: int, warm_s: float = 10.0, measure_s: float = 30.0) -> Roofline:
    engine = SimEngine(max_num_seqs=max_num_seqs, time_scale=0.0)
    await engine.start()
    docs = backlog(300, MIX)
    done: list[tuple[float, float, int]] = []  # (started, finished, tokens), engine seconds
    tasks: list[asyncio.Task[None]] = []

    async def one(i: int) -> None:
        doc, max_tokens = docs[i % len(docs)]
        request = GenerationRequest(
            request_id=f"r{i}", kind=JobKind.SUMMARIZE, input=doc, max_tokens=max_tokens
        )
        started, tokens = engine.simulated_s, 0
        async for _ in engine.generate(request):
            tokens += 1
        done.append((started, engine.simulated_s, tokens))

    try:
        while engine.simulated_s < warm_s + measure_s:
            while len(tasks) - len(done) < max_num_seqs:  # the batch full, none waiting
                tasks.append(asyncio.create_task(one(len(tasks))))
            await asyncio.sleep(0)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await engine.close()
    window = [d for d in done if d[1] >= warm_s]
    service = [end - start for start, end, _ in window]
    return Roofline(
        jobs_per_s=len(window) / measure_s,
        service_s=statistics.median(service),
        service_p99_s=percentile(service, 0.99),
        decode_s_per_token=statistics.median(
            s / max(t, 1) for s, (_, _, t) in zip(service, window, strict=True)
        ),
    )


# --- the schedule ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Move:
    at_s: float
    kind: Literal["drain", "kill", "join"]
    pick: float  # which movable worker leaves: its index is pick x their count


@dataclass(frozen=True, kw_only=True)
class Plan:
    phases: dict[str, tuple[float, float]]  # name: (start, end), wall s from the first arrival
    rate: float  # arrivals/s outside the burst
    burst_rate: float
    arrivals: list[Arrival]
    moves: list[Move]

    def phase_at(self, at_s: float) -> str:
        for name, (start, end) in self.phases.items():
            if start <= at_s < end:
                return name
        return "drain"


def plan(args: argparse.Namespace, fleet_jobs_per_s: float, service_s: float) -> Plan:
    spans = [
        ("warm", args.warm_s),
        ("burst", args.burst_s),
        ("settle", args.settle_s),
        ("storm", args.storm_s),
        ("tail", args.tail_s),
    ]
    phases: dict[str, tuple[float, float]] = {}
    at = 0.0
    for name, span in spans:
        phases[name] = (at, at + span)
        at += span
    rate, burst_rate = args.load * fleet_jobs_per_s, args.burst * fleet_jobs_per_s
    arrivals: list[Arrival] = []
    for i, (name, (start, end)) in enumerate(phases.items()):
        phase_rate = burst_rate if name == "burst" else rate
        for a in trace(phase_rate, end - start, MIX, service_s=service_s, seed=args.seed + i):
            arrivals.append(dataclasses.replace(a, index=len(arrivals), at_s=start + a.at_s))
    return Plan(
        phases=phases,
        rate=rate,
        burst_rate=burst_rate,
        arrivals=arrivals,
        moves=storm_moves(phases["storm"], args.moves, args.seed),
    )


def storm_moves(storm: tuple[float, float], moves: int, seed: int) -> list[Move]:
    """``moves`` leaves (drained and killed in turn) and as many joins, a leave and a join
    about every (storm / moves) seconds, jittered."""
    rng = random.Random(seed)
    start, end = storm
    step = (end - start) / max(moves, 1)
    out: list[Move] = []
    for i in range(moves):
        at = start + i * step + rng.uniform(0.1, 0.4) * step
        out.append(Move(at_s=at, kind="kill" if i % 2 == 0 else "drain", pick=rng.random()))
        out.append(Move(at_s=at + rng.uniform(0.3, 0.6) * step, kind="join", pick=0.0))
    return sorted(out, key=lambda m: m.at_s)


# --- the fleet ---------------------------------------------------------------------------


@dataclass
class Member:
    index: int
    engine: Timed
    stop: asyncio.Event
    task: asyncio.Task[None] | None = None
    worker: Worker | None = None
    left: str | None = None  # "drain" or "kill"

    def assigned(self) -> int:
        if self.worker is None:
            return 0
        return len(self.worker.consumer.assignment())

    def generation(self) -> int | None:
        if self.worker is None:
            return None
        coordinator = self.worker.consumer._coordinator
        return None if coordinator is None else int(coordinator.generation)


@dataclass
class Fleet:
    bench: Bench
    args: argparse.Namespace
    members: list[Member] = field(default_factory=list)
    draining: list[asyncio.Task[None]] = field(default_factory=list)

    def join(self) -> Member:
        engine = Timed(
            SimEngine(max_num_seqs=self.args.max_num_seqs, time_scale=self.args.time_scale)
        )
        member = Member(len(self.members), engine, asyncio.Event())

        def seen(worker: Worker) -> None:
            member.worker = worker

        member.task = asyncio.create_task(
            run_worker(self.bench.settings, member.stop, engine=engine, on_worker=seen),
            name=f"worker-{member.index}",
        )
        self.members.append(member)
        return member

    def alive(self) -> list[Member]:
        return [m for m in self.members if m.left is None]

    def movable(self) -> list[Member]:
        """Every live member but the anchor (the group's leader, never stopped)."""
        return [m for m in self.alive() if m.index != 0 and m.worker is not None]

    def drain(self, member: Member) -> None:
        member.left = "drain"
        member.stop.set()
        if member.task is not None:
            self.draining.append(member.task)

    def kill(self, member: Member) -> None:
        """As close to SIGKILL as a task gets: no heartbeat, no commit, no LeaveGroup, its
        jobs stopped where they are; the group waits for the session to time out."""
        member.left = "kill"
        worker = member.worker
        if worker is not None:
            coordinator = worker.consumer._coordinator
            if coordinator is not None:
                heartbeat = coordinator._heartbeat_task
                if heartbeat is not None:
                    heartbeat.cancel()

                async def no_leave() -> None:
                    coordinator.reset_generation()

                coordinator._maybe_leave_group = no_leave

            async def no_commit() -> None:
                return None

            setattr(worker, "commit", no_commit)  # noqa: B010 (an instance's method)
            for job in list(worker._tasks):
                job.cancel()
        if member.task is not None:
            member.task.cancel()
            self.draining.append(member.task)

    def apply(self, move: Move) -> dict[str, Any]:
        if move.kind == "join":
            member = self.join()
        else:
            movable = self.movable()
            if not movable:
                return {"kind": move.kind, "skipped": "no movable worker"}
            member = movable[min(int(move.pick * len(movable)), len(movable) - 1)]
            running = member.engine.capacity().running
            (self.kill if move.kind == "kill" else self.drain)(member)
            return {"kind": move.kind, "worker": member.index, "engine_running": running}
        return {"kind": "join", "worker": member.index}

    def settled(self) -> bool:
        """Every live member holds partitions, all of one generation."""
        alive = self.alive()
        generations = {m.generation() for m in alive}
        return all(m.assigned() for m in alive) and len(generations) == 1

    async def start(self, count: int, within_s: float) -> float:
        """The anchor first (it forms the group), then the others; seconds until settled."""
        t0 = time.monotonic()
        anchor = self.join()
        while not anchor.assigned():
            await self._wait(t0, within_s)
        for _ in range(count - 1):
            self.join()
        while not self.settled():
            await self._wait(t0, within_s)
        return time.monotonic() - t0

    async def _wait(self, t0: float, within_s: float) -> None:
        if time.monotonic() - t0 > within_s:
            raise TimeoutError(f"the group did not settle within {within_s:.0f}s")
        for member in self.members:
            if member.task is not None and member.task.done() and member.left is None:
                member.task.result()  # a worker that died by itself says why
        await asyncio.sleep(0.2)

    async def stop(self) -> None:
        for member in self.alive():
            member.left = "end"
            member.stop.set()
        tasks = [m.task for m in self.members if m.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    def engines(self) -> list[Timed]:
        return [m.engine for m in self.members]


# --- sampling ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Sample:
    at_s: float
    alive: int
    assigned: int  # live members holding partitions
    generations: int  # distinct generations among live members
    generation: int  # the highest
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
                lag=snapshot.lag,
                consumer_lag=int(monitor._state.consumer_lag),
                lag_known=snapshot.known,
                engine_running=sum(c.running for c in caps),
                engine_waiting=sum(c.waiting for c in caps),
                db_running=await running_in_db(fleet.bench),
                submitted=submitted(),
                accepted=len(accepted),
                refused=sum(overload.REFUSALS.values()),
                engine_s=sum(e.engine.simulated_s for e in engines),
                busy_s=sum(e.busy_s() for e in engines),
                cpu_s=time.process_time(),
                late_ms=round(late * 1000, 1),
            )
        )
        slept = time.monotonic()
        await asyncio.sleep(1.0)
        late = time.monotonic() - slept - 1.0


# --- one run -----------------------------------------------------------------------------


def overrides(args: argparse.Namespace, policy: str, roof: Roofline) -> dict[str, object]:
    fleet_jobs_per_s = args.workers * roof.jobs_per_s / args.time_scale
    p99_s = roof.service_p99_s * args.time_scale
    return {
        "partitions": args.partitions,
        "pull_policy": policy,
        "sim_time_scale": args.time_scale,
        "sim_max_num_seqs": args.max_num_seqs,
        "worker_db_pool_size": args.db_pool,
        "drain_timeout_s": args.drain_s,
        # Admission as the overload benchmark sets it: capacity x (p99 service + s).
        "lag_soft": round(fleet_jobs_per_s * (p99_s + overload.LAG_SOFT_S)),
        "lag_hard": round(fleet_jobs_per_s * (p99_s + overload.LAG_HARD_S)),
        "max_blocked": 1024,
        "max_block_ms": 3000,
        "expected_token_time_s": roof.decode_s_per_token * args.time_scale,
        "retry_after_max_s": 10.0,
        "max_input_bytes": 1_000_000,
    }


async def run_policy(
    admin: str, bootstrap: str, policy: str, args: argparse.Namespace, roof: Roofline, sched: Plan
) -> dict[str, Any]:
    overload.REFUSALS.clear()
    settings = overrides(args, policy, roof)
    started = time.monotonic()
    async with pipeline(admin, bootstrap, **settings) as bench:
        bench.start_relay()
        fleet = Fleet(bench, args)
        settle_s = await fleet.start(args.workers, args.start_max_s)
        print(f"{policy}: {args.workers} workers settled in {settle_s:.1f}s", flush=True)
        accepted: dict[str, Arrival] = {}
        samples: list[Sample] = []
        moves: list[dict[str, Any]] = []
        t0, wall0 = time.monotonic(), datetime.now(UTC)
        calls = [call(bench, a, t0, wall0, accepted) for a in sched.arrivals]
        sampling = asyncio.create_task(
            sampler(fleet, t0, lambda: due(sched, t0), accepted, samples)
        )
        storming = asyncio.create_task(storm(fleet, sched.moves, t0, moves))
        await asyncio.gather(*calls)
        await storming
        end_s = time.monotonic() - t0
        terminal = await wait_terminal(bench, accepted, args.drain_max_s)
        drained_s = time.monotonic() - t0
        caught = await caught_up(bench, within_s=30.0)
        sampling.cancel()
        await asyncio.gather(sampling, return_exceptions=True)
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
            where=jobs.c.tenant == overload.TENANT,
        )
        events = await terminal_events(bench)
        stopping = time.monotonic()
        await fleet.stop()
        stop_s = time.monotonic() - stopping
    rows = [r for r in rows if r["id"] in accepted]
    result = {
        "policy": policy,
        "settle_s": round(settle_s, 1),
        "arrivals_end_s": round(end_s, 1),
        "all_terminal": terminal,
        "all_terminal_s": round(drained_s, 1),
        "caught_up": caught,
        "stop_s": round(stop_s, 1),
        "run_s": round(time.monotonic() - started, 1),
        "refusals_by_reason": dict(overload.REFUSALS),
        "moves": moves,
    }
    return summarize(result, rows, events, samples, sched, wall0, args)


def due(sched: Plan, t0: float) -> int:
    """Arrivals due by now (each submits at its time, or a moment after)."""
    now = time.monotonic() - t0
    return sum(1 for a in sched.arrivals if a.at_s <= now)


async def storm(fleet: Fleet, moves: list[Move], t0: float, log: list[dict[str, Any]]) -> None:
    for move in moves:
        await asyncio.sleep(max(0.0, move.at_s - (time.monotonic() - t0)))
        alive = fleet.alive()
        generation = max((g for g in (m.generation() for m in alive) if g is not None), default=0)
        entry = fleet.apply(move)
        entry.update(at_s=round(time.monotonic() - t0, 2), generation_before=generation)
        log.append(entry)


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


# --- figures -----------------------------------------------------------------------------


def per_second(rows: list[dict[str, Any]], wall0: datetime, horizon: int) -> list[list[float]]:
    """[s, jobs succeeded, output tokens] for each second from the first arrival."""
    jobs_s = [0] * (horizon + 1)
    tokens_s = [0] * (horizon + 1)
    for r in rows:
        if r["state"] != "succeeded" or r["finished_at"] is None:
            continue
        at = int((r["finished_at"] - wall0).total_seconds())
        if 0 <= at <= horizon:
            jobs_s[at] += 1
            tokens_s[at] += (r["result"] or {}).get("output_tokens", 0)
    return [[s, jobs_s[s], tokens_s[s]] for s in range(horizon + 1)]


def rolling(values: list[float], width: int) -> list[float]:
    return [sum(values[max(0, i - width + 1) : i + 1]) / width for i in range(len(values))]


def recovery(goodput: list[list[float]], sched: Plan, width: int = 5) -> float | None:
    """Seconds from the storm's end until the goodput (a ``width``-s mean) is back to 90 %
    of the warm-up's second half; None if it never is."""
    warm_start, warm_end = sched.phases["warm"]
    half = [g[1] for g in goodput if (warm_start + warm_end) / 2 <= g[0] < warm_end]
    target = 0.9 * (sum(half) / len(half)) if half else 0.0
    smooth = rolling([g[1] for g in goodput], width)
    storm_end = sched.phases["storm"][1]
    for g, mean in zip(goodput, smooth, strict=True):
        if g[0] >= storm_end and mean >= target:
            return round(g[0] - storm_end, 1)
    return None


def phase_figures(
    samples: list[Sample], goodput: list[list[float]], sched: Plan, time_scale: float
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (start, end) in sched.phases.items():
        inside = [s for s in samples if start <= s.at_s < end]
        seconds = [g for g in goodput if start <= g[0] < end]
        span = max(end - start, 1e-9)
        figures: dict[str, Any] = {
            "goodput_jobs_per_s": round(sum(g[1] for g in seconds) / span, 2),
            "goodput_output_tokens_per_s": round(sum(g[2] for g in seconds) / span, 1),
        }
        if len(inside) >= 2:
            first, last = inside[0], inside[-1]
            busy = last.busy_s - first.busy_s
            wall = last.at_s - first.at_s
            figures.update(
                engine_speed=round((last.engine_s - first.engine_s) * time_scale / busy, 3)
                if busy > 0
                else None,
                process_cpu_share=round((last.cpu_s - first.cpu_s) / wall, 3),
                lag_max=max(s.lag for s in inside),
                event_loop_late_p99_ms=percentile([s.late_ms for s in inside], 0.99),
            )
        out[name] = figures
    return out


def rebalances(samples: list[Sample], moves: list[dict[str, Any]]) -> dict[str, Any]:
    """For each move: seconds until the live members next all hold partitions of one newer
    generation (from the 1-s samples)."""
    settle: dict[str, list[float]] = {"join": [], "drain": [], "kill": []}
    unsettled_moves = 0
    for move in moves:
        if "skipped" in move:
            continue
        later = [
            s
            for s in samples
            if s.at_s >= move["at_s"]
            and s.generation > move["generation_before"]
            and s.generations == 1
            and s.assigned == s.alive
        ]
        if later:
            settle[move["kind"]].append(round(later[0].at_s - move["at_s"], 1))
        else:
            unsettled_moves += 1
    gens = [s.generation for s in samples]
    last = max((m["at_s"] for m in moves), default=None)
    after = [
        s
        for s in samples
        if last is not None and s.at_s >= last and s.generations == 1 and s.assigned == s.alive
    ]
    return {
        "settled_after_last_move_s": round(after[0].at_s - last, 1)
        if after and last is not None
        else None,
        "generations_seen": (max(gens) - min(gens)) if gens else 0,
        "settle_after_move_s": {
            k: {
                "median": statistics.median(v) if v else None,
                "max": max(v, default=None),
                "count": len(v),
            }
            for k, v in settle.items()
        },
        "moves_never_settled_after": unsettled_moves,
        "seconds_unsettled": sum(1 for s in samples if s.generations != 1 or s.assigned != s.alive),
    }


def summarize(
    result: dict[str, Any],
    rows: list[dict[str, Any]],
    events: list[JobEvent],
    samples: list[Sample],
    sched: Plan,
    wall0: datetime,
    args: argparse.Namespace,
) -> dict[str, Any]:
    horizon = int(max((s.at_s for s in samples), default=0.0)) + 1
    goodput = per_second(rows, wall0, horizon)
    states = Counter(r["state"] for r in rows)
    expired = [r for r in rows if r["state"] == "expired"]
    stages = Counter((r["error"] or {}).get("stage", "unknown") for r in expired)
    attempts = {r["id"]: r["attempt"] for r in rows}
    ends = Counter(e.job_id for e in events if e.job_id in attempts)
    stale = [e for e in events if e.job_id in attempts and e.attempt != attempts[e.job_id]]
    phases = phase_figures(samples, goodput, sched, args.time_scale)
    lags = [s.lag for s in samples if s.at_s < sched.phases["tail"][1]]
    run_span = sched.phases["tail"][1]
    succeeded = [g for g in goodput if g[0] < run_span]
    speeds = [f["engine_speed"] for f in phases.values() if f.get("engine_speed") is not None]
    summary = {
        "arrivals": len(sched.arrivals),
        "accepted": len(rows),
        "never_accepted": len(sched.arrivals) - len(rows),
        "refused_attempts": sum(result["refusals_by_reason"].values()),
        "succeeded": states["succeeded"],
        "goodput_jobs_per_s": round(sum(g[1] for g in succeeded) / run_span, 2),
        "goodput_output_tokens_per_s": round(sum(g[2] for g in succeeded) / run_span, 1),
        "goodput_burst_jobs_per_s": phases["burst"]["goodput_jobs_per_s"],
        "goodput_storm_jobs_per_s": phases["storm"]["goodput_jobs_per_s"],
        "goodput_warm_jobs_per_s": phases["warm"]["goodput_jobs_per_s"],
        "lag_max": max(lags, default=0),
        "lag_p95": percentile([float(x) for x in lags], 0.95) if lags else None,
        "deadline_misses": len(expired),
        "deadline_misses_by_stage": dict(stages),
        "states": dict(states),
        "non_terminal": sum(v for k, v in states.items() if k not in TERMINAL),
        "takeovers": sum(1 for a in attempts.values() if a > 1),
        "duplicates": sum(1 for n in ends.values() if n > 1) + len(stale),
        "jobs_without_terminal_event": sum(
            1 for r in rows if r["state"] in TERMINAL and ends[r["id"]] == 0
        ),
        "recovery_s_after_storm": recovery(goodput, sched),
        "engine_speed_min": min(speeds, default=None),
        "process_cpu_share_max": max(
            (f["process_cpu_share"] for f in phases.values() if "process_cpu_share" in f),
            default=None,
        ),
        "kills": sum(1 for m in result["moves"] if m["kind"] == "kill" and "skipped" not in m),
        "drains": sum(1 for m in result["moves"] if m["kind"] == "drain" and "skipped" not in m),
        "joins": sum(1 for m in result["moves"] if m["kind"] == "join"),
    }
    return {
        **result,
        "summary": summary,
        "phases": phases,
        "rebalances": rebalances(samples, result["moves"]),
        "goodput_per_s": goodput,
        "samples": [dataclasses.asdict(s) for s in samples],
    }


# --- the whole benchmark -----------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    roof = await roofline(args.max_num_seqs)
    fleet_jobs_per_s = args.workers * roof.jobs_per_s / args.time_scale
    service_s = roof.service_s * args.time_scale
    sched = plan(args, fleet_jobs_per_s, service_s)
    print(
        f"roofline: {roof.jobs_per_s:.2f} jobs/s an engine, fleet {fleet_jobs_per_s:.2f} jobs/s "
        f"at time scale {args.time_scale}; service {service_s:.1f}s; {len(sched.arrivals)} "
        "arrivals",
        flush=True,
    )
    runs: dict[str, dict[str, Any]] = {}
    async with services(raise_max_connections) as (admin, bootstrap):
        for policy in args.policies:
            runs[policy] = await run_policy(admin, bootstrap, policy, args, roof, sched)
            print(f"{policy}: {runs[policy]['summary']}", flush=True)
    return {
        "config": config(args, roof, sched, fleet_jobs_per_s, service_s),
        "summary": {policy: r["summary"] for policy, r in runs.items()},
        "runs": runs,
    }


def config(
    args: argparse.Namespace,
    roof: Roofline,
    sched: Plan,
    fleet_jobs_per_s: float,
    service_s: float,
) -> dict[str, Any]:
    return {
        "workers": args.workers,
        "partitions": args.partitions,
        "time_scale": args.time_scale,
        "max_num_seqs": args.max_num_seqs,
        "engine_model": "simulator: Llama 8B on an 80 GB GPU (roofline step times)",
        "engine_roofline_jobs_per_s": round(roof.jobs_per_s, 3),
        "engine_service_s_roofline": round(roof.service_s, 3),
        "fleet_capacity_jobs_per_s_wall": round(fleet_jobs_per_s, 3),
        "service_s_wall": round(service_s, 2),
        "load": args.load,
        "burst": args.burst,
        "rate_jobs_per_s": round(sched.rate, 3),
        "burst_rate_jobs_per_s": round(sched.burst_rate, 3),
        "phases_s": {k: [round(a, 1), round(b, 1)] for k, (a, b) in sched.phases.items()},
        "moves": args.moves,
        "drain_timeout_s": args.drain_s,
        "db_pool_per_worker": args.db_pool,
        "seed": args.seed,
        "mix": MIX.__dict__,
        "policies": list(args.policies),
        "workers_as": "asyncio tasks of one process, one consumer, pool and engine each",
        "anchor": "worker 0 (the group's first member and leader) is never stopped",
        "kill": "heartbeat cancelled, LeaveGroup and commits disabled, jobs cancelled, task "
        "cancelled: the group waits for the session timeout",
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--partitions", type=int, default=128)
    parser.add_argument("--time-scale", type=float, default=10.0, help="x roofline step time")
    parser.add_argument("--max-num-seqs", type=int, default=1, help="each engine's batch")
    parser.add_argument("--load", type=float, default=0.65, help="x fleet capacity")
    parser.add_argument("--burst", type=float, default=3.0, help="x fleet capacity")
    parser.add_argument("--warm-s", type=float, default=40.0)
    parser.add_argument("--burst-s", type=float, default=15.0)
    parser.add_argument("--settle-s", type=float, default=20.0)
    parser.add_argument("--storm-s", type=float, default=60.0)
    parser.add_argument("--tail-s", type=float, default=60.0)
    parser.add_argument("--moves", type=int, default=16, help="leaves (and joins) in the storm")
    # Well within the 10 s the embedded broker gives a member to rejoin a rebalance (a
    # member still draining after that is expelled, and its rejoin is one more rebalance).
    parser.add_argument("--drain-s", type=float, default=4.0, help="a worker's drain timeout")
    parser.add_argument("--db-pool", type=int, default=2, help="each worker's database pool")
    parser.add_argument("--start-max-s", type=float, default=120.0)
    parser.add_argument("--drain-max-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--quick", action="store_true", help="4 workers, a short schedule")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/fleet.json")
    return parser


def quick(args: argparse.Namespace) -> None:
    args.workers, args.partitions = min(args.workers, 4), min(args.partitions, 8)
    args.time_scale = min(args.time_scale, 4.0)
    args.warm_s, args.burst_s, args.settle_s = 6.0, 3.0, 2.0
    args.storm_s, args.tail_s, args.moves = 6.0, 2.0, 2
    args.drain_s, args.drain_max_s = 3.0, 15.0


def headline(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for policy, s in report["summary"].items():
        out[f"{policy}: goodput jobs/s (storm)"] = (
            f"{s['goodput_jobs_per_s']} ({s['goodput_storm_jobs_per_s']})"
        )
        out[f"{policy}: deadline misses, duplicates"] = f"{s['deadline_misses']}, {s['duplicates']}"
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        quick(args)
    logging.basicConfig(level=logging.ERROR)
    report = asyncio.run(run(args))
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out, lambda png: plot_fleet(report, path=png))
    return report


if __name__ == "__main__":
    main()
