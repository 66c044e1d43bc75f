"""The API killed (SIGKILL) under a load of single submits, coalesced by the Python client
and one request each from plain HTTP: every job answered 2xx is stored with its dispatch
record, which is published once a relay runs; and a caller that resubmits what it sent
when the API died, under the same idempotency keys, gets each of those jobs once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from client.api import ApiError, AsyncClient, Unreachable
from plumbing.settings import Settings
from schemas.jobs import JobKind
from schemas.tables import jobs, outbox
from sluicegate.local.embedded import free_port
from tests.faults.processes import Roles, answering, roles

pytestmark = pytest.mark.timeout(240)

DOC = "An accepted job is durable: the API's answer comes after its commit. " * 20
LOADED_S = 2.0  # of load before the kill


class Load:
    """Callers in a closed loop, each job under its own idempotency key: what was answered
    2xx (key -> job id) and what had no answer (the keys in flight when the API died)."""

    def __init__(self) -> None:
        self.accepted: dict[str, str] = {}
        self.unknown: set[str] = set()
        self.stop = asyncio.Event()

    async def through_client(self, client: AsyncClient, caller: int) -> None:
        n = 0
        while not self.stop.is_set():
            key = f"client-{caller}-{n}"
            n += 1
            try:
                answer = await client.submit(JobKind.SUMMARIZE, DOC, idempotency_key=key)
            except Unreachable:
                self.unknown.add(key)
                return
            self.accepted[key] = answer.id

    async def one_a_request(self, http: httpx.AsyncClient, caller: int) -> None:
        n = 0
        while not self.stop.is_set():
            key = f"http-{caller}-{n}"
            n += 1
            body = {"kind": "summarize", "input": DOC, "idempotency_key": key}
            try:
                response = await http.post("/v1/jobs", json=body)
            except httpx.TransportError:
                self.unknown.add(key)
                return
            assert response.status_code == 202, response.text
            self.accepted[key] = response.json()["id"]


async def stored(db: AsyncEngine) -> dict[str, str]:
    """Idempotency key -> job id, of every job stored."""
    async with db.connect() as conn:
        rows = await conn.execute(select(jobs.c.idempotency_key, jobs.c.id))
        return {key: str(job_id) for key, job_id in rows}


async def unpublished(db: AsyncEngine) -> int:
    async with db.connect() as conn:
        query = select(func.count()).select_from(outbox).where(outbox.c.published_at.is_(None))
        return int(await conn.scalar(query) or 0)


async def test_every_accepted_job_survives_the_api_killed_mid_load(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> None:
    # No worker runs: the lag only grows, and admission must not refuse for it.
    update = {"publish_at_once_grace_s": 1.0, "lag_soft": 10**9, "lag_hard": 10**9}
    own = settings.model_copy(update=update)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    load = Load()
    with roles(own, tmp_path) as started:
        api = started.start("api", api_port=port)
        await answering(f"{url}/healthz", within_s=60)
        async with (
            AsyncClient(url, tenant="t") as client,
            httpx.AsyncClient(base_url=url, headers={"X-Sluicegate-Tenant": "t"}) as http,
        ):
            callers = [
                *(asyncio.create_task(load.through_client(client, i)) for i in range(32)),
                *(asyncio.create_task(load.one_a_request(http, i)) for i in range(8)),
            ]
            await asyncio.sleep(LOADED_S)
            api.kill()
            await asyncio.wait_for(asyncio.gather(*callers), 30)
        assert len(load.accepted) > 50, "the load must have been accepted for a while"
        assert load.unknown, "the kill must have cut requests off"

        found = await stored(db)
        lost = {k: i for k, i in load.accepted.items() if found.get(k) != i}
        assert not lost, f"{len(lost)} jobs answered 2xx are not stored: {list(lost)[:5]}"
        async with db.connect() as conn:
            keys = (
                select(func.count())
                .select_from(outbox)
                .where(outbox.c.key.in_([str(i) for i in found.values()]))
            )
            assert await conn.scalar(keys) == len(found)  # each with its dispatch record

        await resubmit_and_publish(started, own, port, url, db, load)


async def resubmit_and_publish(
    started: Roles, own: Settings, port: int, url: str, db: AsyncEngine, load: Load
) -> None:
    """The API again; the keys that had no answer sent again; a relay for what the killed
    API left unpublished."""
    started.start("api", api_port=port)
    started.start("relay")
    await answering(f"{url}/healthz", within_s=60)
    async with AsyncClient(url, tenant="t") as client:
        for key in sorted(load.unknown):
            try:
                answer = await client.submit(JobKind.SUMMARIZE, DOC, idempotency_key=key)
            except ApiError as exc:
                raise AssertionError(f"{key}: {exc}") from None
            load.accepted[key] = answer.id
    found = await stored(db)
    assert {k: found.get(k) for k in load.accepted} == load.accepted
    assert len(found) == len(load.accepted)  # no key twice, nothing unanswered left over
    async with asyncio.timeout(60):
        while await unpublished(db):
            await asyncio.sleep(0.2)
