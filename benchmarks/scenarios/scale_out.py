"""Scale-out: throughput of 1, 2 and 4 workers in one consumer group, against linear.

What it measures and how, and why the workers are tasks of one process:
docs/benchmarks.md#scale_out.

    python -m benchmarks.scenarios.scale_out [--workers 1 2 4] [--window-s 30] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import and_, func, select

from benchmarks.lib.engine import Counting
from benchmarks.lib.plots.scale_out import plot_scale_out
from benchmarks.lib.reports import OUT_DIR, write_report
from benchmarks.lib.stack import Bench, job_rows, pipeline, services, wait_published
from benchmarks.lib.trace import Mix, backlog
from plumbing.db import make_engine
from schemas.tables import jobs
from workers.engines.sim.engine import SimEngine
from workers.service import run_worker

OUT = OUT_DIR / "scale_out.json"
TENANT = "bench"


async def load(bench: Bench, count: int, chunk: int = 250) -> None:
    """Submit the backlog (as batches: one transaction per ``chunk`` jobs) and wait until
    the relay has published all of it."""
    docs = backlog(count, Mix())
    for first in range(0, count, chunk):
        lines = [
            {
                "custom_id": f"r{first + i}",
                "method": "POST",
                "url": "/v1/jobs",
                "body": {"kind": "summarize", "input": doc, "max_tokens": max_tokens},
            }
            for i, (doc, max_tokens) in enumerate(docs[first : first + chunk])
        ]
        response = await bench.client.post(
            "/v1/batches",
            json={"requests": lines, "completion_window": "1h"},
            headers={"X-Sluicegate-Tenant": TENANT},
        )
        assert response.status_code == 201, response.text
    await wait_published(bench, count)


async def not_started(bench: Bench) -> int:
    """Jobs of the backlog that no worker has started yet."""
    db = make_engine(bench.settings.require_database_url(), pool_size=1)
    try:
        async with db.connect() as conn:
            query = select(func.count()).where(jobs.c.started_at.is_(None))
            return int((await conn.execute(query)).scalar_one())
    finally:
        await db.dispose()


async def settle(
    engines: list[Counting], args: argparse.Namespace
) -> tuple[bool, float | None, float]:
    """Until every worker has turned its batch over once (or ``--warm-max-s``): whether it
    did, when every worker first had a job running, and the seconds it took."""
    t_start = time.monotonic()
    settled, joined_s = True, None
    while min(e.finished for e in engines) < args.max_num_seqs:
        if joined_s is None and all(e.capacity().running for e in engines):
            joined_s = time.monotonic() - t_start  # every worker has a job running
        if time.monotonic() - t_start > args.warm_max_s:
            settled = False
            break
        await asyncio.sleep(0.1)
    return settled, joined_s, time.monotonic() - t_start


async def run_workers(
    admin: str, bootstrap: str, workers: int, args: argparse.Namespace
) -> dict[str, Any]:
    overrides: dict[str, object] = {
        "partitions": args.partitions,
        "lag_soft": 1_000_000,
        "lag_hard": 2_000_000,
        "deadline_aware": False,
        "max_input_bytes": 1_000_000,
        # A rebalance waits this long for the jobs of revoked partitions (the group settles
        # sooner at the start) and so does the drain at the end.
        "drain_timeout_s": 2.0,
    }
    started = time.monotonic()
    async with pipeline(admin, bootstrap, **overrides) as bench:
        bench.start_relay()
        await load(bench, args.jobs)
        loaded_s = time.monotonic() - started
        engines = [
            Counting(SimEngine(max_num_seqs=args.max_num_seqs, time_scale=args.time_scale))
            for _ in range(workers)
        ]
        for engine in engines:
            bench.tasks.append(
                asyncio.create_task(run_worker(bench.settings, bench.stop, engine=engine))
            )
        settled, joined_s, warm_s = await settle(engines, args)
        wall0, t0, cpu0 = datetime.now(UTC), time.monotonic(), time.process_time()
        sim0 = [e.engine.simulated_s for e in engines]
        tokens0 = sum(e.engine.tokens_decoded for e in engines)
        done0 = [e.finished for e in engines]
        await asyncio.sleep(args.window_s)
        wall1, t1, cpu1 = datetime.now(UTC), time.monotonic(), time.process_time()
        sim1 = [e.engine.simulated_s for e in engines]
        tokens1 = sum(e.engine.tokens_decoded for e in engines)
        done1 = [e.finished for e in engines]
        left = await not_started(bench)
        rows = await job_rows(
            bench,
            jobs.c.result,
            where=and_(
                jobs.c.state == "succeeded", jobs.c.finished_at >= wall0, jobs.c.finished_at < wall1
            ),
        )
        stopping = time.monotonic()
    window = t1 - t0
    output = sum(r["result"]["output_tokens"] for r in rows if r["result"])
    prompt = sum(r["result"]["prompt_tokens"] for r in rows if r["result"])
    per_worker = [b - a for a, b in zip(done0, done1, strict=True)]
    speeds = [(b - a) * args.time_scale / window for a, b in zip(sim0, sim1, strict=True)]
    return {
        "workers": workers,
        "jobs_per_s": round(len(rows) / window, 2),
        "output_tokens_per_s": round(output / window, 1),
        "all_tokens_per_s": round((prompt + output) / window, 1),
        "engine_output_tokens_per_s": round((tokens1 - tokens0) / window, 1),
        "jobs_in_window": len(rows),
        "window_s": round(window, 2),
        "settled": settled,
        "all_running_s": None if joined_s is None else round(joined_s, 1),
        "settle_s": round(warm_s, 1),
        "load_s": round(loaded_s, 1),
        # Saturated: jobs of the backlog were still waiting when the window closed.
        "backlog_left_at_end": left,
        "saturated": left > 0,
        "jobs_finished_by_each_engine": per_worker,
        "balance_min_over_max": round(min(per_worker) / max(per_worker), 3)
        if max(per_worker)
        else None,
        "engine_speed_min": round(min(speeds), 3),
        "process_cpu_share": round((cpu1 - cpu0) / window, 3),
        "read_s": round(stopping - t1, 1),
        "stop_s": round(time.monotonic() - stopping, 1),
        "run_s": round(time.monotonic() - started, 1),
    }


def ratios(runs: list[dict[str, Any]]) -> None:
    """Each run's throughput over linear from the smallest worker count's per worker."""
    base = runs[0]
    for run in runs:
        for key in ("jobs_per_s", "output_tokens_per_s", "all_tokens_per_s"):
            per_worker = base[key] / base["workers"]
            linear = run["workers"] * per_worker
            run[f"{key}_ratio_to_linear"] = round(run[key] / linear, 3) if linear else None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    async with services() as (admin, bootstrap):
        for workers in sorted(set(args.workers)):
            outcome = await run_workers(admin, bootstrap, workers, args)
            print(f"{workers} worker(s):", json.dumps(outcome), flush=True)
            runs.append(outcome)
    ratios(runs)
    for outcome in runs:
        print(
            f"{outcome['workers']} worker(s): {outcome['jobs_per_s']} jobs/s, "
            f"{outcome['output_tokens_per_s']} output tokens/s, ratio to linear "
            f"{outcome['jobs_per_s_ratio_to_linear']} (jobs), "
            f"{outcome['output_tokens_per_s_ratio_to_linear']} (output tokens)"
        )
    cpu_bound = [r["workers"] for r in runs if r["engine_speed_min"] < 0.95]
    if cpu_bound:
        print(f"warning: the engines ran slower than their roofline time at {cpu_bound} workers")
    unsettled = [r["workers"] for r in runs if not r["settled"]]
    if unsettled:
        print(f"warning: the group had not settled within --warm-max-s at {unsettled} workers")
    unsaturated = [r["workers"] for r in runs if not r["saturated"]]
    if unsaturated:
        print(f"warning: the backlog ran out at {unsaturated} workers: raise --jobs")
    return {
        "config": {
            "workers": sorted(set(args.workers)),
            "backlog_jobs": args.jobs,
            "window_s": args.window_s,
            "warm_max_s": args.warm_max_s,
            "partitions": args.partitions,
            "time_scale": args.time_scale,
            "max_num_seqs": args.max_num_seqs,
            "mix": Mix().__dict__,
            "workers_as": "asyncio tasks of one process, one consumer each, one group",
        },
        "runs": runs,
        "cpu_bound_at": cpu_bound,
        "unsettled_at": unsettled,
        "unsaturated_at": unsaturated,
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--window-s", type=float, default=30.0, help="measured seconds a run")
    parser.add_argument(
        "--warm-max-s", type=float, default=60.0, help="longest wait for the group to settle"
    )
    parser.add_argument(
        "--jobs", type=int, default=1500, help="the backlog (more than 4 workers finish)"
    )
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--time-scale", type=float, default=4.0, help="x roofline step time")
    parser.add_argument("--max-num-seqs", type=int, default=32, help="each engine's batch")
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/scale_out.json")
    return parser


def headline(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in report["runs"][1:]:
        out[f"{r['workers']} workers: jobs/s ratio to linear"] = r["jobs_per_s_ratio_to_linear"]
        out[f"{r['workers']} workers: output tokens/s ratio to linear"] = r[
            "output_tokens_per_s_ratio_to_linear"
        ]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.workers = [n for n in args.workers if n <= 2] or [1]
        # Two workers take 10-20 s to settle in their group; a smoke run waits for it too.
        args.window_s, args.warm_max_s = min(args.window_s, 3.0), min(args.warm_max_s, 20.0)
        args.jobs, args.time_scale = min(args.jobs, 300), min(args.time_scale, 2.0)
    logging.basicConfig(level=logging.ERROR)
    report = asyncio.run(run(args))
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out, lambda png: plot_scale_out(report["runs"], path=png))
    return report


if __name__ == "__main__":
    main()
