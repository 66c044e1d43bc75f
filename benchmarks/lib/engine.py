"""The engine alone: a wrapper that counts what it decodes, its capacity on a saturating
backlog, the admission thresholds taken from that capacity, and the naive pipeline.

The naive pipeline hands every arrival straight to the engine in arrival order (the engine's
queue is FIFO, as vLLM's is): nothing is refused, nothing is dropped, nothing is aborted, and
a caller's cancel or departure goes unheard.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from benchmarks.lib.trace import Arrival, Mix, backlog
from schemas.jobs import JobKind
from workers.engines.base import Capacity as EngineCapacity
from workers.engines.base import Finished, Generation, GenerationRequest
from workers.engines.sim.engine import SimEngine

QUEUE_DEPTH = 64  # requests kept waiting in the engine while its capacity is measured
# Admission thresholds: capacity x (p99 service time + these seconds). The lag counts the
# jobs running (about capacity x mean service time, Little's law) and the queue behind them;
# on the p99 the queue holds about capacity x (p99 - mean) + 2 s, enough to refill the
# engine when jobs that started together end together.
LAG_SOFT_S = 2.0
LAG_HARD_S = 5.0


class Counting:
    """The engine, counting the tokens it hands out per job, the jobs it received and the
    jobs whose output it finished."""

    name = "sim"
    served_model = "sim"

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.tokens: Counter[str] = Counter()  # by job id
        self.received: set[str] = set()  # job ids the engine was handed
        self.finished = 0  # generations that ran to their end

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.close()

    def count_tokens(self, text: str) -> int:
        return self.engine.count_tokens(text)

    def context_tokens(self) -> int | None:
        return self.engine.context_tokens()

    async def prompt_tokens(self, request: GenerationRequest) -> int:
        return await self.engine.prompt_tokens(request)

    def capacity(self) -> EngineCapacity:
        return self.engine.capacity()

    def generate(self, request: GenerationRequest) -> Generation:
        return Generation(self._counted(request))

    async def _counted(self, request: GenerationRequest) -> AsyncGenerator[str | Finished, None]:
        job_id = request.request_id.split(":")[0]
        self.received.add(job_id)
        async with contextlib.aclosing(self.engine.generate(request).items()) as items:
            async for item in items:
                if isinstance(item, str):
                    self.tokens[job_id] += 1
                yield item
        self.finished += 1

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)


@dataclass
class Run:
    """One request's life in the engine, in seconds from the start of the run."""

    arrival: Arrival | None
    started_s: float = 0.0
    first_s: float | None = None
    finished_s: float | None = None
    tokens: int = 0


async def _consume(
    engine: SimEngine, run: Run, request: GenerationRequest, t0: float | None
) -> None:
    """Stream one request; times from ``t0`` by the wall clock, or (None) by the engine's
    simulated clock."""

    def now() -> float:
        return engine.simulated_s if t0 is None else time.monotonic() - t0

    run.started_s = now()
    async for _ in engine.generate(request):
        if run.first_s is None:
            run.first_s = now()
        run.tokens += 1
    run.finished_s = now()


def _request(i: int, doc: str, max_tokens: int) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"r{i}", kind=JobKind.SUMMARIZE, input=doc, max_tokens=max_tokens
    )


@dataclass(frozen=True, kw_only=True)
class Capacity:
    jobs_per_s: float
    decode_s_per_token: float  # median, per job, after its first token
    service_s: float  # median time in the engine of a job, queue of QUEUE_DEPTH included
    service_p99_s: float
    measured_s: float  # of engine time


async def capacity(
    mix: Mix, *, time_scale: float, warm_s: float = 40.0, measure_s: float = 60.0
) -> Capacity:
    """Completions per second of the engine kept saturated (a queue always waiting).

    Run in the simulator's own clock (time scale 0, steps back to back) and converted to
    ``time_scale``: a saturated engine takes tens of seconds to reach its steady state.
    """
    engine = SimEngine(time_scale=0.0)
    await engine.start()
    docs = backlog(500, mix)  # reused in turn: the engine keeps no cache of prompts
    runs: list[Run] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        depth = engine.capacity().max_running or 256
        finished = 0
        while engine.simulated_s < warm_s + measure_s:
            # Top up to every sequence slot plus a queue, all at once: the engine steps
            # whenever this loop yields.
            while len(runs) - finished < depth + QUEUE_DEPTH:
                run = Run(arrival=None)
                runs.append(run)
                request = _request(len(runs), *docs[len(runs) % len(docs)])
                tasks.append(asyncio.create_task(_consume(engine, run, request, None)))
            await asyncio.sleep(0)
            finished = sum(1 for r in runs if r.finished_s is not None)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await engine.close()
    window = [r for r in runs if r.finished_s is not None and warm_s <= r.finished_s]
    per_token = [
        (r.finished_s - r.first_s) / (r.tokens - 1)
        for r in window
        if r.finished_s is not None and r.first_s is not None and r.tokens > 1
    ]
    service = [r.finished_s - r.started_s for r in window if r.finished_s is not None]
    return Capacity(
        jobs_per_s=len(window) / measure_s / time_scale,
        decode_s_per_token=statistics.median(per_token) * time_scale,
        service_s=statistics.median(service) * time_scale,
        service_p99_s=statistics.quantiles(service, n=100)[98] * time_scale,
        measured_s=measure_s,
    )


async def run_naive(arrivals: list[Arrival], *, engine: SimEngine) -> list[Run]:
    """Every arrival into the engine at its time; measured until no unfinished job can
    still meet its deadline."""
    await engine.start()
    runs = [Run(arrival=a) for a in arrivals]
    t0 = time.monotonic()

    async def arrive(run: Run, arrival: Arrival) -> None:
        await asyncio.sleep(max(0.0, arrival.at_s - (time.monotonic() - t0)))
        await _consume(engine, run, _request(arrival.index, arrival.doc, arrival.max_tokens), t0)

    tasks = [asyncio.create_task(arrive(r, a)) for r, a in zip(runs, arrivals, strict=True)]
    last_arrival = arrivals[-1].at_s
    try:
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic() - t0
            open_deadlines = [
                r.arrival.at_s + r.arrival.ttl_s
                for r in runs
                if r.finished_s is None and r.arrival is not None
            ]
            if now > last_arrival and (not open_deadlines or max(open_deadlines) < now):
                break
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        await engine.close()
    return runs
