"""Webhooks after a burst of job ends: how late each delivery's first attempt starts after it
came due, how long the oldest due delivery waits, and whether every job's delivery is made
within 10 s of the last job's end; on the stack as processes (API, relay, two workers on the
simulator, the dispatcher) with a local receiver, one run with a worker killed mid-decode.
Then what one claim of an idle dispatcher costs, on a table of ended deliveries.

What it measures and how: docs/benchmarks.md#webhooks.

    python -m benchmarks.scenarios.webhooks [--jobs 40] [--runs 3] [--time-scale 30] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import statistics
import tempfile
import time
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from benchmarks.lib.processes import Stack, api_ready, warm_up
from benchmarks.lib.receivers import Receiver
from benchmarks.lib.reports import OUT_DIR, percentile, write_report
from benchmarks.lib.stack import bench_settings, services
from plumbing.db import make_engine
from schemas import constants
from sluicegate.local.embedded import free_port
from workers.webhooks.claim_repository import ClaimRepository

OUT = OUT_DIR / "webhooks.json"
TENANT = "bench"
WITHIN_S = 10.0  # every delivery made within this long of the last job's end
CLAIMS = 200

# How long the oldest pending delivery that is due has been due, by the database's clock.
OLDEST_DUE = """
SELECT extract(epoch FROM now() - min(next_attempt_at)) FROM webhook_deliveries
WHERE state = 'pending' AND next_attempt_at <= now()
"""
# Per job of the run: when it ended, and its delivery's creation and first attempt.
DELIVERIES = """
SELECT j.id::text AS job, j.state, j.finished_at, d.created_at, now() AS now,
       (SELECT min(a.at) FROM webhook_attempts a WHERE a.delivery_id = d.id) AS first_at
FROM jobs j LEFT JOIN webhook_deliveries d ON d.subject = j.id::text
WHERE j.id::text = ANY(:ids)
"""
ENDED = ("succeeded", "failed", "expired", "cancelled", "abandoned")
FILL = """
INSERT INTO webhook_deliveries (id, tenant, subject, event_type, url, body, state,
                                next_attempt_at, finished_at)
SELECT 'msg_fill_' || i, 't' || (i % 10), 'job-' || i, 'job.succeeded', 'http://x/hook', '{}',
       CASE WHEN i <= :pending THEN 'pending' ELSE 'delivered' END,
       CASE WHEN i <= :pending THEN now() + interval '1 hour' ELSE now() END,
       CASE WHEN i <= :pending THEN NULL ELSE now() END
FROM generate_series(1, :n) AS i
"""


async def burst(
    client: httpx.AsyncClient, db: AsyncEngine, stack: Stack, callback: str, args: Any, kill: bool
) -> dict[str, Any]:
    """``--jobs`` jobs with a callback at once; the deliveries' lateness once each has been
    attempted (or ``--give-up-s`` after the last end), the oldest due sampled meanwhile."""
    ids = []
    for n in range(args.jobs):
        body = {"kind": "summarize", "input": f"Report {n}. " * 60, "max_tokens": 64}
        r = await client.post("/v1/jobs", json={**body, "callback_url": callback})
        r.raise_for_status()
        ids.append(r.json()["id"])
    if kill:  # a worker killed mid-decode: its jobs run again on the other
        await asyncio.sleep(args.kill_after_s)
        stack.processes["worker-2"].send_signal(signal.SIGKILL)
    oldest: list[float] = []
    async with asyncio.timeout(args.jobs * 5 + 120):
        while True:
            async with db.connect() as conn:
                waited = await conn.scalar(text(OLDEST_DUE))
                rows = (await conn.execute(text(DELIVERIES), {"ids": ids})).mappings().all()
            oldest.append(float(waited or 0.0))
            ended = [r for r in rows if r["state"] in ENDED]
            if len(ended) == len(ids):
                since_end = rows[0]["now"] - max(r["finished_at"] for r in ended)
                attempted = all(r["first_at"] is not None for r in rows)
                if attempted or since_end.total_seconds() > args.give_up_s:
                    break
            await asyncio.sleep(0.25)
    return judged(rows, oldest, kill)


def judged(rows: Any, oldest: list[float], kill: bool) -> dict[str, Any]:
    last_end = max(r["finished_at"] for r in rows)
    late = [(r["first_at"] - r["created_at"]).total_seconds() for r in rows if r["first_at"]]
    never = sum(r["first_at"] is None for r in rows)
    made_by = [(r["first_at"] - last_end).total_seconds() for r in rows if r["first_at"]]
    return {
        "worker_killed": kill,
        "jobs": len(rows),
        "succeeded": sum(r["state"] == "succeeded" for r in rows),
        "never_attempted": never,
        "late_p50_s": round(statistics.median(late), 3) if late else None,
        "late_p99_s": round(percentile(late, 0.99), 3) if late else None,
        "late_max_s": round(max(late), 3) if late else None,
        "last_attempt_after_last_end_s": round(max(made_by), 3) if made_by else None,
        "all_within_10s": never == 0 and max(made_by, default=0.0) <= WITHIN_S,
        "oldest_due_max_s": round(max(oldest), 3),
    }


async def claim_cost(db: AsyncEngine) -> dict[str, float]:
    """Median and p99 round trip (ms) of one claim that finds nothing due."""
    claims = ClaimRepository(db)
    times = []
    for _ in range(CLAIMS):
        began = time.perf_counter()
        await claims.claim(limit=64, per_endpoint=4, busy={}, lease_s=45.0)
        times.append((time.perf_counter() - began) * 1000)
    return {
        "median_ms": round(statistics.median(times), 3),
        "p99_ms": round(percentile(times, 0.99), 3),
    }


async def idle_claims(db: AsyncEngine, ended: int, pending: int) -> dict[str, Any]:
    """An idle claim's cost on the run's table, then on ``ended`` delivered rows beside
    ``pending`` ones whose retry is an hour away."""
    found = {"after the runs": await claim_cost(db)}
    async with db.begin() as conn:
        await conn.execute(text(FILL), {"n": ended + pending, "pending": pending})
        await conn.execute(text("ANALYZE webhook_deliveries"))
    found[f"{ended:,} delivered, {pending:,} awaiting a retry"] = await claim_cost(db)
    return found


async def run(args: argparse.Namespace) -> dict[str, Any]:
    receiver = Receiver()
    server = await receiver.serve()
    callback = f"http://127.0.0.1:{receiver.port}/hook"
    overrides = {
        "api_port": free_port(),
        "partitions": 4,
        "sim_time_scale": args.time_scale,
        "webhook_allow_networks": (ip_network("127.0.0.0/8"),),
        "deadline_aware": False,
    }
    runs = []
    with tempfile.TemporaryDirectory(prefix="sluicegate-webhooks-") as tmp:
        async with (
            services() as (admin, bootstrap),
            bench_settings(admin, bootstrap, data_dir=Path(tmp), **overrides) as settings,
        ):
            stack = Stack(settings, Path(tmp), workers=2)
            db = make_engine(settings.require_database_url(), pool_size=2)
            client = httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{settings.api_port}",
                headers={constants.HEADER_TENANT: TENANT},
                timeout=60.0,
            )
            try:
                stack.start()
                await api_ready(client, stack)
                (await client.post("/v1/webhooks/secrets")).raise_for_status()
                await warm_up(client, 4)
                for n in range(args.runs):
                    kill = args.kill and n == args.runs - 1
                    runs.append(await burst(client, db, stack, callback, args, kill))
                    print(line(n + 1, runs[-1]), flush=True)
                claims = await idle_claims(db, args.ended, args.pending)
            finally:
                await client.aclose()
                stack.stop()
                await db.dispose()
                server.close()
    config = {
        "jobs": args.jobs,
        "runs": args.runs,
        "time_scale": args.time_scale,
        "kill": args.kill,
    }
    return {"config": config, "runs": runs, "idle_claim": claims, "cpus": os.cpu_count()}


def line(n: int, r: dict[str, Any]) -> str:
    killed = ", a worker killed" if r["worker_killed"] else ""
    return (
        f"run {n}{killed}: {r['succeeded']}/{r['jobs']} succeeded, {r['never_attempted']} "
        f"deliveries never attempted; first attempt after due p50 {r['late_p50_s']} s, "
        f"p99 {r['late_p99_s']} s, max {r['late_max_s']} s; last attempt "
        f"{r['last_attempt_after_last_end_s']} s after the last end; oldest due at most "
        f"{r['oldest_due_max_s']} s"
    )


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=40, help="jobs with a callback a burst")
    parser.add_argument("--runs", type=int, default=3, help="bursts, one after another")
    parser.add_argument("--time-scale", type=float, default=30.0, help="the simulator's")
    parser.add_argument("--no-kill", dest="kill", action="store_false", help="kill no worker")
    parser.add_argument("--kill-after-s", type=float, default=4.0, help="into the last burst")
    parser.add_argument(
        "--give-up-s", type=float, default=60.0, help="after the last end, on the ones not made"
    )
    parser.add_argument("--ended", type=int, default=1_000_000, help="delivered rows kept")
    parser.add_argument("--pending", type=int, default=10_000, help="rows awaiting a retry")
    parser.add_argument("--quick", action="store_true", help="one burst of 10, not written")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/webhooks.json")
    return parser


def headline(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "never attempted": sum(r["never_attempted"] for r in report["runs"]),
        "oldest due, max (s)": max(r["oldest_due_max_s"] for r in report["runs"]),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.jobs, args.runs, args.time_scale = 10, 1, 1.0
        args.ended, args.pending = 20_000, 1_000
    logging.basicConfig(level=logging.ERROR)
    report = asyncio.run(run(args))
    for name, cost in report["idle_claim"].items():
        print(f"idle claim, {name}: median {cost['median_ms']} ms, p99 {cost['p99_ms']} ms")
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out)
    return report


if __name__ == "__main__":
    main()
