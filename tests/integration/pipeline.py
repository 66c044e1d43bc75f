"""An in-process pipeline: the API over ASGI, relay and workers as tasks, one stop event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from plumbing.db import make_engine
from plumbing.settings import Settings
from producers.api.app import create_app
from producers.outbox.config import OutboxConfig
from producers.outbox.relay import OutboxRelay
from producers.outbox.repository import OutboxStore

TERMINAL = {"succeeded", "failed", "expired", "cancelled", "abandoned"}
DOC = (
    "The relay publishes what the API stored. Workers claim each job before they run it. "
    "A terminal write is conditional on the attempt, so a redelivery cannot write twice."
)


Role = Callable[[Settings, asyncio.Event], Awaitable[None]]


class Pipeline:
    def __init__(self, settings: Settings, client: httpx.AsyncClient) -> None:
        self.settings = settings
        self.client = client
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Future[None]] = []
        self.workers: list[tuple[asyncio.Future[None], asyncio.Event, Role]] = []

    def start(self, role: Role) -> None:
        self.tasks.append(asyncio.ensure_future(role(self.settings, self.stop)))

    def start_restartable(self, role: Role) -> None:
        """A role with a stop event of its own, so that it can be restarted alone."""
        own = asyncio.Event()
        task = asyncio.ensure_future(role(self.settings, own))
        self.workers.append((task, own, role))

    async def stop_restartable(self) -> list[Role]:
        old, self.workers = self.workers, []
        for task, own, _ in old:
            own.set()
            await task
        return [role for _, _, role in old]

    async def submit(self, count: int) -> list[str]:
        ids = []
        for _ in range(count):
            r = await self.client.post("/v1/jobs", json={"kind": "summarize", "input": DOC})
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
        return ids

    async def submit_admitted(self, count: int, within_s: float = 30) -> list[str]:
        """As a client would submit through a broker outage: a refusal while the lag cannot
        be read (503, ``broker_unavailable``) is retried after its Retry-After."""
        ids = []
        async with asyncio.timeout(within_s):
            while len(ids) < count:
                r = await self.client.post("/v1/jobs", json={"kind": "summarize", "input": DOC})
                if r.status_code == 503 and r.json()["reason"] == "broker_unavailable":
                    await asyncio.sleep(r.json()["retry_after_ms"] / 1000)
                    continue
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])
        return ids

    async def wait_terminal(self, ids: list[str], timeout_s: float = 60) -> dict[str, dict]:
        views: dict[str, dict] = {}
        async with asyncio.timeout(timeout_s):
            while len(views) < len(ids):
                for job_id in ids:
                    if job_id not in views:
                        view = (await self.client.get(f"/v1/jobs/{job_id}")).json()
                        if view["state"] in TERMINAL:
                            views[job_id] = view
                await asyncio.sleep(0.1)
        return views

    async def close(self) -> None:
        self.stop.set()
        for _, own, _ in self.workers:
            own.set()
        await asyncio.gather(*self.tasks, *(task for task, _, _ in self.workers))


async def open_pipeline(settings: Settings) -> AsyncIterator[Pipeline]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sg") as client:
            pipeline = Pipeline(settings, client)
            try:
                yield pipeline
            finally:
                await pipeline.close()


async def relay_only(settings: Settings, stop: asyncio.Event) -> None:
    """The relay without the reconciler, which would clear a position it takes for gone."""
    db = make_engine(settings.require_database_url(), pool_size=2)
    try:
        store = OutboxStore(db, dispatch_topic=settings.dispatch_topic)
        await OutboxRelay(OutboxConfig.of(settings), store).run(stop)
    finally:
        await db.dispose()
