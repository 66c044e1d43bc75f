"""kill -9 a worker while its jobs decode: another worker takes them over, and each job
reaches exactly one terminal state with one terminal event and one webhook delivery."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from schemas.states import TERMINAL_STATES
from schemas.tables import outbox, webhook_deliveries
from tests.faults.outcomes import DOC, states, terminal_event, until
from tests.faults.processes import roles
from tests.integration.serving import serve

pytestmark = pytest.mark.timeout(240)

JOBS = 16


async def test_a_worker_killed_mid_decode_hands_its_jobs_over(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> None:
    terminal = {s.value for s in TERMINAL_STATES}
    with roles(settings, tmp_path) as started:
        started.start("relay")
        started.start("webhooks")
        doomed = started.start("worker", sim_time_scale=5.0)
        async with serve(settings, db) as api:
            ids = []
            for _ in range(JOBS):
                r = await api.post(
                    "/v1/jobs",
                    json={
                        "kind": "complete",
                        "input": DOC,
                        "max_tokens": 400,
                        "ttl_s": 600,
                        # Refused when called (loopback), but every terminal state still
                        # makes its one delivery row.
                        "callback_url": "http://127.0.0.1:9/hook",
                    },
                )
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])
            # The only worker is decoding: every running job is its.
            await until(db, ids, lambda s: sum(st == "running" for st, _ in s.values()) >= 4, 90)
            doomed.kill()
            survivor = started.start("worker")
            await until(db, ids, lambda s: all(st in terminal for st, _ in s.values()), 150)
            # The dispatcher (consuming the events topic on its own time) makes each
            # terminal state's delivery row.
            deliveries = await delivered(db, len(ids), within_s=60)
        assert survivor.process.poll() is None

    final = await states(db, ids)
    assert Counter(state for state, _ in final.values()) == Counter({"succeeded": JOBS})
    taken_over = [job for job, (_, attempt) in final.items() if attempt >= 2]
    assert taken_over, "the killed worker had jobs running; they must have run again"
    async with db.connect() as conn:
        records = (await conn.execute(select(outbox.c.key, outbox.c.payload))).all()
    ends = Counter(r.key for r in records if r.key in final and terminal_event(r.payload, terminal))
    assert ends == Counter(dict.fromkeys(ids, 1))  # one terminal event per job
    assert deliveries == Counter(dict.fromkeys(ids, 1))  # one webhook sequence per job


async def delivered(db: AsyncEngine, subjects: int, within_s: float) -> Counter[str]:
    """Delivery rows by subject, once the dispatcher has made rows for ``subjects``."""
    async with asyncio.timeout(within_s):
        while True:
            async with db.connect() as conn:
                rows = Counter(
                    str(s) for s in await conn.scalars(select(webhook_deliveries.c.subject))
                )
            if len(rows) >= subjects:
                return rows
            await asyncio.sleep(0.3)
