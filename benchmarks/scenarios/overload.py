"""Overload with deadlines: Sluicegate against a naive pipeline on the same arrival trace.

What it measures and how: docs/benchmarks.md#overload.

    python -m benchmarks.scenarios.overload [--duration 60] [--overload 3] [--time-scale 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.lib.callers import LEASE_S, REFUSALS, TENANT, call, warm_up
from benchmarks.lib.engine import (
    LAG_HARD_S,
    LAG_SOFT_S,
    Capacity,
    Counting,
    Run,
    capacity,
    run_naive,
)
from benchmarks.lib.goodput import (
    Sample,
    engine_use,
    sample,
    summarize_naive,
    summarize_sluicegate,
    timeline,
    useful,
)
from benchmarks.lib.plots.overload import plot_overload
from benchmarks.lib.reports import OUT_DIR
from benchmarks.lib.stack import TERMINAL, Bench, pipeline, services
from benchmarks.lib.stack import job_rows as rows_of
from benchmarks.lib.trace import Arrival, Mix, trace
from schemas.tables import jobs
from workers.engines.sim.engine import SimEngine
from workers.service import run_worker

OUT = OUT_DIR / "overload.json"


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
