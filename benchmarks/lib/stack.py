"""A whole pipeline in one process for benchmarks: embedded PostgreSQL and broker (or the
URLs in SLUICEGATE_BENCH_DATABASE_URL / SLUICEGATE_BENCH_KAFKA), the API over ASGI, the relay
and workers as tasks. The broker is Apache Kafka from `sluicegate kafka pull`, or Tansu with
SLUICEGATE_BENCH_BROKER=tansu (also for a SLUICEGATE_BENCH_KAFKA that is a Tansu)."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from fastapi import FastAPI
from sqlalchemy import ColumnElement, select
from sqlalchemy.sql.elements import KeyedColumnElement

from plumbing.db import make_engine
from plumbing.kafka import ensure_topics
from plumbing.pools import Pools
from plumbing.settings import Settings
from producers.api.app import create_app
from producers.service import run_relay
from schemas.states import TERMINAL_STATES
from sluicegate import migrate
from sluicegate.local.broker import dist
from sluicegate.local.broker.apache import ApacheKafka
from sluicegate.local.broker.tansu import WORKAROUNDS, TansuBroker
from sluicegate.local.embedded import EmbeddedPostgres
from workers.gate import PullGate
from workers.service import run_worker

TERMINAL = {s.value for s in TERMINAL_STATES}


@dataclass
class Bench:
    settings: Settings
    app: FastAPI
    client: httpx.AsyncClient
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start_relay(self) -> None:
        self.tasks.append(asyncio.create_task(run_relay(self.settings, self.stop)))

    def start_worker(self, gate_type: type[PullGate] = PullGate) -> None:
        worker = run_worker(self.settings, self.stop, gate_type=gate_type)
        self.tasks.append(asyncio.create_task(worker))


def broker_kind() -> str:
    """The benchmark's broker: SLUICEGATE_BENCH_BROKER (kafka, the default, or tansu)."""
    kind = os.environ.get("SLUICEGATE_BENCH_BROKER", "kafka")
    if kind not in ("kafka", "tansu"):
        raise SystemExit(f"SLUICEGATE_BENCH_BROKER must be kafka or tansu, not {kind!r}")
    return kind


def make_broker(directory: Path) -> ApacheKafka | TansuBroker:
    """The embedded broker of ``broker_kind()``, its files in ``directory`` (not started)."""
    if broker_kind() == "tansu":
        return TansuBroker(log_path=directory / "broker.log")
    try:
        java = dist.find_java(java_home=os.environ.get("JAVA_HOME"))
        home = dist.kafka_home(Settings().data_dir)
        if not dist.is_pulled(home):
            raise dist.NotPulled(f"no Apache Kafka in {home}: run `sluicegate kafka pull`")
    except dist.KafkaUnavailable as exc:
        raise SystemExit(f"{exc.code}: {exc} (or SLUICEGATE_BENCH_BROKER=tansu)") from None
    return ApacheKafka(
        root=directory / "kafka", home=home, java=java, log_path=directory / "broker.log"
    )


def broker_settings() -> dict[str, Any]:
    """The settings the benchmark's broker needs: Tansu's workarounds, none for Kafka."""
    if broker_kind() == "kafka":
        return {}
    return {
        name.lower(): {"true": True, "false": False}.get(value, value)
        for name, value in WORKAROUNDS.items()
    }


@asynccontextmanager
async def services(
    configure: Callable[[EmbeddedPostgres], Awaitable[None]] | None = None,
) -> AsyncIterator[tuple[str, str]]:
    """(admin database URL, bootstrap) of real services for the whole benchmark run;
    ``configure`` is given the embedded PostgreSQL once it runs (not a server of
    SLUICEGATE_BENCH_DATABASE_URL)."""
    with tempfile.TemporaryDirectory(prefix="sluicegate-bench-") as tmp:
        pg = broker = None
        try:
            admin = os.environ.get("SLUICEGATE_BENCH_DATABASE_URL")
            if admin is None:
                pg = EmbeddedPostgres(Path(tmp) / "pg")
                await asyncio.to_thread(pg.start)
                admin = pg.admin_url
                if configure is not None:
                    await configure(pg)
            bootstrap = os.environ.get("SLUICEGATE_BENCH_KAFKA")
            if bootstrap is None:
                broker = make_broker(Path(tmp))
                await broker.start()
                bootstrap = broker.bootstrap
            yield admin, bootstrap
        finally:
            if broker is not None:
                broker.stop()
            if pg is not None:
                await asyncio.to_thread(pg.stop)


async def alter_system(pg: EmbeddedPostgres, setting: str, value: str) -> None:
    """``ALTER SYSTEM SET setting = value`` on the embedded server (its data directory's
    postgresql.auto.conf), then a restart, for the settings read only at start."""
    conn = await asyncpg.connect(pg.admin_url)
    try:
        await conn.execute(f"ALTER SYSTEM SET {setting} = {value}")
    finally:
        await conn.close()
    await asyncio.to_thread(pg.stop)
    await asyncio.to_thread(pg.start)


@asynccontextmanager
async def bench_settings(
    admin_url: str, bootstrap: str, **overrides: object
) -> AsyncIterator[Settings]:
    """Settings on a new migrated database (dropped after) and topics of the run's own."""
    name = f"bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = admin_url.rsplit("/", 1)[0] + f"/{name}"
        await migrate.upgrade_async(url)
        prefix = f"b{uuid.uuid4().hex[:8]}"
        settings = Settings(
            database_url=url,
            kafka_bootstrap_servers=bootstrap,
            dispatch_topic=f"{prefix}.dispatch",
            events_topic=f"{prefix}.events",
            dead_letter_topic=f"{prefix}.deadletter",
            consumer_group=f"{prefix}-workers",
            log_level="WARNING",
            auth="tenant_header",
        ).model_copy(update={**broker_settings(), **overrides})
        await ensure_topics(bootstrap, Pools(settings).topic_partitions())
        yield settings
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@asynccontextmanager
async def pipeline(admin_url: str, bootstrap: str, **overrides: object) -> AsyncIterator[Bench]:
    async with bench_settings(admin_url, bootstrap, **overrides) as settings:
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://sg") as client:
                bench = Bench(settings=settings, app=app, client=client)
                try:
                    yield bench
                finally:
                    bench.stop.set()
                    await asyncio.gather(*bench.tasks, return_exceptions=True)


async def job_rows(
    bench: Bench,
    *columns: KeyedColumnElement[Any],
    where: ColumnElement[bool] | None = None,
) -> list[dict[str, Any]]:
    """These columns of the benchmark database's jobs (``id`` as a string)."""
    query = select(*columns)
    if where is not None:
        query = query.where(where)
    db = make_engine(bench.settings.require_database_url(), pool_size=1)
    try:
        async with db.connect() as conn:
            result = await conn.execute(query)
            rows = [dict(row._mapping) for row in result]
    finally:
        await db.dispose()
    for row in rows:
        if "id" in row:
            row["id"] = str(row["id"])
    return rows


async def wait_published(bench: Bench, count: int) -> None:
    """Until the lag monitor reads ``count`` records published (the relay's work done)."""
    monitor = bench.app.state.monitor
    async with asyncio.timeout(120):
        while True:
            if monitor.snapshot().lag >= count:
                return
            await asyncio.sleep(0.2)
