"""What the soak watches: every few seconds, each process's RSS and CPU and the submits'
answers; after the load, the drain and the checks (no job lost, no terminal event twice,
one webhook delivery each), and each process's memory growth."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from benchmarks.lib.offer import Load
from benchmarks.lib.processes import ROLES, Stack
from benchmarks.lib.reports import percentile
from benchmarks.lib.stack import TERMINAL
from benchmarks.lib.topics import terminal_event
from plumbing.settings import Settings
from schemas.tables import jobs, outbox, webhook_deliveries

TENANT = "soak"


async def terminal_count(db: AsyncEngine) -> int:
    async with db.connect() as conn:
        query = select(func.count()).where(jobs.c.tenant == TENANT, jobs.c.state.in_(TERMINAL))
        return int((await conn.execute(query)).scalar_one())


async def sample(
    stack: Stack, load: Load, db: AsyncEngine, every_s: float, t0: float, out: list[dict[str, Any]]
) -> None:
    seen = 0
    cpu_before: dict[str, float] = {}
    last, own_cpu = time.monotonic(), time.process_time()
    while True:
        await asyncio.sleep(max(0.0, last + every_s - time.monotonic()))
        now = time.monotonic()
        rss, cpu = stack.memory()
        fresh = load.answers[seen:]
        seen += len(fresh)
        latencies = [a.latency_s * 1000 for a in fresh]
        span = now - last
        out.append(
            {
                "at_s": round(now - t0, 1),
                "rss_mb": {k: round(v, 1) for k, v in rss.items()},
                "cpu_share": {
                    k: round((v - cpu_before.get(k, v)) / span, 3) for k, v in cpu.items()
                },
                # This process (the load and the receiver): if it were busy, the submit
                # latencies would be its own.
                "load_generator_cpu_share": round((time.process_time() - own_cpu) / span, 3),
                "submits_in_flight": load.in_flight,
                "submit_p50_ms": round(percentile(latencies, 0.5), 2) if latencies else None,
                "submit_p99_ms": round(percentile(latencies, 0.99), 2) if latencies else None,
                "accepted_per_s": round(sum(a.status == 202 for a in fresh) / span, 2),
                "refused_per_s": round(sum(a.status in (429, 503) for a in fresh) / span, 2),
                "terminal": await terminal_count(db),
            }
        )
        cpu_before, last, own_cpu = cpu, now, time.process_time()
        stack.check()


async def drain(db: AsyncEngine, accepted: set[str], limit_s: float) -> float:
    """Wait until every accepted job is terminal, or ``limit_s``; the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        async with db.connect() as conn:
            rows = await conn.execute(
                select(jobs.c.id).where(jobs.c.tenant == TENANT, jobs.c.state.in_(TERMINAL))
            )
            done = {str(r.id) for r in rows}
        if accepted <= done:
            break
        await asyncio.sleep(2.0)
    return time.monotonic() - started


async def outcomes(db: AsyncEngine, settings: Settings, accepted: set[str]) -> dict[str, Any]:
    async with db.connect() as conn:
        rows = (
            await conn.execute(
                select(jobs.c.id, jobs.c.state, jobs.c.created_at, jobs.c.finished_at).where(
                    jobs.c.tenant == TENANT
                )
            )
        ).all()
        events = (
            await conn.execute(
                select(outbox.c.key, outbox.c.payload).where(
                    outbox.c.topic == settings.events_topic
                )
            )
        ).all()
        deliveries = Counter(
            str(s)
            for s in await conn.scalars(
                select(webhook_deliveries.c.subject).where(webhook_deliveries.c.tenant == TENANT)
            )
        )
    by_id = {str(r.id): r for r in rows}
    lost = sorted(j for j in accepted if j not in by_id or by_id[j].state not in TERMINAL)
    e2e = [
        (r.finished_at - r.created_at).total_seconds()
        for j, r in by_id.items()
        if j in accepted and r.state == "succeeded"
    ]
    ends = Counter(r.key for r in events if r.key in accepted and terminal_event(r.payload))
    return {
        "accepted": len(accepted),
        "states": dict(Counter(by_id[j].state for j in accepted if j in by_id)),
        "lost": len(lost),
        "lost_ids": lost[:20],
        "duplicated_in_outbox": sum(1 for n in ends.values() if n > 1),
        "terminal_without_outbox_event": sum(
            1 for j in accepted if j in by_id and by_id[j].state in TERMINAL and ends[j] == 0
        ),
        "webhook_delivery_rows_over_one": sum(1 for n in deliveries.values() if n > 1),
        "webhook_delivery_rows": sum(deliveries.values()),
        "end_to_end_p50_s": round(percentile(e2e, 0.5), 2),
        "end_to_end_p99_s": round(percentile(e2e, 0.99), 2),
        "end_to_end_max_s": round(max(e2e, default=float("nan")), 2),
    }


def memory_growth(samples: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per role: RSS at the start and end of the load (mean of its first and last tenth,
    after the first minute's warm-up when the run is long enough), peak, and growth."""
    out: dict[str, dict[str, float]] = {}
    steady = [s for s in samples if s["at_s"] >= 60] if samples[-1]["at_s"] > 180 else samples
    tenth = max(1, len(steady) // 10)
    for role in ROLES:
        values = [s["rss_mb"][role] for s in steady if role in s["rss_mb"]]
        if not values:
            continue
        first = sum(values[:tenth]) / len(values[:tenth])
        last = sum(values[-tenth:]) / len(values[-tenth:])
        out[role] = {
            "start_mb": round(first, 1),
            "end_mb": round(last, 1),
            "peak_mb": round(max(values), 1),
            "growth_mb": round(last - first, 1),
        }
    return out
