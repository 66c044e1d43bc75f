"""Seeing the pipeline: operator keys, the list filters of jobs and batches, one job's
timeline, the overview, and the workers' presence rows, on the real PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from producers.retention.pruner import Pruner
from producers.retention.repository import RetentionStore
from producers.tenancy.repository import KeyStore
from schemas import reasons
from schemas.states import JobState
from schemas.tables import jobs, webhook_attempts, webhook_deliveries, workers
from tests.integration.rows import batch_of, job
from tests.integration.serving import serve
from workers.engines.sim.engine import SimEngine
from workers.gate import PullGate
from workers.presence.report import Presence
from workers.presence.repository import PresenceRepository

NOW = datetime.now(UTC)


@pytest.fixture
async def api(settings: Settings, db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    keyed = settings.model_copy(update={"auth": "api_key", "api_key_cache_s": 0})
    async with serve(keyed, db) as client:
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _jobs(db: AsyncEngine) -> dict[str, str]:
    """Jobs of tenants t and u in several states and models; their ids by name."""
    ended = NOW - timedelta(seconds=30)
    rows = [
        job("q-sim", "queued", None, params={"model": "sim"}),
        job("q-default", "queued", None),
        job("r-sim", "running", None, params={"model": "sim"}, started_at=NOW),
        job(
            "expired",
            "expired",
            ended,
            error=reasons.error(JobState.EXPIRED, reasons.DEADLINE_UNREACHABLE, "before_decode"),
        ),
        job("cancelled", "cancelled", ended, error=reasons.error(JobState.CANCELLED, "cancelled")),
        job("old", "succeeded", NOW - timedelta(days=2)),
        job("u-queued", "queued", None, tenant="u", params={"model": "sim"}),
    ]
    async with db.begin() as conn:
        for row in rows:
            await conn.execute(insert(jobs).values(row))
    return {r["input"]: r["id"] for r in rows}


async def test_filters_scope_a_plain_key_and_an_operator_sees_every_tenant(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    ids = await _jobs(db)
    store = KeyStore(db)
    plain, operator = await store.create("t"), await store.create("ops", operator=True)

    async def names(key: str, **params: str | list[str]) -> set[str]:
        answer = await api.get("/v1/jobs", params=params, headers=bearer(key))
        assert answer.status_code == 200, answer.text
        by_id = {v: k for k, v in ids.items()}
        return {by_id[j["id"]] for j in answer.json()["data"]}

    assert await names(plain, state="queued") == {"q-sim", "q-default"}
    assert await names(plain, model="sim") == {"q-sim", "r-sim"}
    assert await names(plain, model="default", state=["queued", "running"]) == {"q-default"}
    assert await names(plain, tenant="t", state="running") == {"r-sim"}
    refused = await api.get("/v1/jobs", params={"tenant": "u"}, headers=bearer(plain))
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "operator_only"

    assert await names(operator, model="sim") == {"q-sim", "r-sim", "u-queued"}
    assert await names(operator, tenant="u") == {"u-queued"}
    assert await names(operator, tenant="ops") == set()
    # The operator reads and cancels another tenant's job; the plain key of u cannot.
    u_key = await store.create("u")
    assert (
        await api.get(f"/v1/jobs/{ids['q-sim']}/timeline", headers=bearer(u_key))
    ).status_code == 404
    cancelled = await api.delete(f"/v1/jobs/{ids['u-queued']}", headers=bearer(operator))
    assert cancelled.json()["state"] == "cancelled"
    # Paging through every tenant's jobs, two at a time, sees each once.
    seen: list[str] = []
    after: str | None = None
    while True:
        page = (
            await api.get(
                "/v1/jobs",
                params={"limit": 2, **({"after": after} if after else {})},
                headers=bearer(operator),
            )
        ).json()
        seen += [j["id"] for j in page["data"]]
        if (after := page["next_after"]) is None:
            break
    assert sorted(seen) == sorted(ids.values())


async def test_batches_filter_by_status_model_and_tenant(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    running = await batch_of(db, "t", 2, NOW + timedelta(hours=1))
    done = await batch_of(db, "t", 1, NOW + timedelta(hours=1))
    other = await batch_of(db, "u", 1, NOW + timedelta(hours=1))
    async with db.begin() as conn:
        await conn.execute(
            update(jobs).where(jobs.c.batch_id == done).values(state="succeeded", finished_at=NOW)
        )
    store = KeyStore(db)
    plain, operator = await store.create("t"), await store.create("ops", operator=True)

    async def listed(key: str, **params: str) -> list[str]:
        answer = await api.get("/v1/batches", params=params, headers=bearer(key))
        assert answer.status_code == 200, answer.text
        return [b["id"] for b in answer.json()["data"]]

    assert await listed(plain) == [done, running]
    # A batch's status is stored: the API's batch lifecycle finalizes the one whose jobs all
    # ended at its next round.
    async with asyncio.timeout(20):
        while await listed(plain, status="completed") != [done]:
            await asyncio.sleep(0.1)
    assert await listed(plain, status="in_progress") == [running]
    assert await listed(plain, status="completed") == [done]
    assert await listed(plain, model="default") == [done, running]
    assert await listed(plain, model="sim") == []
    assert await listed(operator, tenant="u") == [other]
    assert set(await listed(operator)) == {running, done, other}
    forbidden = await api.get("/v1/batches", params={"tenant": "u"}, headers=bearer(plain))
    assert (forbidden.status_code, forbidden.json()["error"]["code"]) == (403, "operator_only")
    bad = await api.get("/v1/batches", params={"status": "nope"}, headers=bearer(plain))
    assert bad.status_code == 422


async def test_a_jobs_timeline_has_its_times_tokens_and_deliveries(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    ended = NOW - timedelta(seconds=5)
    row = job(
        "done",
        "succeeded",
        ended,
        dispatched_at=NOW - timedelta(seconds=9),
        started_at=NOW - timedelta(seconds=8),
        attempt=2,
        decoded_tokens=4,
        result={
            "text": "ok",
            "engine": "sim",
            "served_model": "sim-served",
            "prompt_tokens": 7,
            "output_tokens": 4,
        },
        params={"model": "sim"},
    )
    async with db.begin() as conn:
        await conn.execute(insert(jobs).values(row))
        await conn.execute(
            insert(webhook_deliveries).values(
                id="msg_1",
                tenant="t",
                subject=row["id"],
                event_type="job.succeeded",
                url="http://example.com/hook",
                body='{"type": "job.succeeded"}',
                state="delivered",
                attempts=2,
                finished_at=NOW,
            )
        )
        await conn.execute(
            insert(webhook_attempts),
            [
                {"delivery_id": "msg_1", "attempt": 1, "status_code": 503, "duration_ms": 3.0},
                {"delivery_id": "msg_1", "attempt": 2, "status_code": 200, "duration_ms": 2.0},
            ],
        )
    key = await KeyStore(db).create("t")
    answer = await api.get(f"/v1/jobs/{row['id']}/timeline", headers=bearer(key))
    assert answer.status_code == 200, answer.text
    timeline = answer.json()
    assert timeline["state"] == "succeeded"
    assert timeline["model"] == "sim"
    assert timeline["engine"] == "sim"
    assert timeline["served_model"] == "sim-served"
    assert (timeline["prompt_tokens"], timeline["completion_tokens"]) == (7, 4)
    assert timeline["attempts"] == 2
    assert timeline["end_reason"] is None
    for name in ("accepted_at", "dispatched_at", "started_at", "ended_at"):
        assert timeline[name] is not None, name
    assert datetime.fromisoformat(timeline["ended_at"]) == ended
    [delivery] = timeline["deliveries"]
    assert [a["status_code"] for a in delivery["attempt_log"]] == [503, 200]

    expired = job("late", "expired", NOW, error=reasons.error(JobState.EXPIRED, "deadline_passed"))
    async with db.begin() as conn:
        await conn.execute(insert(jobs).values(expired))
    late = (await api.get(f"/v1/jobs/{expired['id']}/timeline", headers=bearer(key))).json()
    assert (late["end_reason"], late["started_at"], late["deliveries"]) == (
        "deadline_passed",
        None,
        [],
    )
    missing = await api.get("/v1/jobs/nope/timeline", headers=bearer(key))
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "job_not_found")


async def test_the_overview_counts_jobs_drops_and_workers(
    api: httpx.AsyncClient, db: AsyncEngine, settings: Settings
) -> None:
    await _jobs(db)
    async with db.begin() as conn:
        await conn.execute(
            insert(workers).values(
                id="worker-1", model="sim", engine="sim", capacity=64, running=1, kv_usage=0.25
            )
        )
    store = KeyStore(db)
    plain, operator = await store.create("t"), await store.create("ops", operator=True)
    answer = await api.get("/v1/overview", headers=bearer(plain))
    assert answer.status_code == 200, answer.text
    seen = answer.json()
    assert seen["operator"] is False
    assert seen["admission"]["state"] in ("open", "throttling", "refusing", "unknown")
    assert seen["admission"]["lag_soft"] == settings.lag_soft
    counts = {(j["model"], j["state"]): j["count"] for j in seen["jobs"]}
    # The job that ended two days ago is outside the window; u's job is another tenant's.
    assert counts == {
        ("sim", "queued"): 1,
        ("default", "queued"): 1,
        ("sim", "running"): 1,
        ("default", "expired"): 1,
        ("default", "cancelled"): 1,
    }
    drops = {(d["state"], d["reason"]): d["count"] for d in seen["drops"]}
    assert drops == {("expired", "deadline_unreachable"): 1, ("cancelled", "cancelled"): 1}
    [worker] = seen["workers"]
    assert (worker["id"], worker["capacity"], worker["running"], worker["stale"]) == (
        "worker-1",
        64,
        1,
        False,
    )
    everyone = (await api.get("/v1/overview", headers=bearer(operator))).json()
    assert everyone["operator"] is True
    assert {(j["model"], j["state"]): j["count"] for j in everyone["jobs"]}[("sim", "queued")] == 2
    narrow = (await api.get("/v1/overview?window_s=10", headers=bearer(plain))).json()
    assert narrow["drops"] == []
    bad = await api.get("/v1/overview?window_s=0", headers=bearer(plain))
    assert bad.status_code == 422


def _delivery(name: str, tenant: str, state: str, next_attempt_at: datetime) -> dict[str, object]:
    ended = state != "pending"
    return {
        "id": f"msg_{name}",
        "tenant": tenant,
        "subject": f"00000000-0000-0000-0000-{name:0>12}",
        "event_type": "job.succeeded",
        "url": "https://receiver.example/hook",
        "body": "{}",
        "state": state,
        "next_attempt_at": next_attempt_at,
        "finished_at": next_attempt_at if ended else None,
    }


async def test_the_overview_counts_the_deliveries_waiting(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    now = datetime.now(UTC)
    rows = [
        _delivery("1", "t", "pending", now - timedelta(seconds=90)),  # due, behind
        _delivery("2", "t", "pending", now - timedelta(seconds=5)),  # due
        _delivery("3", "t", "pending", now + timedelta(hours=1)),  # leased, or a later retry
        _delivery("4", "t", "delivered", now - timedelta(seconds=600)),
        _delivery("5", "u", "pending", now - timedelta(seconds=200)),
        _delivery("6", "u", "dead", now - timedelta(seconds=900)),
    ]
    async with db.begin() as conn:
        await conn.execute(insert(webhook_deliveries), rows)
    store = KeyStore(db)
    plain, operator = await store.create("t"), await store.create("ops", operator=True)

    async def deliveries(key: str) -> dict[str, Any]:
        answer = await api.get("/v1/overview", headers=bearer(key))
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()["deliveries"]
        return found

    mine = await deliveries(plain)
    assert (mine["pending"], mine["due"], mine["behind"]) == (3, 2, True)
    assert 90 <= mine["oldest_due_s"] < 150  # by the database's clock
    every = await deliveries(operator)
    assert (every["pending"], every["due"], every["behind"]) == (4, 3, True)
    assert 200 <= every["oldest_due_s"] < 260
    # A tenant with nothing pending: zeros, and no oldest.
    none = await deliveries(await store.create("v"))
    assert none == {"pending": 0, "due": 0, "oldest_due_s": None, "behind": False}
    # Only the rows not yet due: pending, none due.
    async with db.begin() as conn:
        await conn.execute(
            update(webhook_deliveries)
            .where(webhook_deliveries.c.tenant == "t", webhook_deliveries.c.state == "pending")
            .values(next_attempt_at=now + timedelta(minutes=5))
        )
    later = await deliveries(plain)
    assert later == {"pending": 3, "due": 0, "oldest_due_s": None, "behind": False}


async def test_a_worker_reports_itself_and_leaves_at_a_clean_stop(
    db: AsyncEngine, settings: Settings
) -> None:
    engine = SimEngine(num_blocks=512, max_num_seqs=32)
    await engine.start()
    try:
        presence = Presence(
            PresenceRepository(db),
            worker="worker-7",
            model="sim",
            engine=engine,
            gate=PullGate(engine, max_running=16),
            interval_s=0.05,
        )
        stop = asyncio.Event()
        task = asyncio.create_task(presence.run(stop))
        seen: list[datetime] = []
        for _ in range(100):
            async with db.connect() as conn:
                row = (await conn.execute(select(workers))).mappings().first()
            if row is not None:
                seen.append(row["seen_at"])
                if len(set(seen)) > 1:
                    break
            await asyncio.sleep(0.02)
        assert row is not None
        assert len(set(seen)) > 1  # written again each interval
        assert (row["id"], row["engine"], row["capacity"], row["running"]) == (
            "worker-7",
            "sim",
            16,
            0,
        )
        assert row["kv_usage"] == 0.0
        stop.set()
        await task
        async with db.connect() as conn:
            assert (await conn.execute(select(workers))).first() is None
    finally:
        await engine.close()

    # A worker gone without a clean stop is pruned an hour after it was last seen.
    async with db.begin() as conn:
        for name, seen_at in (("gone", NOW - timedelta(hours=2)), ("here", NOW)):
            await conn.execute(
                insert(workers).values(
                    id=name, model="sim", engine="sim", capacity=1, running=0, seen_at=seen_at
                )
            )
    done = await Pruner(settings.retention, RetentionStore(db)).prune(datetime.now(UTC))
    assert done["workers"] == 1
    async with db.connect() as conn:
        assert (await conn.execute(select(workers.c.id))).scalars().all() == ["here"]
