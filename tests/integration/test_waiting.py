"""?wait= long-polls, heartbeat leases and abandonment on disconnect, against real services.

Nothing here runs a relay or a worker: a job stays queued unless the test itself ends it,
from another connection, the way a worker would.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI

from plumbing.db import libpq_url
from plumbing.settings import Settings
from producers.api.app import create_app
from producers.api.waiting import Waiters, WaitersFull
from tests.integration.serving import post_then_hang_up, serving, until

MAX_WAIT_S = 5.0
JOB = {"kind": "complete", "input": "Write one line about locks on a canal."}


@dataclass
class Api:
    app: FastAPI
    client: httpx.AsyncClient
    settings: Settings

    def waiting(self) -> int:
        waiters: Waiters = self.app.state.waiters
        return len(waiters)


@pytest.fixture
def wait_settings(settings: Settings) -> Settings:
    # The test plays the worker's writes by hand and runs no relay: a job stays queued
    # unless the test moves it (the API publishing it at once would dispatch it).
    return settings.model_copy(update={"max_wait_s": MAX_WAIT_S, "publish_at_once": False})


@pytest.fixture
async def api(wait_settings: Settings) -> AsyncIterator[Api]:
    app = create_app(wait_settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sg") as client:
            yield Api(app=app, client=client, settings=wait_settings)


@pytest.fixture
async def sql(wait_settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the test's own: the writes a worker would make, and direct reads."""
    conn = await asyncpg.connect(libpq_url(wait_settings.require_database_url()))
    yield conn
    await conn.close()


async def row(sql: asyncpg.Connection, job_id: str) -> dict[str, Any]:
    found = await sql.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
    assert found is not None
    out = dict(found)
    if isinstance(out["error"], str):
        out["error"] = json.loads(out["error"])
    return out


async def submit(api: Api, **extra: Any) -> str:
    r = await api.client.post("/v1/jobs", json={**JOB, **extra})
    assert r.status_code == 202, r.text
    job_id: str = r.json()["id"]
    return job_id


async def succeed(sql: asyncpg.Connection, job_id: str) -> None:
    """What a worker's terminal write does to the row (the trigger sends the NOTIFY)."""
    await sql.execute(
        "UPDATE jobs SET state = 'succeeded', result = $2::jsonb, finished_at = now(), "
        "updated_at = now() WHERE id = $1",
        job_id,
        json.dumps({"text": "done"}),
    )


async def events(sql: asyncpg.Connection, settings: Settings, job_id: str) -> list[dict[str, Any]]:
    rows = await sql.fetch(
        "SELECT payload FROM outbox WHERE topic = $1 AND key = $2 ORDER BY id",
        settings.events_topic,
        job_id,
    )
    return [json.loads(r["payload"]) for r in rows]


# --- long-poll GET -------------------------------------------------------------------------


async def test_long_poll_is_woken_by_a_terminal_write_from_another_connection(
    api: Api, sql: asyncpg.Connection
) -> None:
    job_id = await submit(api)
    started = time.monotonic()
    poll = asyncio.create_task(api.client.get(f"/v1/jobs/{job_id}?wait={MAX_WAIT_S}"))
    await until(lambda: api.waiting() == 1)
    await asyncio.sleep(0.2)
    assert not poll.done()  # it waits: the job is queued
    await succeed(sql, job_id)
    woken = time.monotonic()
    r = await asyncio.wait_for(poll, 2)
    answered = time.monotonic()
    assert r.status_code == 200
    assert r.json()["state"] == "succeeded"
    assert r.json()["result"] == {"text": "done"}
    # Woken by the NOTIFY within a moment, long before the wait of MAX_WAIT_S ran out.
    assert answered - woken < 1.0
    assert answered - started < MAX_WAIT_S / 2
    assert api.waiting() == 0


async def test_long_poll_is_woken_by_a_cancel_through_the_api(api: Api) -> None:
    job_id = await submit(api)
    poll = asyncio.create_task(api.client.get(f"/v1/jobs/{job_id}?wait={MAX_WAIT_S}"))
    await until(lambda: api.waiting() == 1)
    cancel = await api.client.delete(f"/v1/jobs/{job_id}")
    assert cancel.status_code == 200
    assert cancel.json()["error"] == {
        "code": "cancelled",
        "reason": "cancelled",
        "message": "cancelled by the caller",
    }
    r = await asyncio.wait_for(poll, 2)
    assert r.status_code == 200
    assert r.json()["state"] == "cancelled"


LISTENERS = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
    "AND query LIKE 'LISTEN%sluicegate_jobs%'"
)


async def test_long_poll_rereads_after_the_listener_reconnects(
    api: Api, sql: asyncpg.Connection, pg_admin_url: str
) -> None:
    """A notice sent while the LISTEN connection is down is lost: the reconnect wakes all."""
    job_id = await submit(api)
    poll = asyncio.create_task(api.client.get(f"/v1/jobs/{job_id}?wait={MAX_WAIT_S}"))
    await until(lambda: api.waiting() == 1)
    async with asyncio.timeout(5):
        while not await sql.fetch(LISTENERS):
            await asyncio.sleep(0.01)
    # Keep it from connecting again until the job has ended: its notice is lost for sure.
    database = await sql.fetchval("SELECT current_database()")
    admin = await asyncpg.connect(pg_admin_url)
    try:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        await sql.execute(f"SELECT pg_terminate_backend(pid, 5000) FROM ({LISTENERS}) l")
        await succeed(sql, job_id)
        await asyncio.sleep(0.3)  # the listener's first attempts to reconnect fail
        assert not poll.done()
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()
    r = await asyncio.wait_for(poll, 3)
    assert r.json()["state"] == "succeeded"


async def test_long_poll_without_an_end_answers_when_the_wait_runs_out(api: Api) -> None:
    job_id = await submit(api)
    started = time.monotonic()
    r = await api.client.get(f"/v1/jobs/{job_id}?wait=0.5")
    assert 0.5 <= time.monotonic() - started < 2
    assert r.status_code == 200
    assert r.json()["state"] == "queued"
    assert api.waiting() == 0


# --- POST ?wait= -------------------------------------------------------------------------


async def test_submit_and_wait_answers_202_with_retry_after_when_nothing_ends_it(
    api: Api,
) -> None:
    started = time.monotonic()
    r = await api.client.post("/v1/jobs?wait=0.5", json=JOB)
    assert 0.5 <= time.monotonic() - started < 2
    assert r.status_code == 202, r.text
    assert r.headers["retry-after"] == "1"
    view = r.json()
    assert view["state"] == "queued"
    assert view["tenant"] == "default"  # the full job, not the submit receipt
    assert r.headers["location"] == view["status_url"] == f"/v1/jobs/{view['id']}"


async def test_submit_and_wait_answers_200_with_the_result_once_it_ends(
    api: Api, sql: asyncpg.Connection
) -> None:
    post = asyncio.create_task(api.client.post(f"/v1/jobs?wait={MAX_WAIT_S}", json=JOB))
    await until(lambda: api.waiting() == 1)
    job_id = str(await sql.fetchval("SELECT id FROM jobs"))
    await succeed(sql, job_id)
    r = await asyncio.wait_for(post, 2)
    assert r.status_code == 200, r.text
    assert "retry-after" not in r.headers
    assert r.json()["id"] == job_id
    assert r.json()["result"] == {"text": "done"}


async def test_submit_without_wait_is_unchanged(api: Api) -> None:
    r = await api.client.post("/v1/jobs", json=JOB)
    assert r.status_code == 202
    assert set(r.json()) == {"id", "state", "deadline", "created_at", "status_url"}
    assert "retry-after" not in r.headers


async def test_waiting_renews_the_lease_of_a_present_caller(
    api: Api, sql: asyncpg.Connection
) -> None:
    post = asyncio.create_task(
        api.client.post("/v1/jobs?wait=3", json={**JOB, "abandon_after_s": 1})
    )
    await until(lambda: api.waiting() == 1)
    job_id = str(await sql.fetchval("SELECT id FROM jobs"))
    await asyncio.sleep(2.0)
    during = await row(sql, job_id)
    # Renewed every abandon_after_s / 2 = 0.5 s while the caller waits.
    assert during["last_seen_at"] - during["created_at"] >= timedelta(seconds=1.4)
    r = await post
    assert r.status_code == 202
    assert r.json()["state"] == "queued"


# --- disconnects over a real server ----------------------------------------------------------


@pytest.mark.parametrize("abandon", [True, False])
async def test_a_disconnect_while_waiting(
    wait_settings: Settings, sql: asyncpg.Connection, abandon: bool
) -> None:
    settings = wait_settings.model_copy(update={"max_wait_s": 60.0})
    app = create_app(settings)
    async with serving(app) as port:
        waiters: Waiters = app.state.waiters
        await post_then_hang_up(
            port, {**JOB, "abandon_on_disconnect": abandon}, lambda: len(waiters) == 1
        )
        job_id = str(await sql.fetchval("SELECT id FROM jobs"))
        hung_up = time.monotonic()
        await until(lambda: len(waiters) == 0, within_s=2)  # the wait ended at once
        if abandon:
            async with asyncio.timeout(2):
                while (found := await row(sql, job_id))["state"] != "abandoned":
                    await asyncio.sleep(0.02)
            assert time.monotonic() - hung_up < 2
            assert found["error"]["code"] == "abandoned"
            assert found["error"]["reason"] == "disconnected"
            assert found["finished_at"] is not None
            announced = await events(sql, settings, job_id)
            assert [(e["state"], e["error_code"]) for e in announced] == [
                ("abandoned", "abandoned")
            ]
        else:
            await asyncio.sleep(0.3)
            found = await row(sql, job_id)
            assert found["state"] == "queued"
            assert found["error"] is None
            assert await events(sql, settings, job_id) == []


async def test_a_disconnect_never_overwrites_a_terminal_state(
    api: Api, sql: asyncpg.Connection
) -> None:
    """The abandonment is conditional: a job that ended first keeps its end."""
    repo = api.app.state.repo
    job_id = await submit(api, abandon_on_disconnect=True)
    await succeed(sql, job_id)
    assert await repo.abandon("default", job_id, "disconnected") is False
    assert (await row(sql, job_id))["state"] == "succeeded"
    assert await events(sql, api.settings, job_id) == []
    other = await submit(api, abandon_on_disconnect=True)
    assert await repo.abandon("someone-else", other, "disconnected") is False
    assert await repo.abandon("default", other, "disconnected") is True
    assert await repo.abandon("default", other, "disconnected") is False
    assert len(await events(sql, api.settings, other)) == 1


# --- heartbeats --------------------------------------------------------------------------


async def test_heartbeat_and_get_renew_the_lease(api: Api, sql: asyncpg.Connection) -> None:
    job_id = await submit(api, abandon_after_s=60)
    seen = (await row(sql, job_id))["last_seen_at"]

    await asyncio.sleep(0.05)
    r = await api.client.post(f"/v1/jobs/{job_id}/heartbeat")
    assert r.status_code == 200, r.text
    assert r.json()["id"] == job_id
    after_heartbeat = (await row(sql, job_id))["last_seen_at"]
    assert after_heartbeat > seen
    assert datetime.fromisoformat(r.json()["last_seen_at"]) == after_heartbeat

    await asyncio.sleep(0.05)
    r = await api.client.get(f"/v1/jobs/{job_id}")
    assert r.status_code == 200
    after_get = (await row(sql, job_id))["last_seen_at"]
    assert after_get > after_heartbeat

    cancelled = await api.client.delete(f"/v1/jobs/{job_id}")
    assert cancelled.status_code == 200
    await asyncio.sleep(0.05)
    r = await api.client.post(f"/v1/jobs/{job_id}/heartbeat")
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "job_terminal"
    await api.client.get(f"/v1/jobs/{job_id}")
    assert (await row(sql, job_id))["last_seen_at"] == after_get  # no lease to renew now


async def test_get_leaves_a_job_without_a_lease_alone(api: Api, sql: asyncpg.Connection) -> None:
    job_id = await submit(api)
    seen = (await row(sql, job_id))["last_seen_at"]
    await asyncio.sleep(0.05)
    assert (await api.client.get(f"/v1/jobs/{job_id}")).status_code == 200
    assert (await row(sql, job_id))["last_seen_at"] == seen


async def test_heartbeat_of_another_tenant_or_unknown_job_is_not_found(
    api: Api, sql: asyncpg.Connection
) -> None:
    job_id = await submit(api, abandon_after_s=60)
    seen = (await row(sql, job_id))["last_seen_at"]
    other = {"X-Sluicegate-Tenant": "someone-else"}
    for path in (
        f"/v1/jobs/{job_id}/heartbeat",
        "/v1/jobs/0190a4c0-0000-7000-8000-000000000000/heartbeat",
        "/v1/jobs/not-a-uuid/heartbeat",
    ):
        r = await api.client.post(path, headers=other)
        assert r.status_code == 404, path
        assert r.json()["error"]["code"] == "job_not_found"
    r = await api.client.get(f"/v1/jobs/{job_id}", headers=other)
    assert r.status_code == 404
    assert (await row(sql, job_id))["last_seen_at"] == seen  # nobody else renews it


# --- validation ----------------------------------------------------------------------------


BAD_WAITS = ["0", "-1", f"{MAX_WAIT_S + 0.5}", "abc", "nan", "inf", ""]


@pytest.mark.parametrize("wait", BAD_WAITS)
async def test_a_bad_wait_is_refused_before_anything_is_stored(
    api: Api, sql: asyncpg.Connection, wait: str
) -> None:
    r = await api.client.post(f"/v1/jobs?wait={wait}", json=JOB)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_wait"
    assert await sql.fetchval("SELECT count(*) FROM jobs") == 0
    assert await sql.fetchval("SELECT count(*) FROM outbox") == 0


@pytest.mark.parametrize("wait", BAD_WAITS)
async def test_a_bad_wait_on_a_long_poll_is_refused(api: Api, wait: str) -> None:
    job_id = await submit(api)
    r = await api.client.get(f"/v1/jobs/{job_id}?wait={wait}")
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_wait"


async def test_the_longest_wait_is_allowed(api: Api) -> None:
    job_id = await submit(api)
    poll = asyncio.create_task(api.client.get(f"/v1/jobs/{job_id}?wait={MAX_WAIT_S}"))
    await until(lambda: api.waiting() == 1)
    await api.client.delete(f"/v1/jobs/{job_id}")
    assert (await asyncio.wait_for(poll, 2)).status_code == 200


# --- the registry itself (no I/O) ------------------------------------------------------------


async def test_waiters_wake_by_job_on_notice_and_all_on_reconnect() -> None:
    waiters = Waiters(limit=3)
    a, b = "0190a4c0-0000-7000-8000-00000000000a", "0190a4c0-0000-7000-8000-00000000000b"
    with waiters.watch(a) as ea, waiters.watch(a) as ea2, waiters.watch(b) as eb:
        assert len(waiters) == 3
        with pytest.raises(WaitersFull), waiters.watch(b):
            pass
        waiters.on_notice(f"{a} succeeded 1767225600.5 succeeded")
        assert ea.is_set()
        assert ea2.is_set()
        assert not eb.is_set()
        waiters.on_notice("garbage")
        assert not eb.is_set()
        waiters.on_connect()
        assert eb.is_set()
    assert len(waiters) == 0
    waiters.on_notice(f"{a} failed 1767225600.5")  # nobody waits: nothing to do
