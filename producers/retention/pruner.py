"""The pruner, in the relay process: every ``prune_interval_s`` it deletes what is past its
window (``plumbing/settings/retention.py``), table by table, a batch of rows per
transaction until a table has nothing more to give, yielding between batches.

Why batched deletes and not partitioned tables: a job's row is updated in place through its
life and is kept by when it *ended*, not when it was created, and the tables keep uniqueness
across all their rows (a tenant's idempotency keys, a batch's custom_ids, one delivery per
job event), which a partitioned table could keep only per partition. Deleting in short
batches by index keeps every lock brief, and the space is reused by the rows that follow
(autovacuum), so the tables stay flat once the window is reached.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from plumbing.retry import count as count_retry
from plumbing.retry import outage, wait_first
from plumbing.settings.retention import RetentionSettings
from producers.metrics import PRUNED
from producers.retention.repository import RetentionStore

log = logging.getLogger(__name__)

# A worker row not written for this long is one of a worker that died: its row goes.
WORKER_GONE_S = 3600.0

Step = Callable[[datetime, int], Awaitable[int]]


class Pruner:
    def __init__(self, retention: RetentionSettings, store: RetentionStore) -> None:
        self._settings = retention
        self._store = store

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.prune(datetime.now(UTC), stop)
            except Exception as exc:
                if count_retry("prune", exc, outage) is None:
                    raise
                log.warning("pruner: a pass failed, retrying next interval: %r", exc)
            await wait_first(stop, limit_s=self._settings.prune_interval_s)

    async def prune(self, now: datetime, stop: asyncio.Event | None = None) -> dict[str, int]:
        """One pass; the rows deleted, by table."""
        s, store = self._settings, self._store
        outbox_cutoff = now - timedelta(seconds=s.retention_outbox_s)
        ended_cutoff = now - timedelta(seconds=s.retention_ended_s)
        workers_cutoff = now - timedelta(seconds=WORKER_GONE_S)
        done = {
            "outbox": await self._drain(store.outbox, outbox_cutoff, stop),
            "jobs": await self._drain(store.single_jobs, ended_cutoff, stop),
            "webhook_deliveries": await self._drain(store.deliveries, ended_cutoff, stop),
            "dead_letters": await self._drain(store.dead_letters, ended_cutoff, stop),
            "workers": await self._drain(store.workers, workers_cutoff, stop),
        }
        batch_jobs, batches = await self._batches(ended_cutoff, stop)
        done["jobs"] += batch_jobs
        done["batches"] = batches
        for table, rows in done.items():
            if rows:
                PRUNED.labels(table=table).inc(rows)
        if any(done.values()):
            log.info("pruned %s", ", ".join(f"{n} {t}" for t, n in done.items() if n))
        return done

    async def _drain(self, step: Step, cutoff: datetime, stop: asyncio.Event | None) -> int:
        limit, total = self._settings.prune_batch_rows, 0
        while stop is None or not stop.is_set():
            rows = await step(cutoff, limit)
            total += rows
            if rows < limit:
                break
            await asyncio.sleep(0)  # let the relay's own work in between
        return total

    def _jobs_of(self, batch_id: str) -> Step:
        async def step(_: datetime, limit: int) -> int:
            return await self._store.batch_jobs(batch_id, limit)

        return step

    async def _batches(self, cutoff: datetime, stop: asyncio.Event | None) -> tuple[int, int]:
        """Ended batches past their window: their jobs a batch at a time, then the batch."""
        jobs = batches = 0
        while stop is None or not stop.is_set():
            batch_id = await self._store.ended_batch(cutoff)
            if batch_id is None:
                break
            jobs += await self._drain(self._jobs_of(batch_id), cutoff, stop)
            if not await self._store.batch(batch_id):
                break  # another relay holds some of its jobs: next pass
            batches += 1
        return jobs, batches
