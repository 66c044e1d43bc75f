"""The API's lifespan: build its services, publish them on ``app.state``, run their
background tasks while the app serves, and close everything after it stopped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.datastructures import State

from plumbing.db import make_engine
from plumbing.notify import Listener
from plumbing.settings import Settings
from producers.admission.controller import AdmissionController
from producers.admission.flow import report_flow
from producers.admission.policy import Policy
from producers.admission.ratelimit import TenantLimits
from producers.api.waiting import Reads, Waiters
from producers.batches.input import RequestChecker
from producers.batches.lifecycle import Lifecycle
from producers.batches.lifecycle_repository import LifecycleStore
from producers.batches.meter import Meter
from producers.batches.meter_repository import MeterStore
from producers.batches.repository import BatchStore
from producers.files.repository import FileStore
from producers.jobs.group_commit import GroupCommit
from producers.jobs.repository import JobRepository
from producers.lag.estimate import LagEstimate
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
    field is published on ``app.state`` under its own name."""

    repo: JobRepository
    group_commit: GroupCommit
    batches: BatchStore
    files: FileStore
    keys: KeyStore
    admission: AdmissionController
    monitor: LagMonitor
    meter: Meter
    lifecycle: Lifecycle
    waiters: Waiters
    reads: Reads

    def publish(self, state: State) -> None:
        for field in fields(self):
            setattr(state, field.name, getattr(self, field.name))


@dataclass(frozen=True, kw_only=True)
class Lifespan:
    """FastAPI's ``lifespan=``: ``engine`` (None: one of the settings' database, disposed
    at the end) and ``lag_source`` (None: the dispatch topic's consumer lag) as given to
    ``create_app``."""

    settings: Settings
    engine: AsyncEngine | None = None
    lag_source: LagSource | None = None

    @asynccontextmanager
    async def __call__(self, app: FastAPI) -> AsyncIterator[None]:
        async with (
            _engines(self.settings, self.engine) as (db, submit_db),
            _lag_source(self.settings, db, self.lag_source) as source,
        ):
            services = build(self.settings, db, submit_db, source)
            services.publish(app.state)
            await services.monitor.refresh()  # serve with a reading, not with "unknown"
            async with _background(services, db, self.settings.lag_interval_s):
                yield


def build(
    settings: Settings, db: AsyncEngine, submit_db: AsyncEngine, source: LagSource
) -> Services:
    repo = JobRepository(
        db,
        dispatch_topic=settings.dispatch_topic,
        events_topic=settings.events_topic,
        autocommit=submit_db,
    )
    estimate = LagEstimate()
    monitor = LagMonitor(
        source,
        estimate=estimate,
        interval_s=settings.lag_interval_s,
        stale_after_s=settings.lag_stale_after_s,
    )
    admission = AdmissionController(
        Policy.of(settings.admission, speed_min_samples=settings.speed_min_samples),
        monitor,
        TenantLimits(rpm=settings.tenant_rpm, tpm=settings.tenant_tpm),
        estimate,
    )
    batches = BatchStore(db, events_topic=settings.events_topic)
    files = FileStore(db)
    meter = _meter(settings, db, admission)
    return Services(
        repo=repo,
        group_commit=GroupCommit.of(repo, settings.api),
        batches=batches,
        files=files,
        keys=KeyStore(db, cache_s=settings.api_key_cache_s),
        admission=admission,
        monitor=monitor,
        meter=meter,
        lifecycle=Lifecycle(
            LifecycleStore(db, batches, files),
            lambda endpoint: RequestChecker(settings.api, endpoint=endpoint),
            interval_s=settings.lag_interval_s,
            released=meter.wake,
        ),
        waiters=Waiters(limit=settings.api_max_connections),
        reads=Reads(repo),
    )


def _meter(settings: Settings, db: AsyncEngine, admission: AdmissionController) -> Meter:
    return Meter(
        MeterStore(db, dispatch_topic=settings.dispatch_topic, events_topic=settings.events_topic),
        admission,
        soft=settings.lag_soft,
        fill=settings.batch_fill,
        interval_s=settings.lag_interval_s,
        counts_backlog=settings.lag_measure == "open",
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
            autocommit=True,
        )
        try:
            yield db, submit_db
        finally:
            await submit_db.dispose()
    finally:
        if engine is None:
            await db.dispose()


@asynccontextmanager
async def _lag_source(
    settings: Settings, db: AsyncEngine, given: LagSource | None
) -> AsyncIterator[LagSource]:
    source = given or _own_source(settings, db)
    try:
        yield source
    finally:
        if isinstance(source, KafkaLagSource | SharedLagSource):
            await source.close()


def _own_source(settings: Settings, db: AsyncEngine) -> KafkaLagSource | SharedLagSource:
    local = KafkaLagSource(
        db=db,
        bootstrap=settings.require_kafka(),
        topic=settings.dispatch_topic,
        group_id=settings.consumer_group,
        partitions=settings.partitions,
        count_open=settings.lag_measure == "open",
    )
    if settings.lag_reader == "own":
        return local
    return SharedLagSource(
        local,
        url=settings.require_database_url(),
        topic=settings.dispatch_topic,
        group=settings.consumer_group,
    )


@asynccontextmanager
async def _background(
    services: Services, db: AsyncEngine, lag_interval_s: float
) -> AsyncIterator[None]:
    """The lag monitor, the flow report, the jobs-by-state gauge, the jobs channel's listener
    (it wakes the waiting requests, the meter and the batch lifecycle), the submit groups'
    writer, the batch meter and the batch lifecycle, stopped and awaited at the end."""

    def on_notice(payload: str) -> None:
        services.waiters.on_notice(payload)
        services.meter.job_ended()  # room for a held job
        services.lifecycle.wake()  # perhaps a batch's last job

    listener = Listener(
        db.url.render_as_string(hide_password=False),
        constants.JOBS_CHANNEL,
        on_notice=on_notice,
        on_connect=services.waiters.on_connect,
    )
    stop = asyncio.Event()
    flow = report_flow(services.repo, services.monitor, stop, services.admission.observe)
    tasks = [
        asyncio.create_task(services.monitor.run(stop), name="lag-monitor"),
        asyncio.create_task(flow, name="flow"),
        asyncio.create_task(
            report_jobs_by_state(OverviewStore(db), stop, interval_s=lag_interval_s),
            name="jobs-by-state",
        ),
        asyncio.create_task(listener.run(stop), name="jobs-listener"),
        asyncio.create_task(services.group_commit.run(stop), name="submit-groups"),
        asyncio.create_task(services.meter.run(stop), name="batch-meter"),
        asyncio.create_task(services.lifecycle.run(stop), name="batch-lifecycle"),
    ]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
