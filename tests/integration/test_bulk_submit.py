"""POST /v1/jobs/bulk against a real, migrated PostgreSQL and broker: each job is answered as
POST /v1/jobs would have answered it, and the Python client's concurrent submits go as bulk
requests, every accepted job stored."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from client.api import AsyncClient
from plumbing.settings import Settings
from producers.api.app import create_app
from schemas.jobs import JobKind
from schemas.tables import jobs

DOC = "Sluicegate keeps accepted jobs durable. Every refusal is explicit."


@asynccontextmanager
async def served(settings: Settings, **update: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update=update))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sg") as client:
            yield client


async def stored(db: AsyncEngine) -> set[str]:
    async with db.connect() as conn:
        return {str(i) for i in (await conn.execute(select(jobs.c.id))).scalars()}


def job(**fields: Any) -> dict[str, Any]:
    return {"kind": "summarize", "input": DOC, **fields}


async def test_each_job_is_answered_as_a_single_submit_would_be(
    settings: Settings, db: AsyncEngine
) -> None:
    async with served(settings) as api:
        first = await api.post("/v1/jobs", json=job(idempotency_key="k1"))
        assert first.status_code == 202
        refused_alone = [
            job(input=""),  # empty_input
            job(idempotency_key="k1", input="another document"),  # the key's other request
            job(kind="nope"),  # unknown_kind
            job(ttl_s=10**9),  # deadline_too_far
            job(ttl_s=1, deadline="2020-01-01T00:00:00Z"),  # both
            "not an object",
        ]
        bulk = await api.post(
            "/v1/jobs/bulk", json={"jobs": [job(), job(idempotency_key="k1"), *refused_alone]}
        )
        assert bulk.status_code == 200, bulk.text
        new, replay, *refused = bulk.json()["data"]
        singles = [await api.post("/v1/jobs", json=body) for body in refused_alone]

    assert new["status"] == 202
    assert new["headers"]["location"] == new["body"]["status_url"]
    assert new["body"]["state"] == "queued"
    assert replay["status"] == 200
    assert replay["body"]["id"] == first.json()["id"]
    assert replay["headers"]["idempotent-replayed"] == "true"
    codes = [r["body"]["error"]["code"] for r in refused]
    assert codes[:4] == [
        "empty_input",
        "idempotency_key_reused",
        "unknown_kind",
        "deadline_too_far",
    ]
    assert [r["status"] for r in refused] == [s.status_code for s in singles]
    for answer, single in zip(refused[:5], singles[:5], strict=True):
        assert answer["body"] == single.json()  # the same body, word for word
    assert codes[5] == singles[5].json()["error"]["code"] == "invalid_body"  # not an object
    assert await stored(db) == {first.json()["id"], new["body"]["id"]}


async def test_each_job_has_its_own_admission_decision(settings: Settings, db: AsyncEngine) -> None:
    async with served(settings, tenant_rpm=3) as api:
        bulk = await api.post("/v1/jobs/bulk", json={"jobs": [job() for _ in range(5)]})
    answers = bulk.json()["data"]
    assert sorted(a["status"] for a in answers) == [202, 202, 202, 429, 429]
    refusals = [a for a in answers if a["status"] == 429]
    assert all(a["body"]["status"] == "yield" for a in refusals)
    assert all(int(a["headers"]["retry-after"]) >= 1 for a in refusals)
    assert await stored(db) == {a["body"]["id"] for a in answers if a["status"] == 202}


async def test_a_request_not_valid_as_a_whole_stores_nothing(
    settings: Settings, db: AsyncEngine
) -> None:
    async with served(settings, max_bulk_jobs=2) as api:
        too_many = await api.post("/v1/jobs/bulk", json={"jobs": [job(), job(), job()]})
        empty = await api.post("/v1/jobs/bulk", json={"jobs": []})
        not_a_list = await api.post("/v1/jobs/bulk", json={"jobs": job()})
    assert too_many.status_code == 422
    assert too_many.json()["error"]["code"] == "invalid_request"
    assert (empty.status_code, not_a_list.status_code) == (422, 422)
    assert await stored(db) == set()


async def test_the_clients_concurrent_submits_go_as_bulk_requests_all_stored(
    settings: Settings, db: AsyncEngine
) -> None:
    app = create_app(settings)
    paths: list[str] = []

    class Counting(httpx.ASGITransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            paths.append(request.url.path)
            return await super().handle_async_request(request)

    async with (
        app.router.lifespan_context(app),
        AsyncClient("http://sg", transport=Counting(app=app)) as client,
    ):
        answers = await asyncio.gather(
            *(client.submit(JobKind.SUMMARIZE, f"{DOC} {i}", ttl_s=60) for i in range(40))
        )
        replay = await asyncio.gather(
            client.submit(JobKind.SUMMARIZE, f"{DOC} 0", ttl_s=60, idempotency_key="same"),
            client.submit(JobKind.SUMMARIZE, f"{DOC} 0", ttl_s=60, idempotency_key="same"),
        )
    ids = {a.id for a in answers}
    assert len(ids) == 40
    assert len(paths) < 40
    assert "/v1/jobs/bulk" in paths
    assert replay[0].id == replay[1].id  # one job for the key, whichever came first
    assert await stored(db) == ids | {replay[0].id}
    async with db.connect() as conn:
        count = await conn.scalar(select(func.count()).select_from(jobs))
    assert count == 41
