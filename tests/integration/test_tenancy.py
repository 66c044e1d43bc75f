"""Tenancy with API keys: each key maps to a tenant, keys are stored hashed, every read and
write is scoped, and another tenant's job answers 404."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from producers.tenancy.keys import hash_key, key_id
from producers.tenancy.repository import KeyStore
from schemas.tables import api_keys
from tests.integration.serving import serve

JOB = {"kind": "summarize", "input": "Keys scope every read and write.", "ttl_s": 600}


@pytest.fixture
async def api(settings: Settings, db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    keyed = settings.model_copy(update={"auth": "api_key", "api_key_cache_s": 0})
    async with serve(keyed, db) as client:
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_no_key_or_a_wrong_key_is_401(api: httpx.AsyncClient, db: AsyncEngine) -> None:
    key = await KeyStore(db).create("acme")
    for headers in ({}, bearer(key[:-1] + "x"), {"Authorization": key}, bearer("sk_nope")):
        response = await api.post("/v1/jobs", json=JOB, headers=headers)
        assert response.status_code == 401, headers
        assert response.json()["error"]["code"] == "unauthorized"
    # The tenant header is not trusted in this mode: it does not get anyone in.
    response = await api.get("/v1/jobs", headers={"X-Sluicegate-Tenant": "acme"})
    assert response.status_code == 401


async def test_keys_are_stored_hashed(db: AsyncEngine) -> None:
    key = await KeyStore(db).create("acme", name="ci")
    async with db.connect() as conn:
        rows = (await conn.execute(select(api_keys))).mappings().all()
    assert len(rows) == 1
    row = rows[0]
    assert row["key_hash"] == hash_key(key)
    assert key not in {str(v) for v in row.values()}
    assert row["id"] == key_id(key)
    assert row["tenant"] == "acme"


async def test_another_tenants_job_is_404_everywhere(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    store = KeyStore(db)
    a, b = await store.create("a"), await store.create("b")
    submitted = await api.post("/v1/jobs", json=JOB, headers=bearer(a))
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    assert (await api.get(f"/v1/jobs/{job_id}", headers=bearer(a))).json()["tenant"] == "a"

    for method, path in (
        ("GET", f"/v1/jobs/{job_id}"),
        ("DELETE", f"/v1/jobs/{job_id}"),
        ("POST", f"/v1/jobs/{job_id}/heartbeat"),
    ):
        response = await api.request(method, path, headers=bearer(b))
        assert response.status_code == 404, (method, path)
        assert response.json()["error"]["code"] == "job_not_found"
    listed = await api.get("/v1/jobs", headers=bearer(b))
    assert listed.json()["data"] == []
    # b's failed cancel left a's job alone.
    assert (await api.get(f"/v1/jobs/{job_id}", headers=bearer(a))).json()["state"] == "queued"


async def test_a_revoked_key_stops_working(api: httpx.AsyncClient, db: AsyncEngine) -> None:
    store = KeyStore(db)
    key = await store.create("acme")
    assert (await api.get("/v1/jobs", headers=bearer(key))).status_code == 200
    assert await store.revoke(key_id(key) or "")
    assert (await api.get("/v1/jobs", headers=bearer(key))).status_code == 401
