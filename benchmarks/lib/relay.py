"""One relay publishing an outbox that is never short of work: the API (in this process, no
relay and no worker) fills the outbox from CLIENTS concurrent clients, then ``python -m
sluicegate relay`` starts as a process of its own and is timed through the backlog, its
rows a second and its CPU (psutil, its whole process) per row."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from sqlalchemy import func, select

from benchmarks.lib.processes import environment
from benchmarks.lib.sampling import cpu_s
from benchmarks.lib.stack import pipeline, services
from plumbing.db import make_engine
from plumbing.settings import Settings
from schemas.tables import outbox

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


async def measure(jobs: int) -> dict[str, Any]:
    """``jobs`` single submits into the outbox, then one relay process through the backlog;
    the fill's and the relay's figures."""
    # Admission open wide: the backlog is the point. No worker, so nothing drains it.
    # And the API publishes nothing at once: every row is the relay's, as after an outage.
    wide = {
        "lag_soft": 10**7,
        "lag_hard": 10**7 + 1,
        "deadline_aware": False,
        "publish_at_once": False,
    }
    async with services() as (admin, bootstrap), pipeline(admin, bootstrap, **wide) as bench:
        started = time.monotonic()
        accepted = await fill(bench.client, jobs)
        fill_s = time.monotonic() - started
        backlog = await unpublished(bench.settings)
        with tempfile.TemporaryDirectory() as tmp:
            relay = await publish(bench.settings, backlog, Path(tmp) / "relay.log")
    return {
        "config": {
            "jobs": jobs,
            "clients": CLIENTS,
            "relay_batch_size": bench.settings.relay_batch_size,
            "partitions": bench.settings.partitions,
        },
        "fill": {"accepted": accepted, "seconds": round(fill_s, 1), "outbox_rows": backlog},
        "relay": relay,
    }
