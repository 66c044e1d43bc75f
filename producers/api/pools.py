"""The API's side of each worker pool: its lag monitor, its admission and its batch meter
(``plumbing.pools``: one pool per model). A job is admitted on the lag and drain rate of
its own model's pool, so a flood of one model never refuses another's submits; the tenants'
rate limits are shared by every pool."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.activity import Activity
from plumbing.pools import Pool, Pools
from plumbing.unit_of_work import UnitOfWork
from producers.admission.context import EngineContext
from producers.admission.context_store import ContextStore
from producers.admission.controller import AdmissionController
from producers.admission.policy import Policy
from producers.admission.ratelimit import TenantLimits
from producers.batches.meter import Meter
from producers.batches.meter_repository import MeterStore
from producers.lag.estimate import LagEstimate
from producers.lag.kafka import KafkaLagSource
from producers.lag.monitor import LagMonitor, LagSource
from producers.lag.shared import SharedLagSource
from producers.overview.repository import WorkerRow
from schemas.completions import PoolState


@dataclass(frozen=True, kw_only=True)
class PoolServices:
    pool: Pool
    source: LagSource
    monitor: LagMonitor
    admission: AdmissionController
    meter: Meter
    context: EngineContext  # its engines' context, as its workers report it


class PoolRouter:
    """Each pool's services, found by the model a request names."""

    def __init__(self, pools: Pools, services: list[PoolServices]) -> None:
        self._pools = pools
        self._services = {s.pool.model: s for s in services}
        self._all = services

    def of(self, model: str | None) -> PoolServices:
        return self._services[self._pools.of(model).model]

    @property
    def first(self) -> PoolServices:
        return self._all[0]

    def __iter__(self) -> Iterator[PoolServices]:
        return iter(self._all)

    def wake_meters(self) -> None:
        for s in self._all:
            s.meter.wake()

    def job_ended(self) -> None:
        for s in self._all:
            s.meter.job_ended()


def pool_services(
    pool: Pool,
    db: AsyncEngine,
    source: LagSource,
    limits: TenantLimits,
    activity: Activity | None = None,
) -> PoolServices:
    """One pool's monitor, admission and meter, on its own settings (the meter quiet while
    ``activity`` hears nothing: the process's batch jobs' activity)."""
    s = pool.settings
    estimate = LagEstimate()
    monitor = LagMonitor(
        source,
        estimate=estimate,
        interval_s=s.lag_interval_s,
        stale_after_s=s.lag_stale_after_s,
        model=pool.model,
    )
    admission = AdmissionController(
        Policy.of(s.admission, speed_min_samples=s.speed_min_samples),
        monitor,
        limits,
        estimate,
        model=pool.model,
    )
    meter = Meter(
        MeterStore(db, dispatch_topic=pool.topic, events_topic=s.events_topic, first=pool.first),
        admission,
        soft=s.lag_soft,
        fill=s.batch_fill,
        interval_s=s.lag_interval_s,
        counts_backlog=s.lag_measure == "open",
        model=pool.model,
        activity=activity,
    )
    context = EngineContext(ContextStore(db), pool.model)
    return PoolServices(
        pool=pool,
        source=source,
        monitor=monitor,
        admission=admission,
        meter=meter,
        context=context,
    )


def lag_source(
    pool: Pool, db: AsyncEngine, activity: Activity | None = None, work: UnitOfWork | None = None
) -> KafkaLagSource | SharedLagSource:
    """The pool's lag, read from its group's committed offsets on its topic; quiet while
    ``activity`` hears nothing (``producers.lag.kafka``, ``producers.lag.shared``); its
    statement joins ``work``."""
    s = pool.settings
    local = KafkaLagSource(
        db=db,
        bootstrap=s.require_kafka(),
        topic=pool.topic,
        group_id=pool.group,
        partitions=s.partitions,
        count_open=s.lag_measure == "open",
        first=pool.first,
        activity=activity,
        work=work,
    )
    if s.lag_reader == "own":
        return local
    return SharedLagSource(
        local,
        url=s.require_database_url(),
        topic=pool.topic,
        group=pool.group,
        model=pool.model,
        stale_after_s=s.lag_stale_after_s,
        activity=activity,
    )


def pool_state(services: PoolServices, workers: list[WorkerRow], stale_s: float) -> PoolState:
    """The pool now: its topic and group, its workers that reported within ``stale_s``
    (every worker without pools configured: they all serve the one pool), its lag and
    admission."""
    pool = services.pool
    live = [
        w
        for w in workers
        if w.age_s <= stale_s and (not pool.settings.pools or w.model == pool.model)
    ]
    status = services.admission.status()
    return PoolState(
        topic=pool.topic,
        consumer_group=pool.group,
        workers=len(live),
        capacity=sum(w.capacity for w in live),
        running=sum(w.running for w in live),
        lag=status.lag,
        admission=status.state,
    )
