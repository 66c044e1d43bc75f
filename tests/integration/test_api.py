"""The HTTP API against a real, migrated PostgreSQL database."""

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.db import make_engine
from plumbing.settings import Settings
from producers.api.app import create_app
from schemas.tables import jobs, outbox

DOC = "Sluicegate keeps accepted jobs durable. Every refusal is explicit."


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(settings.require_database_url(), pool_size=2)
    yield engine
    await engine.dispose()


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"max_input_bytes": 1000, "max_body_bytes": 4096}))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sg") as client:
            yield client


async def count(db: AsyncEngine, table=jobs) -> int:
    async with db.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def test_submit_stores_job_and_outbox_row_then_status(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    response = await api.post("/v1/jobs", json={"kind": "summarize", "input": DOC, "ttl_s": 60})
    assert response.status_code == 202, response.text
    body = response.json()
    assert response.headers["location"] == body["status_url"] == f"/v1/jobs/{body['id']}"
    assert body["state"] == "queued"
    assert await count(db) == 1
    assert await count(db, outbox) == 1

    view = (await api.get(body["status_url"])).json()
    assert view["id"] == body["id"]
    assert view["kind"] == "summarize"
    assert view["state"] == "queued"
    deadline = datetime.fromisoformat(view["deadline"])
    assert timedelta(seconds=50) < deadline - datetime.now(UTC) <= timedelta(seconds=60)


async def test_job_ids_are_time_ordered_uuid7(api: httpx.AsyncClient) -> None:
    ids = []
    for _ in range(5):
        r = await api.post("/v1/jobs", json={"kind": "complete", "input": "Hello"})
        ids.append(r.json()["id"])
    assert ids == sorted(ids)
    assert all(i[14] == "7" for i in ids)


async def test_idempotency_key_returns_the_same_job(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    payload = {"kind": "summarize", "input": DOC}
    first = await api.post("/v1/jobs", json=payload, headers={"Idempotency-Key": "k1"})
    again = await api.post("/v1/jobs", json=payload, headers={"Idempotency-Key": "k1"})
    assert first.status_code == 202
    assert again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    other_tenant = await api.post(
        "/v1/jobs", json=payload, headers={"Idempotency-Key": "k1", "X-Sluicegate-Tenant": "b"}
    )
    assert other_tenant.json()["id"] != first.json()["id"]
    changed = await api.post(
        "/v1/jobs", json={**payload, "max_tokens": 9}, headers={"Idempotency-Key": "k1"}
    )
    assert changed.status_code == 409
    assert changed.json()["error"]["code"] == "idempotency_key_reused"
    assert await count(db) == 2
    assert await count(db, outbox) == 2


async def test_cancel_then_cancel_again_conflicts(api: httpx.AsyncClient, db: AsyncEngine) -> None:
    job_id = (await api.post("/v1/jobs", json={"kind": "complete", "input": "Hi"})).json()["id"]
    cancelled = await api.delete(f"/v1/jobs/{job_id}")
    assert cancelled.status_code == 200
    assert cancelled.json()["state"] == "cancelled"
    again = await api.delete(f"/v1/jobs/{job_id}")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "job_terminal"
    assert await count(db, outbox) == 2  # dispatch + the cancelled event


async def test_other_tenant_cannot_see_or_cancel(api: httpx.AsyncClient) -> None:
    job_id = (await api.post("/v1/jobs", json={"kind": "complete", "input": "Hi"})).json()["id"]
    other = {"X-Sluicegate-Tenant": "someone-else"}
    assert (await api.get(f"/v1/jobs/{job_id}", headers=other)).status_code == 404
    assert (await api.delete(f"/v1/jobs/{job_id}", headers=other)).status_code == 404


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/v1/jobs/0190a4c0-0000-7000-8000-000000000000", "job_not_found"),
        ("/v1/jobs/not-a-uuid", "job_not_found"),
    ],
)
async def test_unknown_job(api: httpx.AsyncClient, path: str, code: str) -> None:
    for response in (await api.get(path), await api.delete(path)):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == code


PAST = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
FAR = (datetime.now(UTC) + timedelta(days=400)).isoformat()


@pytest.mark.parametrize(
    ("content", "status", "code"),
    [
        (b'{"kind": "summarize", "input": ', 400, "invalid_json"),
        (b"not json at all", 400, "invalid_json"),
        (b"[1, 2]", 422, "invalid_body"),
        (b'{"kind": "summarize", "input": 42}', 422, "invalid_request"),
        (b'{"kind": "summarize", "input": "x", "max_tokens": "10"}', 422, "invalid_request"),
        (b'{"kind": "translate", "input": "x"}', 422, "unknown_kind"),
        (b'{"input": "x"}', 422, "missing_kind"),
        (b'{"kind": "summarize", "input": ""}', 422, "empty_input"),
        (b'{"kind": "summarize", "input": "  \\n "}', 422, "invalid_request"),
        (b'{"kind": "summarize", "input": "x", "ttl_s": -5}', 422, "invalid_request"),
        (b'{"kind": "summarize", "input": "x", "ttl_s": 0}', 422, "invalid_request"),
        # Named: their bodies carry the time of collection, which must not be in the test id
        # (each pytest-xdist worker collects on its own and the ids must agree).
        pytest.param(
            f'{{"kind": "summarize", "input": "x", "deadline": "{PAST}"}}'.encode(),
            422,
            "deadline_in_past",
            id="deadline-in-past",
        ),
        pytest.param(
            f'{{"kind": "summarize", "input": "x", "deadline": "{FAR}"}}'.encode(),
            422,
            "deadline_too_far",
            id="deadline-too-far",
        ),
        (b'{"kind": "summarize", "input": "x", "max_tokens": 100000}', 422, "max_tokens_too_large"),
        (b'{"kind": "summarize", "input": "x", "extra": 1}', 422, "invalid_request"),
        (('{"kind": "summarize", "input": "' + "a" * 1001 + '"}').encode(), 413, "input_too_large"),
        (
            ('{"kind": "summarize", "input": "' + "a" * 5000 + '"}').encode(),
            413,
            "payload_too_large",
        ),
    ],
)
async def test_bad_input_is_refused_and_nothing_stored(
    api: httpx.AsyncClient, db: AsyncEngine, content: bytes, status: int, code: str
) -> None:
    response = await api.post(
        "/v1/jobs", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert await count(db) == 0
    assert await count(db, outbox) == 0


async def test_bad_tenant_header(api: httpx.AsyncClient) -> None:
    r = await api.post(
        "/v1/jobs", json={"kind": "complete", "input": "x"}, headers={"X-Sluicegate-Tenant": "a b"}
    )
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "invalid_request"


async def test_database_down_answers_503_with_retry_after(settings: Settings) -> None:
    down = settings.model_copy(update={"database_url": "postgresql://postgres@127.0.0.1:1/none"})
    app = create_app(down)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sg") as client:
            r = await client.post("/v1/jobs", json={"kind": "complete", "input": "x"})
            health = await client.get("/healthz")
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "database_unavailable"
    assert int(r.headers["retry-after"]) > 0
    assert health.status_code == 503


async def test_metrics_endpoint(api: httpx.AsyncClient) -> None:
    await api.post("/v1/jobs", json={"kind": "complete", "input": "x"})
    text = (await api.get("/metrics")).text
    for name in (
        "sluicegate_jobs_submitted_total",
        "sluicegate_lag_records",
        "sluicegate_drain_rate",
        "sluicegate_arrival_rate",
        "sluicegate_admission_decisions_total",
        "sluicegate_admission_blocked",
    ):
        assert name in text
