"""How soon a long-poll (``GET /v1/jobs/{id}?wait=``) answers after the terminal write.

What it measures and how: docs/benchmarks.md#longpoll.

    python -m benchmarks.scenarios.longpoll [--single 200] [--together 200] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from sqlalchemy import update

from benchmarks.lib.plots.longpoll import plot_longpoll
from benchmarks.lib.reports import OUT_DIR, percentile, write_report
from benchmarks.lib.stack import Bench, pipeline, services
from plumbing.db import make_engine
from schemas.tables import jobs

OUT = OUT_DIR / "longpoll.json"
SETTLE_S = 0.5
DOC = "A long-poll answers when the job ends. " * 3


async def submit(bench: Bench, count: int) -> list[str]:
    ids = []
    for _ in range(count):
        r = await bench.client.post("/v1/jobs", json={"kind": "summarize", "input": DOC})
        r.raise_for_status()
        ids.append(r.json()["id"])
    return ids


async def wait_started(bench: Bench, count: int) -> None:
    """Until ``count`` requests are registered as waiters and have had time to read their
    job once (a write before that read is seen by the read itself, not by a wake-up)."""
    waiters = bench.app.state.waiters
    async with asyncio.timeout(30):
        while len(waiters) < count:  # noqa: ASYNC110 (the registry has no event to await)
            await asyncio.sleep(0.001)
    await asyncio.sleep(SETTLE_S)


async def trial(bench: Bench, db: Any, ids: list[str]) -> list[float]:
    """Latencies (ms) from the commit of one UPDATE ending ``ids`` to each answer."""
    answered: dict[str, float] = {}

    async def poll(job_id: str) -> None:
        r = await bench.client.get(f"/v1/jobs/{job_id}", params={"wait": 30})
        answered[job_id] = time.perf_counter()
        assert r.json()["state"] == "cancelled", r.text

    tasks = [asyncio.create_task(poll(j)) for j in ids]
    await wait_started(bench, len(ids))
    async with db.begin() as conn:
        await conn.execute(update(jobs).where(jobs.c.id.in_(ids)).values(state="cancelled"))
    committed = time.perf_counter()
    await asyncio.gather(*tasks)
    return [(answered[j] - committed) * 1000 for j in ids]


def figures(latencies_ms: list[float]) -> dict[str, float]:
    return {
        "count": len(latencies_ms),
        "p50_ms": round(percentile(latencies_ms, 0.5), 2),
        "p99_ms": round(percentile(latencies_ms, 0.99), 2),
        "max_ms": round(max(latencies_ms), 2),
    }


async def run(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """The report, and each shape's latencies (ms) for the plot."""
    async with (
        services() as (admin, bootstrap),
        pipeline(admin, bootstrap, auth="tenant_header") as bench,
    ):
        db = make_engine(bench.settings.require_database_url(), pool_size=2)
        try:
            single: list[float] = []
            for job_id in await submit(bench, args.single):
                single += await trial(bench, db, [job_id])
            together = await trial(bench, db, await submit(bench, args.together))
        finally:
            await db.dispose()
    latencies = {
        "one_waiter_at_a_time": single,
        f"{args.together}_waiters_woken_by_one_write": together,
    }
    report = {name: figures(values) for name, values in latencies.items()}
    for name, row in report.items():
        print(f"{name}: {row}")
    return report, latencies


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--single", type=int, default=200, help="one-at-a-time trials")
    parser.add_argument("--together", type=int, default=200, help="waiters woken at once")
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/longpoll.json")
    return parser


def headline(report: dict[str, Any]) -> dict[str, Any]:
    one = report["one_waiter_at_a_time"]
    many_name, many = next((k, v) for k, v in report.items() if k != "one_waiter_at_a_time")
    count = many_name.split("_", 1)[0]
    return {
        "one waiter: p50 / p99 ms": f"{one['p50_ms']} / {one['p99_ms']}",
        f"{count} woken by one write: p50 / p99 ms": f"{many['p50_ms']} / {many['p99_ms']}",
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.single, args.together = min(args.single, 5), min(args.together, 20)
    report, latencies = asyncio.run(run(args))
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out, lambda png: plot_longpoll(latencies, path=png))
    return report


if __name__ == "__main__":
    main()
