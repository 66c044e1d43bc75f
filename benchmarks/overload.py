"""Overload with deadlines: Sluicegate against a naive pipeline on the same arrival trace.

First the engine's capacity is measured (the simulator kept saturated, on the same job mix).
Then one trace of arrivals at ``--overload`` times that capacity for ``--duration`` seconds of
the simulated GPU's time (``--time-scale`` times as many wall seconds: the simulator runs that
much slower than the GPU it models, so that this machine's CPU keeps up), deadlines from a
log-normal spread, 5 % of callers cancelling and 5 % going away (they stop polling, their
heartbeat lease lapses), is run twice in this process:

- Sluicegate: the API (admission on lag, deadline-aware), the outbox relay, one KV-gated
  worker with its pre-decode gate and mid-decode aborts, on real PostgreSQL and the broker;
- naive: every arrival straight into the same engine, FIFO, no admission, no drops.

Figures: goodput (jobs finished by their deadline per second) over the engine's capacity,
decode tokens wasted (on jobs that did not finish in time or whose caller left), tokens
decoded for jobs dropped before decode, completed jobs past their deadline, and the p50/p99
latency of completed jobs. Writes docs/bench/overload.json and docs/bench/overload.png.

    python -m benchmarks.overload [--duration 60] [--overload 3] [--time-scale 4] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import OUT_DIR, TERMINAL, Bench, percentile, pipeline, services
from benchmarks.harness import job_rows as rows_of
from benchmarks.naive import Capacity, Run, capacity, run_naive
from benchmarks.plot import plot_overload
from benchmarks.trace import Arrival, Mix, trace
from schemas import constants
from schemas.tables import jobs
from workers.engines.base import Capacity as EngineCapacity
from workers.engines.base import GenerationRequest
from workers.engines.sim.engine import SimEngine
from workers.service import run_worker

OUT = OUT_DIR / "overload.json"
TENANT = "bench"
LEASE_S = 3.0  # the leaving callers' heartbeat lease; they poll every LEASE_S / 3
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

    def capacity(self) -> EngineCapacity:
        return self.engine.capacity()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        job_id = request.request_id.split(":")[0]
        self.received.add(job_id)
        async for piece in self.engine.generate(request):
            self.tokens[job_id] += 1
            yield piece
        self.finished += 1

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)


async def call(
    bench: Bench, arrival: Arrival, t0: float, wall0: datetime, accepted: dict[str, Arrival]
) -> None:
    """One caller: submit (retrying on 429/503 while its deadline allows), then cancel,
    or poll and go away, as the trace says."""
    await asyncio.sleep(max(0.0, arrival.at_s - (time.monotonic() - t0)))
    deadline = wall0 + timedelta(seconds=arrival.at_s + arrival.ttl_s)
    body: dict[str, Any] = {
        "kind": "summarize",
        "input": arrival.doc,
        "max_tokens": arrival.max_tokens,
        "deadline": deadline.isoformat(),
    }
    if arrival.action == "leave":
        body["abandon_after_s"] = LEASE_S
    headers = {constants.HEADER_TENANT: TENANT}
    while True:
        r = await bench.client.post("/v1/jobs", json=body, headers=headers)
        if r.status_code == 202:
            break
        REFUSALS[refusal_reason(r)] += 1
        if r.status_code not in (429, 503):
            return  # refused for good (deadline unreachable, or already past)
        wait_s = float(r.headers.get("Retry-After", "1"))
        if datetime.now(UTC) + timedelta(seconds=wait_s) >= deadline:
            return
        await asyncio.sleep(wait_s)
    job_id = r.json()["id"]
    accepted[job_id] = arrival
    act_at = arrival.at_s + arrival.action_after_s
    if arrival.action == "cancel":
        await asyncio.sleep(max(0.0, act_at - (time.monotonic() - t0)))
        await bench.client.delete(f"/v1/jobs/{job_id}", headers=headers)
    elif arrival.action == "leave":
        while time.monotonic() - t0 < act_at:
            view = await bench.client.get(f"/v1/jobs/{job_id}", headers=headers)
            if view.json().get("state") in TERMINAL:
                return
            await asyncio.sleep(LEASE_S / 3)


REFUSALS: Counter[str] = Counter()  # every refused attempt, retried or not, by reason


def refusal_reason(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return str(r.status_code)
    return str(body.get("reason") or body.get("error", {}).get("code") or r.status_code)


async def warm_up(bench: Bench, count: int) -> None:
    """Let the worker join its group and measure the engine's speed on a few jobs."""
    ids = []
    for _ in range(count):
        r = await bench.client.post(
            "/v1/jobs",
            json={"kind": "summarize", "input": "A short warm-up note. " * 40, "max_tokens": 64},
            headers={constants.HEADER_TENANT: "warmup"},
        )
        ids.append(r.json()["id"])
    async with asyncio.timeout(120):
        for job_id in ids:
            while True:
                view = await bench.client.get(
                    f"/v1/jobs/{job_id}", headers={constants.HEADER_TENANT: "warmup"}
                )
                if view.json()["state"] in TERMINAL:
                    break
                await asyncio.sleep(0.2)


async def run_sluicegate(
    admin: str,
    bootstrap: str,
    arrivals: list[Arrival],
    cap: Capacity,
    time_scale: float,
    max_prefill_tokens: int | None = None,
    partitions: int = 4,
    lag_measure: str = "open",
    deadline_aware: bool = True,
) -> tuple[list[dict[str, Any]], Counting, dict[str, Any]]:
    overrides: dict[str, object] = {
        "lag_soft": round(cap.jobs_per_s * (cap.service_p99_s + LAG_SOFT_S)),
        "lag_hard": round(cap.jobs_per_s * (cap.service_p99_s + LAG_HARD_S)),
        "max_blocked": 1024,
        "max_block_ms": 3000,
        # Deadline-aware admission: the queue wait (lag less running, over the drain rate)
        # plus max_tokens x the measured time per output token (deadline_speed), or the
        # saturated one until the warm-up jobs are timed.
        "expected_token_time_s": cap.decode_s_per_token,
        "deadline_aware": deadline_aware,
        # Before the first job ends the drain rate is unknown and Retry-After would be this
        # cap; these callers' deadlines are tens of seconds.
        "retry_after_max_s": 10.0,
        # Optional: pace refills (prompt tokens in prefill at once; --max-prefill-tokens).
        "worker_max_prefill_tokens": max_prefill_tokens,
        "max_input_bytes": 1_000_000,
        "partitions": partitions,
        "sim_time_scale": time_scale,
        "lag_measure": lag_measure,
    }
    async with pipeline(admin, bootstrap, **overrides) as bench:
        bench.start_relay()
        engine = Counting(SimEngine(time_scale=time_scale))
        bench.tasks.append(
            asyncio.create_task(run_worker(bench.settings, bench.stop, engine=engine))
        )
        await warm_up(bench, bench.settings.speed_min_samples)
        accepted: dict[str, Arrival] = {}
        t0, wall0 = time.monotonic(), datetime.now(UTC)
        tokens0 = engine.engine.tokens_decoded
        samples: list[Sample] = []
        sampler = asyncio.create_task(sample(engine.engine, bench, t0, samples))
        await asyncio.gather(*(call(bench, a, t0, wall0, accepted) for a in arrivals))
        await wait_all_terminal(bench, accepted)
        sampler.cancel()
        await asyncio.sleep(1.0)  # aborted jobs write their decoded tokens last
        rows = await job_rows(bench)
        settings = {k: getattr(bench.settings, k) for k in overrides}
    outcomes = []
    for row in rows:
        arrival = accepted.get(row["id"])
        if arrival is None:
            continue
        outcomes.append(
            {
                **row,
                "arrival": arrival,
                "arrived_at": wall0 + timedelta(seconds=arrival.at_s),
                "created_s": (row["created_at"] - wall0).total_seconds(),
                "started_s": None
                if row["started_at"] is None
                else (row["started_at"] - wall0).total_seconds(),
                "finished_s": (row["finished_at"] - wall0).total_seconds(),
            }
        )
    settings["engine_tokens_decoded"] = engine.engine.tokens_decoded - tokens0
    settings["samples"] = samples
    return outcomes, engine, settings


@dataclass(frozen=True)
class Sample:
    at_s: float
    running: int  # in the engine
    waiting: int  # queued inside the engine
    lag: int  # the admission's reading of the worker group's lag
    engine_s: float  # the engine's own clock
    cpu_s: float  # this process's CPU time
    late_s: float  # how late the sampler's last one-second sleep woke (the event loop's lag)
    refused: int  # refused submits so far, retried or not


async def sample(engine: SimEngine, bench: Bench, t0: float, out: list[Sample]) -> None:
    """The engine's load and the lag, every second."""
    late = 0.0
    while True:
        cap = engine.capacity()
        lag = bench.app.state.monitor.snapshot().lag
        out.append(
            Sample(
                time.monotonic() - t0,
                cap.running,
                cap.waiting,
                lag,
                engine.simulated_s,
                time.process_time(),
                late,
                sum(REFUSALS.values()),
            )
        )
        slept = time.monotonic()
        await asyncio.sleep(1.0)
        late = time.monotonic() - slept - 1.0


def engine_use(samples: list[Sample], time_scale: float) -> dict[str, Any]:
    """How busy the engine was and whether the CPU kept up, from the first arrival to the
    engine's last busy second (the idle wait for the last terminal writes is left out)."""
    while samples and samples[-1].running == 0:
        samples = samples[:-1]
    if len(samples) < 2:
        return {}
    busy = [s for s in samples if s.running > 0]
    first, last = samples[0], samples[-1]
    wall = last.at_s - first.at_s
    return {
        "engine_busy_share": round(len(busy) / len(samples), 3),
        "engine_speed_while_running": round(
            (last.engine_s - first.engine_s) * time_scale / max(len(busy), 1), 3
        ),
        "process_cpu_share": round((last.cpu_s - first.cpu_s) / wall, 3),
        "mean_running": round(sum(s.running for s in samples) / len(samples), 1),
        # [s, running, waiting in the engine, lag, event loop late (ms), refusals per s]
        "every_5_s": [
            [
                round(s.at_s),
                s.running,
                s.waiting,
                s.lag,
                round(s.late_s * 1000),
                round((s.refused - p.refused) / max(s.at_s - p.at_s, 1e-9)),
            ]
            for p, s in zip(samples[::5], samples[5::5], strict=False)
        ],
        "event_loop_late_p99_ms": round(percentile([s.late_s for s in samples], 0.99) * 1000),
    }


def timeline(outcomes: list[dict[str, Any]], step_s: int = 5) -> list[list[int]]:
    """[s, queued, running, on time] every ``step_s`` from the first arrival, from the jobs'
    own times: queued = accepted and not yet started or ended, running = started, not ended,
    on time = ended by its deadline in the last ``step_s``, for a caller still there."""
    if not outcomes:
        return []
    spans = [(o["created_s"], o["started_s"], o["finished_s"]) for o in outcomes]
    ended_on_time = [o["finished_s"] for o in outcomes if succeeded_on_time(o)]
    out = []
    for t in range(0, math.ceil(max(end for _, _, end in spans)) + step_s, step_s):
        queued = sum(
            1 for made, start, end in spans if made <= t < (end if start is None else start)
        )
        running = sum(1 for _, start, end in spans if start is not None and start <= t < end)
        done = sum(1 for end in ended_on_time if t - step_s < end <= t)
        out.append([t, queued, running, done])
    return out


async def wait_all_terminal(bench: Bench, accepted: dict[str, Arrival]) -> list[dict[str, Any]]:
    async with asyncio.timeout(300):
        while True:
            rows = await job_rows(bench)
            if all(r["state"] in TERMINAL for r in rows if r["id"] in accepted):
                return rows
            await asyncio.sleep(0.5)


async def job_rows(bench: Bench) -> list[dict[str, Any]]:
    return await rows_of(
        bench,
        jobs.c.id,
        jobs.c.state,
        jobs.c.deadline,
        jobs.c.created_at,
        jobs.c.started_at,
        jobs.c.finished_at,
        jobs.c.decoded_tokens,
        jobs.c.error,
        where=jobs.c.tenant == TENANT,
    )


def figures(
    on_time: list[float],
    latencies: list[float],
    *,
    decoded: int,
    useful_tokens: int,
    cap: Capacity,
) -> dict[str, Any]:
    """What both pipelines are measured by: ``on_time`` are the finish times (s from the
    first arrival) of the jobs done by their deadline for a caller still there."""
    span = max(on_time, default=0.0)
    rate = len(on_time) / span if span else 0.0
    return {
        "on_time": len(on_time),
        # When the first on-time job ended: until then the engine had work but no output.
        "first_on_time_s": round(min(on_time, default=0.0), 1),
        "whole_run_goodput_jobs_per_s": round(rate, 2),
        "whole_run_goodput_over_capacity": round(rate / cap.jobs_per_s, 3),
        "span_s": round(span, 1),
        "decode_tokens": decoded,
        "wasted_decode_tokens": decoded - useful_tokens,
        "useful_token_share": round(useful_tokens / decoded, 3) if decoded else 0.0,
        "latency_p50_s": round(percentile(latencies, 0.5), 2),
        "latency_p99_s": round(percentile(latencies, 0.99), 2),
    }


def succeeded_on_time(outcome: dict[str, Any]) -> bool:
    """A Sluicegate job that succeeded by its deadline (a caller who left ends it abandoned)."""
    return bool(outcome["state"] == "succeeded" and outcome["finished_at"] <= outcome["deadline"])


def summarize_sluicegate(
    outcomes: list[dict[str, Any]],
    engine: Counting,
    arrivals: int,
    cap: Capacity,
    decoded: int,
) -> dict[str, Any]:
    succeeded = [o for o in outcomes if o["state"] == "succeeded"]
    ended_on_time = [o for o in succeeded if succeeded_on_time(o)]
    useful_tokens = sum(engine.tokens[o["id"]] for o in ended_on_time)
    before_decode = [
        o
        for o in outcomes
        if o["state"] != "succeeded"
        and ((o["error"] or {}).get("stage") == "before_decode" or o["id"] not in engine.received)
    ]
    latencies = [(o["finished_at"] - o["arrived_at"]).total_seconds() for o in succeeded]
    stages = Counter(
        f"{o['state']}:{(o['error'] or {}).get('reason', o['state'])}"
        f"@{(o['error'] or {}).get('stage', 'before_decode')}"
        for o in outcomes
        if o["state"] != "succeeded"
    )
    return {
        **figures(
            [o["finished_s"] for o in ended_on_time],
            latencies,
            decoded=decoded,
            useful_tokens=useful_tokens,
            cap=cap,
        ),
        "arrivals": arrivals,
        "accepted": len(outcomes),
        "refused": arrivals - len(outcomes),
        "succeeded": len(succeeded),
        "completed_past_deadline": len(succeeded) - len(ended_on_time),
        "dropped_before_decode": len(before_decode),
        "tokens_decoded_for_dropped": sum(engine.tokens[o["id"]] for o in before_decode),
        "dropped_that_reached_engine": sum(1 for o in before_decode if o["id"] in engine.received),
        "ends": dict(sorted(stages.items())),
    }


def useful(r: Run) -> bool:
    """Finished by its deadline, for a caller who was still there."""
    a = r.arrival
    if a is None or r.finished_s is None:
        return False
    gone = a.action != "stay" and a.at_s + a.action_after_s < r.finished_s
    return not gone and r.finished_s <= a.at_s + a.ttl_s


def summarize_naive(runs: list[Run], cap: Capacity, decoded: int) -> dict[str, Any]:
    done = [r for r in runs if r.finished_s is not None]
    on_time = [r for r in done if useful(r)]
    latencies = [(r.finished_s or 0.0) - (r.arrival.at_s if r.arrival else 0.0) for r in done]
    late = sum(
        1 for r in done if r.arrival and (r.finished_s or 0) > r.arrival.at_s + r.arrival.ttl_s
    )
    return {
        **figures(
            [r.finished_s or 0.0 for r in on_time],
            latencies,
            decoded=decoded,
            useful_tokens=sum(r.tokens for r in on_time),
            cap=cap,
        ),
        "arrivals": len(runs),
        "accepted": len(runs),
        "refused": 0,
        "succeeded": len(done),
        "completed_past_deadline": late,
        "dropped_before_decode": 0,
        "tokens_decoded_for_dropped": 0,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both runs, written to ``args.out`` (JSON, and the PNG beside it) when it is set."""
    REFUSALS.clear()
    mix = Mix()
    print(f"measuring the engine's capacity (time scale {args.time_scale}) ...", flush=True)
    cap = await capacity(
        mix,
        time_scale=args.time_scale,
        warm_s=args.capacity_warm_s,
        measure_s=args.capacity_measure_s,
    )
    print(f"capacity {cap.jobs_per_s:.2f} jobs/s, {cap.decode_s_per_token * 1000:.1f} ms/token")
    print(f"service time of a job at saturation {cap.service_s:.1f}s, p99 {cap.service_p99_s:.1f}s")
    wall_s = args.duration * args.time_scale
    arrivals = trace(cap.jobs_per_s * args.overload, wall_s, mix, service_s=cap.service_s)
    print(
        f"{len(arrivals)} arrivals over {wall_s:.0f}s ({args.duration:.0f} engine s, "
        f"{args.overload}x capacity)"
    )
    async with services() as (admin, bootstrap):
        outcomes, engine, settings = await run_sluicegate(
            admin,
            bootstrap,
            arrivals,
            cap,
            args.time_scale,
            args.max_prefill_tokens,
            args.partitions,
            args.lag_measure,
            not args.no_deadline_aware,
        )
    sluicegate = summarize_sluicegate(
        outcomes, engine, len(arrivals), cap, settings.pop("engine_tokens_decoded")
    )
    sluicegate["jobs_every_5_s"] = timeline(outcomes)
    sluicegate["engine"] = engine_use(settings.pop("samples"), args.time_scale)
    sluicegate["refused_attempts"] = dict(REFUSALS)
    print("sluicegate:", json.dumps(sluicegate), flush=True)
    if args.skip_naive:
        return {"sluicegate": sluicegate}
    naive_engine = SimEngine(time_scale=args.time_scale)
    runs = await run_naive(arrivals, engine=naive_engine)
    naive = summarize_naive(runs, cap, naive_engine.tokens_decoded)
    print("naive:", json.dumps(naive), flush=True)
    report = {
        "config": {
            "duration_engine_s": args.duration,
            "duration_wall_s": wall_s,
            "overload": args.overload,
            "time_scale": args.time_scale,
            "capacity_warm_s": args.capacity_warm_s,
            "capacity_measure_s": args.capacity_measure_s,
            "mix": mix.__dict__,
            "lease_s": LEASE_S,
            "sluicegate_settings": settings,
        },
        "capacity_jobs_per_s": round(cap.jobs_per_s, 2),
        "capacity_decode_ms_per_token": round(cap.decode_s_per_token * 1000, 2),
        "service_s_at_saturation": round(cap.service_s, 2),
        "sluicegate": sluicegate,
        "naive": naive,
    }
    if args.out is not None:
        await asyncio.to_thread(write, args.out, report, cap, outcomes, runs)
    return report


def write(
    out: Path,
    report: dict[str, Any],
    cap: Capacity,
    outcomes: list[dict[str, Any]],
    runs: list[Run],
) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    plot_overload(
        cap.jobs_per_s,
        sluicegate_done=[
            (o["finished_s"], o["state"] == "succeeded", o["decoded_tokens"] or 0) for o in outcomes
        ],
        naive_done=[(r.finished_s, useful(r), r.tokens) for r in runs if r.finished_s is not None],
        path=out.with_suffix(".png"),
    )
    print(f"wrote {out}")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="of arrivals, in the simulated GPU's seconds (wall: x the time scale)",
    )
    parser.add_argument("--overload", type=float, default=3.0)
    parser.add_argument("--time-scale", type=float, default=4.0)
    parser.add_argument(
        "--capacity-warm-s", type=float, default=40.0, help="engine s before measuring capacity"
    )
    parser.add_argument(
        "--capacity-measure-s", type=float, default=60.0, help="engine s of capacity measured"
    )
    parser.add_argument("--skip-naive", action="store_true", help="diagnosis: Sluicegate only")
    parser.add_argument("--max-prefill-tokens", type=int, default=None, help="pace refills")
    parser.add_argument("--partitions", type=int, default=4, help="of the dispatch topic")
    parser.add_argument(
        "--lag-measure", choices=("open", "consumer"), default="open", help="what admission reads"
    )
    parser.add_argument(
        "--no-deadline-aware", action="store_true", help="admission does not check deadlines"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/overload.json")
    return parser


def headline(report: dict[str, Any]) -> dict[str, Any]:
    sg, naive = report["sluicegate"], report.get("naive")
    out: dict[str, Any] = {
        "goodput / capacity, Sluicegate": sg["whole_run_goodput_over_capacity"],
        "useful token share, Sluicegate": sg["useful_token_share"],
        "completed past deadline, Sluicegate": sg["completed_past_deadline"],
    }
    if naive is not None:
        out["goodput / capacity, naive"] = naive["whole_run_goodput_over_capacity"]
        out["useful token share, naive"] = naive["useful_token_share"]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        # A few dozen arrivals whose deadlines (up to 5x the service time) pass within
        # seconds; capacity: the first cohort of a saturated engine ends about 7 engine s in.
        args.duration, args.time_scale = min(args.duration, 8.0), min(args.time_scale, 0.5)
        args.overload = min(args.overload, 0.5)
        args.capacity_warm_s, args.capacity_measure_s = 8.0, 6.0
    args.out = args.out or (None if args.quick else OUT)
    logging.basicConfig(level=logging.WARNING)
    return asyncio.run(run(args))


if __name__ == "__main__":
    main()
