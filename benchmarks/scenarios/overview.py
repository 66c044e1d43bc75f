"""Overview cost: what the jobs-by-state gauge's read and the overview's (``GET /v1/overview``,
``sluicegate status``, the page's pipeline panel) cost on a database that holds many ended
jobs (kept for retention) beside a backlog of jobs not ended.

What it measures and how: docs/benchmarks.md#overview.

    python -m benchmarks.scenarios.overview [--ended 1000000] [--unended 50000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy import text

from benchmarks.lib.reports import OUT_DIR, write_report
from benchmarks.lib.stack import bench_settings, services
from plumbing.db import make_engine
from producers.overview.repository import OverviewStore

OUT = OUT_DIR / "overview.json"
MODELS = ("model-a", "model-b", "model-c")
READS = 20

# Ended jobs over the last 7 days (retention's window); the backlog is queued (mostly held
# batch jobs), dispatched and running.
FILL = """
INSERT INTO jobs (id, tenant, kind, state, priority, input, max_tokens, deadline, params,
                  created_at, finished_at, held)
SELECT gen_random_uuid(), 'tenant-' || (i % 10), 'summarize', CAST(:state AS text),
       'normal', 'x', 64, now() + interval '1 day',
       jsonb_build_object('model', (CAST(:models AS text[]))[1 + i % 3]),
       now() - (i % 604800) * interval '1 second',
       CASE WHEN CAST(:ended AS boolean) THEN now() - (i % 604800) * interval '1 second' END,
       CAST(:state AS text) = 'queued'
FROM generate_series(1, :n) AS i
"""


async def _fill(db: Any, state: str, n: int, *, ended: bool) -> None:
    async with db.begin() as conn:
        await conn.execute(
            text(FILL),
            {"state": state, "n": n, "ended": ended, "models": list(MODELS)},
        )


async def _timed(read: Callable[[], Awaitable[object]]) -> dict[str, float]:
    await read()  # warm the cache and the plan
    times = []
    for _ in range(READS):
        started = time.perf_counter()
        await read()
        times.append((time.perf_counter() - started) * 1000)
    return {"median_ms": round(statistics.median(times), 2), "max_ms": round(max(times), 2)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with services() as (admin, bootstrap), bench_settings(admin, bootstrap) as settings:
        db = make_engine(settings.require_database_url(), pool_size=2)
        try:
            started = time.monotonic()
            await _fill(db, "succeeded", args.ended, ended=True)
            backlog = {"queued": args.unended * 8 // 10, "dispatched": args.unended // 10}
            backlog["running"] = args.unended - sum(backlog.values())
            for state, n in backlog.items():
                await _fill(db, state, n, ended=False)
            async with db.begin() as conn:
                await conn.execute(text("ANALYZE jobs"))
            fill_s = time.monotonic() - started
            store = OverviewStore(db)
            reads = {
                "gauge (jobs not ended, every tenant)": await _timed(store.unended),
                "overview jobs, one tenant, 300 s": await _timed(
                    lambda: store.job_counts("tenant-1", 300)
                ),
                "overview jobs, operator, 300 s": await _timed(
                    lambda: store.job_counts(None, 300)
                ),
                "overview drops, operator, 300 s": await _timed(lambda: store.drops(None, 300)),
            }
        finally:
            await db.dispose()
    return {
        "config": {"ended": args.ended, "unended": args.unended, "models": len(MODELS)},
        "fill_s": round(fill_s, 1),
        "reads": reads,
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ended", type=int, default=1_000_000, help="ended jobs kept")
    parser.add_argument("--unended", type=int, default=50_000, help="jobs not ended")
    parser.add_argument("--quick", action="store_true", help="50,000 and 5,000, not written")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/overview.json")
    return parser


def headline(report: dict[str, Any]) -> dict[str, Any]:
    return {name: read["median_ms"] for name, read in report["reads"].items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.ended, args.unended = min(args.ended, 50_000), min(args.unended, 5_000)
    logging.basicConfig(level=logging.ERROR)
    report = asyncio.run(run(args))
    print(
        f"{args.ended:,} ended jobs and {args.unended:,} not ended "
        f"(filled in {report['fill_s']} s); median / max of {READS} reads:"
    )
    for name, read in report["reads"].items():
        print(f"  {name:<40} {read['median_ms']:>8} ms  {read['max_ms']:>8} ms")
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out)
    return report


if __name__ == "__main__":
    main()
