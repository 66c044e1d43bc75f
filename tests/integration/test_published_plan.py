"""Recording rows as published stays linear in the rows on the real database: under the
generic plan that a prepared statement gets (the planner counts a few rows in a CTE over
``unnest``), each CTE is scanned once, not once per row of another. A nested loop over two
CTEs had made a statement of 2,944 records take a second, and the records that waited
meanwhile made the next one longer."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, insert, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.published_store import RECORD, Acked, OutboxRow, Published, params
from plumbing.settings import Settings
from schemas.tables import jobs, outbox
from tests.integration.rows import job

RECORDED = 2_000


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(_nodes(child))
    return found


async def test_a_statement_of_many_records_scans_each_cte_once(
    db: AsyncEngine, settings: Settings
) -> None:
    topic = settings.dispatch_topic
    rows = [job(f"doc {i}", "queued", None, dispatch_topic=topic) for i in range(RECORDED)]
    async with db.begin() as conn:
        await conn.execute(insert(jobs), rows)
        ids = (
            await conn.execute(
                insert(outbox).returning(outbox.c.id, sort_by_parameter_order=True),
                [{"topic": topic, "key": r["id"], "payload": b"{}"} for r in rows],
            )
        ).scalars()
    records = [
        Published(
            row=OutboxRow(id=outbox_id, topic=topic, key=r["id"], payload=b"{}"),
            acked=Acked(topic=topic, partition=i % 4, offset=i // 4),
            dispatch=True,
        )
        for i, (outbox_id, r) in enumerate(zip(ids, rows, strict=True))
    ]
    statement = RECORD.compile(dialect=postgresql.dialect(paramstyle="named"))
    explained = text(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}")
    async with db.begin() as conn:
        await conn.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
        plan = (await conn.execute(explained, params(records))).scalar_one()[0]["Plan"]
        scans = [n for n in _nodes(plan) if n["Node Type"] == "CTE Scan"]
        assert scans, "no CTE scanned: the statement changed shape"
        looped = [(n["CTE Name"], n["Actual Loops"]) for n in scans if n["Actual Loops"] > 1]
        assert looped == []
        dispatched = select(func.count()).where(jobs.c.state == "dispatched")
        assert (await conn.execute(dispatched)).scalar_one() == RECORDED
