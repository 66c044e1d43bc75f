"""The jobs-by-state gauge on the real PostgreSQL: the API refreshes it at the lag
monitor's cadence from one GROUP BY over the jobs not ended, and a pair whose jobs ended
reads 0."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import insert, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from producers.overview.repository import unended_counts
from schemas import constants
from schemas.tables import jobs
from tests.integration.rows import job
from tests.integration.serving import serve

# Models of this test's own: the gauge is the process's, other tests' series stay in it.
A, B = "gauge-a", "gauge-b"


async def gauge(api: httpx.AsyncClient) -> dict[tuple[str, str], float]:
    """The gauge's series of this test's models, by (model, state), from /metrics."""
    answer = await api.get("/metrics")
    assert answer.status_code == 200
    found = {}
    for family in text_string_to_metric_families(answer.text):
        if family.name != constants.M_JOBS_BY_STATE:
            continue
        for sample in family.samples:
            if sample.labels["model"] in (A, B):
                found[sample.labels["model"], sample.labels["state"]] = sample.value
    return found


async def until_gauge(
    api: httpx.AsyncClient, want: dict[tuple[str, str], float]
) -> dict[tuple[str, str], float]:
    seen: dict[tuple[str, str], float] = {}
    try:
        async with asyncio.timeout(20):  # refreshed every gauge.MIN_INTERVAL_S
            while (seen := await gauge(api)) != want:
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"gauge {seen}, wanted {want}") from None
    return seen


async def test_the_gauge_counts_jobs_not_ended_by_state_and_model(
    settings: Settings, db: AsyncEngine
) -> None:
    now = datetime.now(UTC)
    rows = [
        job("a-q1", "queued", None, params={"model": A}),
        job("a-q2", "queued", None, params={"model": A}, tenant="u"),  # every tenant's
        job("a-r", "running", None, params={"model": A}, started_at=now),
        job("b-d", "dispatched", None, params={"model": B}),
        job("b-done", "succeeded", now, params={"model": B}),  # ended: not counted
    ]
    async with db.begin() as conn:
        for row in rows:
            await conn.execute(insert(jobs).values(row))
    ids = {r["input"]: r["id"] for r in rows}
    fast = settings.model_copy(update={"lag_interval_s": 0.1})
    async with serve(fast, db) as api:
        await until_gauge(
            api,
            {
                (A, "queued"): 2,
                (A, "dispatched"): 0,
                (A, "running"): 1,
                (B, "queued"): 0,
                (B, "dispatched"): 1,
                (B, "running"): 0,
            },
        )
        # The running job of A succeeds, B's is cancelled: their pairs go to 0, not stay.
        async with db.begin() as conn:
            await conn.execute(
                update(jobs)
                .where(jobs.c.id == ids["a-r"])
                .values(state="succeeded", finished_at=now)
            )
            await conn.execute(
                update(jobs)
                .where(jobs.c.id == ids["b-d"])
                .values(state="cancelled", finished_at=now)
            )
            b_running = job("b-r", "running", None, params={"model": B})
            await conn.execute(insert(jobs).values(b_running))
        await until_gauge(
            api,
            {
                (A, "queued"): 2,
                (A, "dispatched"): 0,
                (A, "running"): 0,
                (B, "queued"): 0,
                (B, "dispatched"): 0,
                (B, "running"): 1,
            },
        )


async def test_the_count_reads_an_index_not_the_whole_table(db: AsyncEngine) -> None:
    """The GROUP BY names the states not ended, so an index finds their rows: it never
    passes over the ended jobs that retention keeps."""
    query = unended_counts(None).compile(db.sync_engine, compile_kwargs={"literal_binds": True})
    async with db.begin() as conn:
        await conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join((await conn.execute(text(f"EXPLAIN {query}"))).scalars())
    assert "Seq Scan" not in plan, plan
    assert "ix_jobs_state" in plan, plan
