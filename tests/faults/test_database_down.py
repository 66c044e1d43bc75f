"""PostgreSQL stopped for a while under load: the API answers 503 with Retry-After (never
a 500, never a hang), workers hold their jobs instead of losing them, and everything
resumes when it is back."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from plumbing.db import make_engine
from plumbing.settings import Settings
from sluicegate import migrate
from sluicegate.local.embedded import EmbeddedPostgres
from tests.faults.outcomes import DOC, states, until
from tests.faults.processes import roles
from tests.integration.serving import serve

pytestmark = pytest.mark.timeout(300)

JOBS = 12
ANSWER_WITHIN_S = 5.0


async def test_the_database_down_is_503_and_nothing_is_lost(
    settings: Settings, tmp_path: Path
) -> None:
    server = EmbeddedPostgres(tmp_path / "pg")
    await asyncio.to_thread(server.start)
    try:
        await migrate.upgrade_async(server.url)
        own = settings.model_copy(update={"database_url": server.url})
        db = make_engine(server.url, pool_size=4)
        with roles(own, tmp_path) as started:
            started.start("relay")
            worker = started.start("worker", sim_time_scale=5.0)
            async with serve(own, db) as api:
                ids = []
                for _ in range(JOBS):
                    r = await api.post("/v1/jobs", json={"kind": "complete", "input": DOC})
                    assert r.status_code == 202, r.text
                    ids.append(r.json()["id"])
                await until(db, ids, lambda s: any(st == "running" for st, _ in s.values()), 60)

                await asyncio.to_thread(server.stop)
                for method, path, body in [
                    ("POST", "/v1/jobs", {"kind": "complete", "input": DOC}),
                    ("GET", f"/v1/jobs/{ids[0]}", None),
                    ("DELETE", f"/v1/jobs/{ids[-1]}", None),
                    ("GET", "/healthz", None),
                ]:
                    began = time.monotonic()
                    r = await api.request(method, path, json=body)
                    assert time.monotonic() - began < ANSWER_WITHIN_S, path
                    assert r.status_code == 503, (path, r.text)
                    assert r.json()["error"]["code"] == "database_unavailable"
                    assert int(r.headers["Retry-After"]) >= 1
                await asyncio.sleep(3)  # the worker meets the outage mid-decode and claim
                assert worker.process.poll() is None, worker.output()

                await asyncio.to_thread(server.start)
                await until(db, ids, lambda s: all(st == "succeeded" for st, _ in s.values()), 120)
                r = await api.post("/v1/jobs", json={"kind": "complete", "input": DOC})
                assert r.status_code == 202, r.text
        final = await states(db, ids)
        assert Counter(state for state, _ in final.values()) == Counter({"succeeded": JOBS})
        assert {attempt for _, attempt in final.values()} == {1}  # none lost, none run twice
        await db.dispose()
    finally:
        await asyncio.to_thread(server.stop)
