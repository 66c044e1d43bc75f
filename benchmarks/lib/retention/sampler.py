"""The retention benchmark's sampler: every few seconds, the database (``database_sample``),
the relay's pruned-rows counter, the load so far and each role's CPU share."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx

from benchmarks.lib.offer import Batches, Load
from benchmarks.lib.processes import Stack
from benchmarks.lib.receivers import FailingReceiver
from benchmarks.lib.retention.database import database_sample, pruned_counter


@dataclass
class Sampler:
    stack: Stack
    url: str
    load: Load
    batches: Batches
    receiver: FailingReceiver
    every_s: float
    t0: float
    samples: list[dict[str, Any]] = field(default_factory=list)

    async def run(self) -> None:
        conn = await asyncpg.connect(self.url)
        scraper = httpx.AsyncClient(timeout=5.0)
        cpu_before: dict[str, float] = {}
        last = time.monotonic()
        try:
            while True:
                last, cpu_before = await self.take(conn, scraper, last, cpu_before)
                self.stack.check()
                await asyncio.sleep(max(0.0, last + self.every_s - time.monotonic()))
        finally:
            await scraper.aclose()
            await conn.close()

    async def take(
        self,
        conn: asyncpg.Connection,
        scraper: httpx.AsyncClient,
        last: float,
        cpu_before: dict[str, float],
    ) -> tuple[float, dict[str, float]]:
        """One sample; when it was taken and each role's CPU seconds then."""
        now = time.monotonic()
        _, cpu = self.stack.memory()
        database = await database_sample(conn)
        pruned = await pruned_counter(scraper, self.stack.relay_metrics_port)
        span = max(now - last, 1e-9)
        self.samples.append(
            {
                "at_s": round(now - self.t0, 1),
                **database,
                "pruned_total": pruned,
                "accepted_jobs": len(self.load.accepted),
                "refused_submits": sum(a.status != 202 for a in self.load.answers),
                "batch_jobs_accepted": sum(self.batches.accepted.values()),
                "webhook_attempts_received": self.receiver.attempts,
                "cpu_share": {
                    k: round((v - cpu_before[k]) / span, 3)
                    for k, v in cpu.items()
                    if k in cpu_before
                },
            }
        )
        return now, cpu
