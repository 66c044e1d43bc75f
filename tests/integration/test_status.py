"""The status API: ETag and 304, poll hints, queue estimates, paged lists, and long-polls
that wait on NOTIFY rather than on the table."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import event, update
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from schemas.tables import jobs
from tests.integration.serving import serve

DOC = "Status answers say when to look again. " * 4


@pytest.fixture
async def api(settings: Settings, db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(settings, db) as client:
        yield client


async def submit(api: httpx.AsyncClient, tenant: str = "default", **extra: Any) -> str:
    response = await api.post(
        "/v1/jobs",
        json={"kind": "summarize", "input": DOC, "ttl_s": 600, **extra},
        headers={"X-Sluicegate-Tenant": tenant},
    )
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


async def test_etag_answers_304_until_the_job_changes(api: httpx.AsyncClient) -> None:
    job_id = await submit(api)
    first = await api.get(f"/v1/jobs/{job_id}")
    assert first.status_code == 200
    tag = first.headers["etag"]
    assert tag.startswith('W/"')

    same = await api.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": tag})
    assert same.status_code == 304
    assert same.content == b""
    assert same.headers["etag"] == tag
    assert int(same.headers["retry-after"]) >= 1  # still not terminal: when to look again

    other = await api.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": 'W/"stale"'})
    assert other.status_code == 200

    assert (await api.delete(f"/v1/jobs/{job_id}")).status_code == 200
    changed = await api.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": tag})
    assert changed.status_code == 200
    assert changed.json()["state"] == "cancelled"
    assert changed.headers["etag"] != tag
    assert "retry-after" not in changed.headers  # terminal: nothing more to wait for


async def test_queue_position_counts_every_earlier_unstarted_job(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    first = await submit(api, tenant="a")
    second = await submit(api, tenant="b")
    third = await submit(api, tenant="a")
    positions = [
        (await api.get(f"/v1/jobs/{j}", headers={"X-Sluicegate-Tenant": t})).json()
        for j, t in ((first, "a"), (second, "b"), (third, "a"))
    ]
    assert [p["queue_position"] for p in positions] == [0, 1, 2]

    async with db.begin() as conn:  # the first one starts: no longer ahead of anyone
        await conn.execute(update(jobs).where(jobs.c.id == first).values(state="dispatched"))
        await conn.execute(update(jobs).where(jobs.c.id == first).values(state="running"))
    view = (await api.get(f"/v1/jobs/{third}", headers={"X-Sluicegate-Tenant": "a"})).json()
    assert view["queue_position"] == 1
    running = (await api.get(f"/v1/jobs/{first}", headers={"X-Sluicegate-Tenant": "a"})).json()
    assert running["queue_position"] is None
    assert running["expected_start_at"] is None


async def test_list_pages_filters_and_stays_within_the_tenant(api: httpx.AsyncClient) -> None:
    mine = [await submit(api, tenant="a") for _ in range(5)]
    await submit(api, tenant="b")
    assert (
        await api.delete(f"/v1/jobs/{mine[1]}", headers={"X-Sluicegate-Tenant": "a"})
    ).is_success

    seen: list[str] = []
    after = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if after:
            params["after"] = after
        page = await api.get("/v1/jobs", params=params, headers={"X-Sluicegate-Tenant": "a"})
        assert page.status_code == 200, page.text
        body = page.json()
        seen += [j["id"] for j in body["data"]]
        pages += 1
        after = body["next_after"]
        if after is None:
            break
    assert seen == mine  # oldest first, every one once, none of tenant b's
    assert pages == 3

    cancelled = await api.get(
        "/v1/jobs", params={"state": "cancelled"}, headers={"X-Sluicegate-Tenant": "a"}
    )
    assert [j["id"] for j in cancelled.json()["data"]] == [mine[1]]
    # The others are queued, or dispatched once their records, published at once, are
    # marked: the filter takes every state named.
    both = await api.get(
        "/v1/jobs",
        params=[("state", "cancelled"), ("state", "queued"), ("state", "dispatched")],
        headers={"X-Sluicegate-Tenant": "a"},
    )
    assert len(both.json()["data"]) == 5
    assert {j["state"] for j in both.json()["data"]} - {"queued", "dispatched"} == {"cancelled"}
    bad = await api.get("/v1/jobs", params={"state": "sleeping"})
    assert bad.status_code == 422
    assert bad.json()["error"]["code"] == "invalid_request"


# A read of job rows, as a waiting request makes (select(jobs)).
JOB_ROWS = "SELECT jobs.id, jobs.tenant"


async def test_long_poll_waits_on_notify_not_on_the_table(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    job_id = await submit(api)
    reads: list[str] = []

    def count_reads(conn: object, cursor: object, statement: str, *args: object) -> None:
        if JOB_ROWS in statement:  # not the meter's nor the flow's counts
            reads.append(statement)

    event.listen(db.sync_engine, "before_cursor_execute", count_reads)
    try:
        waiting = asyncio.create_task(api.get(f"/v1/jobs/{job_id}", params={"wait": 20}))
        await asyncio.sleep(1.5)
        assert not waiting.done()
        held = len(reads)
        # At most the read when the wait began: no polling while it is held.
        assert held <= 1, reads
        async with db.begin() as conn:
            await conn.execute(update(jobs).where(jobs.c.id == job_id).values(state="cancelled"))
        answer = await asyncio.wait_for(waiting, 5)
    finally:
        event.remove(db.sync_engine, "before_cursor_execute", count_reads)
    assert answer.status_code == 200
    assert answer.json()["state"] == "cancelled"


async def test_waiters_woken_together_share_one_read(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    ids = [await submit(api) for _ in range(20)]
    reads: list[str] = []

    def count_reads(conn: object, cursor: object, statement: str, *args: object) -> None:
        if JOB_ROWS in statement:  # not the meter's nor the flow's counts
            reads.append(statement)

    event.listen(db.sync_engine, "before_cursor_execute", count_reads)
    try:
        waiting = [
            asyncio.create_task(api.get(f"/v1/jobs/{job_id}", params={"wait": 20}))
            for job_id in ids
        ]
        # Every request has read its job once (however loaded the machine), then waits.
        async with asyncio.timeout(30):
            while len(reads) < len(ids):
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        assert not any(task.done() for task in waiting)
        reads.clear()
        async with db.begin() as conn:  # twenty jobs end in one write
            await conn.execute(update(jobs).where(jobs.c.id.in_(ids)).values(state="cancelled"))
        answers = await asyncio.wait_for(asyncio.gather(*waiting), 10)
    finally:
        event.remove(db.sync_engine, "before_cursor_execute", count_reads)
    assert {a.json()["state"] for a in answers} == {"cancelled"}
    assert len(reads) <= 2, reads  # not one read per woken request
