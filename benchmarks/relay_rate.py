"""Relay rate: how many outbox rows one relay publishes a second, and its CPU per row, when
it is never short of work (full batches of ``relay_batch_size``).

The API (in this process, with no relay and no worker running) takes ``--jobs`` single
submits from 64 concurrent clients, so the outbox fills with one dispatch row per job. Then
``python -m sluicegate relay`` starts as a process of its own and publishes the backlog; the
run measures, from its first published row to its last, the rows published a second and the
relay process's CPU (``psutil``, its whole process) per row. PostgreSQL and the broker are
the embedded ones (or SLUICEGATE_BENCH_DATABASE_URL / SLUICEGATE_BENCH_KAFKA), on the same
two cores, so the figure is one relay on a shared machine: a lower bound for a relay with a
core of its own.

Writes docs/bench/relay_rate.json.

    python -m benchmarks.relay_rate [--jobs 20000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from sqlalchemy import func, select

from benchmarks.harness import OUT_DIR, pipeline, services, write_report
from benchmarks.soak import environment
from plumbing.db import make_engine
from plumbing.settings import Settings
from schemas.tables import outbox

OUT = OUT_DIR / "relay_rate.json"
CLIENTS = 64
DOC = "The quarterly report covers revenue, costs and the outlook for the next year. " * 30


async def fill(client: httpx.AsyncClient, count: int) -> int:
    """``count`` single submits from CLIENTS concurrent clients; the accepted count."""
    left = iter(range(count))
    accepted = 0

    async def one_client() -> None:
        nonlocal accepted
        for _ in left:
            r = await client.post(
                "/v1/jobs", json={"kind": "complete", "input": DOC, "max_tokens": 64}
            )
            accepted += r.status_code == 202

    await asyncio.gather(*(one_client() for _ in range(CLIENTS)))
    return accepted


async def unpublished(settings: Settings) -> int:
    db = make_engine(settings.require_database_url(), pool_size=1)
    try:
        async with db.connect() as conn:
            count = await conn.scalar(
                select(func.count()).select_from(outbox).where(outbox.c.published_at.is_(None))
            )
        return int(count or 0)
    finally:
        await db.dispose()


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def start_relay(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sluicegate", "relay"],
            env=environment(settings),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


async def publish(settings: Settings, backlog: int, log: Path) -> dict[str, Any]:
    """Start a relay process and time it through the backlog."""
    relay = await asyncio.to_thread(start_relay, settings, log)
    process = psutil.Process(relay.pid)
    try:
        left = backlog
        while left == backlog:  # until its first round is committed
            if relay.poll() is not None:
                raise RuntimeError(await asyncio.to_thread(tail, log))
            await asyncio.sleep(0.02)
            left = await unpublished(settings)
        first_cpu, first_at, first_left = cpu_s(process), time.monotonic(), left
        while left:
            await asyncio.sleep(0.05)
            left = await unpublished(settings)
        cpu, seconds = cpu_s(process) - first_cpu, time.monotonic() - first_at
    finally:
        relay.terminate()
        code = await asyncio.to_thread(relay.wait, 30)
    rows = first_left
    return {
        "rows_timed": rows,
        "seconds": round(seconds, 2),
        "rows_per_s": round(rows / seconds, 1),
        "cpu_ms_per_row": round(1000 * cpu / rows, 3),
        "cpu_share": round(cpu / seconds, 3),
        "exit_code": code,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    # Admission open wide: the backlog is the point. No worker, so nothing drains it.
    wide = {"lag_soft": 10**7, "lag_hard": 10**7 + 1, "deadline_aware": False}
    async with services() as (admin, bootstrap), pipeline(admin, bootstrap, **wide) as bench:
        started = time.monotonic()
        accepted = await fill(bench.client, args.jobs)
        fill_s = time.monotonic() - started
        backlog = await unpublished(bench.settings)
        with tempfile.TemporaryDirectory() as tmp:
            relay = await publish(bench.settings, backlog, Path(tmp) / "relay.log")
    return {
        "config": {
            "jobs": args.jobs,
            "clients": CLIENTS,
            "relay_batch_size": bench.settings.relay_batch_size,
            "partitions": bench.settings.partitions,
        },
        "fill": {"accepted": accepted, "seconds": round(fill_s, 1), "outbox_rows": backlog},
        "relay": relay,
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="2,000 jobs, not written")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/relay_rate.json")
    return parser


def headline(report: dict[str, Any]) -> dict[str, Any]:
    relay = report["relay"]
    return {"relay rows/s": relay["rows_per_s"], "relay CPU ms/row": relay["cpu_ms_per_row"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.jobs = min(args.jobs, 2000)
    logging.basicConfig(level=logging.ERROR)
    report = asyncio.run(run(args))
    print(
        f"filled {report['fill']['outbox_rows']} outbox rows in {report['fill']['seconds']} s; "
        f"one relay: {report['relay']['rows_per_s']} rows/s, "
        f"{report['relay']['cpu_ms_per_row']} CPU ms/row, CPU share {report['relay']['cpu_share']}"
    )
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out)
    return report


if __name__ == "__main__":
    main()
