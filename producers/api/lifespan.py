"""The API's lifespan: build its services, publish them on ``app.state``, run their
background tasks while the app serves, and close everything after it stopped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.datastructures import State

from plumbing.activity import Activity
from plumbing.db import make_engine
from plumbing.notify import JobNotice, Listener
from plumbing.pools import Pool, Pools
from plumbing.publish_at_once import AtOncePublisher, at_once_publisher
from plumbing.settings import Settings
from plumbing.unit_of_work import UnitOfWork
from producers.admission.controller import AdmissionController
from producers.admission.flow import report_flow
from producers.admission.ratelimit import TenantLimits
from producers.api.pools import PoolRouter, lag_source, pool_services
from producers.api.waiting import Reads, Waiters
from producers.batches.input import RequestChecker
from producers.batches.lifecycle import Lifecycle
from producers.batches.lifecycle_repository import LifecycleStore
from producers.batches.meter import Meter
from producers.batches.repository import BatchStore
from producers.files.repository import FileStore
from producers.jobs.group_commit import GroupCommit
from producers.jobs.repository import JobRepository
from producers.lag.kafka import KafkaLagSource
from producers.lag.monitor import LagMonitor, LagSource
from producers.lag.shared import SharedLagSource
from producers.overview.gauge import report_jobs_by_state
from producers.overview.repository import OverviewStore
from producers.tenancy.repository import KeyStore
from schemas import constants


@dataclass(frozen=True, kw_only=True)
class Services:
    """What the routes reach through their dependencies (``producers.api.deps``); each
    field is published on ``app.state`` under its own name. ``admission``, ``monitor`` and
    ``meter`` are the first pool's; ``pools`` has every pool's."""

    repo: JobRepository
    group_commit: GroupCommit
    batches: BatchStore
    files: FileStore
    keys: KeyStore
    pools: PoolRouter
    admission: AdmissionController
    monitor: LagMonitor
    meter: Meter
    lifecycle: Lifecycle
    waiters: Waiters
    reads: Reads
    at_once: AtOncePublisher | None = None  # publishes the submits' dispatch records at once
    work: UnitOfWork  # the periodic reads joining the submits' transactions

    def publish(self, state: State) -> None:
        for field in fields(self):
            setattr(state, field.name, getattr(self, field.name))


@dataclass(frozen=True, kw_only=True)
class Lifespan:
    """FastAPI's ``lifespan=``: ``engine`` (None: one of the settings' database, disposed
    at the end) and ``lag_source`` (None: each pool's consumer lag; given, the first
    pool's) as given to ``create_app``."""

    settings: Settings
    engine: AsyncEngine | None = None
    lag_source: LagSource | None = None

    @asynccontextmanager
    async def __call__(self, app: FastAPI) -> AsyncIterator[None]:
        pools = Pools(self.settings)
        activity = Activity()  # what the jobs listener hears (quiet loops wait on it)
        batch_activity = Activity()  # what it hears of batch jobs (the meter, the lifecycle)
        async with _engines(self.settings, self.engine) as (db, submit_db):
            # The periodic reads join the submits' transactions (plumbing.unit_of_work).
            work = UnitOfWork(submit_db, linger_s=self.settings.api.ride_linger_ms / 1000)
            async with _lag_sources(pools, db, self.lag_source, activity, work) as sources:
                services = build(self.settings, db, pools, sources, batch_activity, work=work)
                services.publish(app.state)
                for pool in services.pools:  # serve with a reading, not with "unknown"
                    await pool.monitor.refresh()
                heard = (activity, batch_activity)
                try:
                    async with _background(services, db, self.settings.lag_interval_s, heard):
                        yield
                finally:
                    await services.repo.close()


def build(
    settings: Settings,
    db: AsyncEngine,
    pools: Pools,
    sources: Sequence[tuple[Pool, LagSource]],
    batch_activity: Activity | None = None,
    *,
    work: UnitOfWork,
) -> Services:
    """``batch_activity``: what the process hears of batch jobs; the batch meters and
    lifecycle wait on it alone, so a stream of single submits does not wake them.
    ``work``: the submits' unit of work, on their own autocommit connections, which the
    periodic reads join."""
    repo = JobRepository(
        db,
        dispatch_topic=settings.dispatch_topic,
        events_topic=settings.events_topic,
        autocommit=work.engine,
        topic_of=pools.topic_of,
        work=work,
        at_once=at_once_publisher(
            settings, work, topics=pools.topic_partitions(), dispatch_topics=pools.topics()
        ),
        kept=settings.submit_batch_writers,
    )
    limits = TenantLimits(rpm=settings.tenant_rpm, tpm=settings.tenant_tpm)
    router = PoolRouter(
        pools,
        [pool_services(pool, db, source, limits, batch_activity) for pool, source in sources],
    )
    batches = BatchStore(db, events_topic=settings.events_topic, topic_of=pools.topic_of)
    files = FileStore(db)
    first = router.first
    return Services(
        repo=repo,
        group_commit=GroupCommit.of(repo, settings.api),
        batches=batches,
        files=files,
        keys=KeyStore(db, cache_s=settings.api_key_cache_s),
        pools=router,
        admission=first.admission,
        monitor=first.monitor,
        meter=first.meter,
        lifecycle=Lifecycle(
            LifecycleStore(db, batches, files),
            lambda endpoint: RequestChecker(settings.api, endpoint=endpoint),
            interval_s=settings.lag_interval_s,
            released=router.wake_meters,
            activity=batch_activity,
        ),
        waiters=Waiters(limit=settings.api_max_connections),
        reads=Reads(repo),
        at_once=repo.at_once,
        work=work,
    )


@asynccontextmanager
async def _engines(
    settings: Settings, engine: AsyncEngine | None
) -> AsyncIterator[tuple[AsyncEngine, AsyncEngine]]:
    """The database, and the submits' own connections to it: autocommit, one statement per
    group of submits."""
    db = engine if engine is not None else make_engine(settings.require_database_url())
    try:
        submit_db = make_engine(
            db.url.render_as_string(hide_password=False),
            pool_size=settings.submit_batch_writers,
        )
        try:
            yield db, submit_db
        finally:
            await submit_db.dispose()
    finally:
        if engine is None:
            await db.dispose()


@asynccontextmanager
async def _lag_sources(
    pools: Pools,
    db: AsyncEngine,
    given: LagSource | None,
    activity: Activity,
    work: UnitOfWork | None = None,
) -> AsyncIterator[list[tuple[Pool, LagSource]]]:
    """Each pool's lag source (``given``: the first pool's)."""
    sources: list[tuple[Pool, LagSource]] = []
    try:
        for pool in pools:
            own: LagSource
            if given is not None and pool.first:
                own = given
            else:
                own = lag_source(pool, db, activity, work)
            sources.append((pool, own))
        yield sources
    finally:
        for _, source in sources:
            if isinstance(source, KafkaLagSource | SharedLagSource):
                await source.close()


@asynccontextmanager
async def _background(
    services: Services,
    db: AsyncEngine,
    lag_interval_s: float,
    heard: tuple[Activity, Activity],
) -> AsyncIterator[None]:
    """The lag monitor, the flow report, the jobs-by-state gauge, the jobs channel's listener
    (it wakes the waiting requests, the meter and the batch lifecycle; with the outbox
    channel, it touches ``activity``), the submit groups' writer, the batch meter and the
    batch lifecycle, stopped and awaited at the end. ``heard``: the process's activity and
    its batch jobs' (touched by a notice of a job that may be in a batch)."""
    activity, batch_activity = heard

    def on_notice(payload: str) -> None:
        activity.touch()
        services.waiters.on_notice(payload)
        services.pools.job_ended()  # room for a held job
        notice = JobNotice.parse(payload)
        if notice is None or notice.in_batch is not False:
            batch_activity.touch()
            services.lifecycle.wake()  # perhaps a batch's last job

    def on_connect() -> None:
        activity.touch()  # what was sent while it was down is lost
        batch_activity.touch()
        services.waiters.on_connect()

    listener = Listener(
        db.url.render_as_string(hide_password=False),
        constants.JOBS_CHANNEL,
        on_notice=on_notice,
        on_connect=on_connect,
        also={constants.OUTBOX_CHANNEL: lambda _: activity.touch()},
    )
    activity.heard_by(listener.connected)
    batch_activity.heard_by(listener.connected)
    stop = asyncio.Event()
    tasks = []
    for pool in services.pools:
        model = pool.pool.model
        at = (pool.pool.topic, pool.pool.first)
        flow = report_flow(
            services.repo,
            pool.monitor,
            stop,
            pool.admission.observe,
            at,
            activity,
            work=services.work,
        )
        tasks += [
            asyncio.create_task(pool.monitor.run(stop), name=f"lag-monitor {model}"),
            asyncio.create_task(flow, name=f"flow {model}"),
            asyncio.create_task(pool.meter.run(stop), name=f"batch-meter {model}"),
        ]
    tasks += [
        asyncio.create_task(
            report_jobs_by_state(
                OverviewStore(db),
                stop,
                interval_s=lag_interval_s,
                activity=activity,
                work=services.work,
            ),
            name="jobs-by-state",
        ),
        asyncio.create_task(listener.run(stop), name="jobs-listener"),
        asyncio.create_task(services.group_commit.run(stop), name="submit-groups"),
        asyncio.create_task(services.lifecycle.run(stop), name="batch-lifecycle"),
    ]
    if services.at_once is not None:
        tasks.append(asyncio.create_task(services.at_once.run(stop), name="publish-at-once"))
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
