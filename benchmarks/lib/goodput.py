"""What the overload benchmark measures both pipelines by: goodput (jobs finished by their
deadline for a caller still there) over the engine's capacity, decode tokens wasted, jobs
dropped before decode, latencies; the jobs over time, and how busy the engine was (sampled
every second while Sluicegate runs)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from benchmarks.lib.callers import REFUSALS
from benchmarks.lib.engine import Capacity, Counting, Run
from benchmarks.lib.reports import percentile
from benchmarks.lib.stack import Bench
from workers.engines.sim.engine import SimEngine


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
