"""The fleet benchmark's schedule: one engine's roofline capacity (measured in the
simulator's own clock), then the phases (warm-up, burst, settle, storm, tail) with their
Poisson arrivals, and the storm's moves (a worker leaves, drained or killed in turn, and a
new one joins)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import statistics
from dataclasses import dataclass
from typing import Literal

from benchmarks.lib.reports import percentile
from benchmarks.lib.trace import Arrival, Mix, backlog, trace
from schemas.jobs import JobKind
from workers.engines.base import GenerationRequest
from workers.engines.sim.engine import SimEngine

# Every caller waits for its job. Deadlines of 2x-10x the service time (median 4x), looser
# than the overload benchmark's 1x-5x: a job here also crosses the relay and a partition
# whose one worker may be busy, and a warm-up at 65 % load should accept nearly every job.
MIX = Mix(ttl_median=4.0, ttl_range=(2.0, 10.0), cancel_share=0.0, leave_share=0.0)
SEED = 20261207


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


@dataclass(frozen=True, kw_only=True)
class Move:
    at_s: float
    kind: Literal["drain", "kill", "join"]
    pick: float  # which movable worker leaves: its index is pick x their count
    leader: bool = False  # the group's leader leaves (then pick is not used)


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
    """``moves`` leaves (killed and drained in turn, the leader killed first) and as many
    joins, a leave and a join about every (storm / moves) seconds, jittered."""
    rng = random.Random(seed)
    start, end = storm
    step = (end - start) / max(moves, 1)
    out: list[Move] = []
    for i in range(moves):
        at = start + i * step + rng.uniform(0.1, 0.4) * step
        kind: Literal["drain", "kill"] = "kill" if i % 2 == 0 else "drain"
        # The first kill is the group's leader's: the group must re-form without it.
        out.append(Move(at_s=at, kind=kind, pick=rng.random(), leader=i == 0))
        out.append(Move(at_s=at + rng.uniform(0.3, 0.6) * step, kind="join", pick=0.0))
    return sorted(out, key=lambda m: m.at_s)
