"""Entry point of a worker process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiokafka import AIOKafkaConsumer
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.db import make_engine
from plumbing.kafka import close_client, make_consumer
from plumbing.metrics import label
from plumbing.metrics import serve as serve_metrics
from plumbing.pools import Pools
from plumbing.publish_at_once import AtOncePublisher, at_once_publisher
from plumbing.retry import Stopped, outage, retrying
from plumbing.settings import Settings
from plumbing.settings.worker import WorkerSettings
from plumbing.unit_of_work import UnitOfWork
from workers.consumer import Worker
from workers.control import Control
from workers.end_repository import EndRepository
from workers.engines.base import InferenceEngine
from workers.engines.build import build_engine
from workers.execution import Executor
from workers.gate import PreDecodeGate, PullGate
from workers.group.seams import GroupConsumer
from workers.group.threaded_consumer import (
    ThreadedConsumer,
    consumer_config,
    require_consumer_protocol,
)
from workers.kv import ExpectedOutput, SpeedMeter
from workers.metrics import watch
from workers.presence.report import Presence, worker_id
from workers.presence.repository import PresenceRepository
from workers.repository import WorkerRepository, lock_rows

log = logging.getLogger(__name__)


def build_gate(
    worker: WorkerSettings, engine: InferenceEngine, gate_type: type[PullGate] = PullGate
) -> PullGate:
    """The worker's pull gate on ``engine``, as ``worker`` sets it; ``gate_type``: the
    gate's class (``PullGate`` or a subclass taking the same arguments)."""
    return gate_type(
        engine,
        max_running=worker.worker_max_running,
        watermark=worker.kv_watermark,
        max_prefill_tokens=worker.worker_max_prefill_tokens,
        expected=ExpectedOutput(
            observed=worker.expected_output == "observed",
            quantile=worker.observed_quantile,
            min_samples=worker.observed_min_samples,
            window=worker.observed_window,
        ),
    )


def build_predecode(worker: WorkerSettings, gate: PullGate) -> PreDecodeGate:
    return PreDecodeGate(
        speed=SpeedMeter(window=worker.speed_window, min_samples=worker.speed_min_samples),
        expected=gate.expected,
        drop_unreachable=worker.drop_unreachable,
    )


def build_presence(
    settings: Settings,
    db: AsyncEngine,
    engine: InferenceEngine,
    gate: PullGate,
    work: UnitOfWork | None = None,
) -> Presence:
    own = settings.worker
    return Presence(
        PresenceRepository(db, work),
        worker=worker_id(own.worker_group_instance_id),
        # Its pool's model; without pools, as the started engine names it.
        model=settings.worker_model
        if settings.pools and settings.worker_model
        else engine.served_model,
        engine=engine,
        gate=gate,
        interval_s=own.worker_report_s,
    )


def make_group_consumer(bootstrap: str, group_id: str, worker: WorkerSettings) -> GroupConsumer:
    """The worker's member of its group, on ``worker_group_protocol``."""
    if worker.worker_group_protocol == "consumer":
        return ThreadedConsumer(
            consumer_config(
                bootstrap,
                group_id=group_id,
                fetch_bytes=worker.worker_fetch_bytes,
                group_instance_id=worker.worker_group_instance_id,
            )
        )
    classic: GroupConsumer = make_consumer(
        bootstrap,
        group_id=group_id,
        fetch_bytes=worker.worker_fetch_bytes,
        group_instance_id=worker.worker_group_instance_id,
        session_timeout_ms=worker.worker_session_timeout_ms,
    )
    return classic


async def close_consumer(consumer: GroupConsumer) -> None:
    if isinstance(consumer, AIOKafkaConsumer):
        await close_client(consumer)
    else:
        await consumer.stop()


async def start_consumer(
    bootstrap: str, group_id: str, worker: WorkerSettings, stop: asyncio.Event
) -> GroupConsumer | None:
    """The worker's consumer, started once the broker answers; None if ``stop`` comes
    first."""

    async def start() -> GroupConsumer:
        if worker.worker_group_protocol == "consumer":
            await require_consumer_protocol(bootstrap)
        consumer = make_group_consumer(bootstrap, group_id, worker)
        try:
            await consumer.start()
        except BaseException:
            await close_consumer(consumer)
            raise
        return consumer

    try:
        return await retrying("worker_start", start, stop=stop, transient=outage)
    except Stopped:
        return None


def events_topic(settings: Settings) -> dict[str, int]:
    """The events topic, with its partitions: what a worker publishes at once."""
    return {settings.events_topic: settings.topic_partitions()[settings.events_topic]}


def claims(settings: Settings, db: AsyncEngine) -> WorkerRepository:
    """The worker's claims, with the unit of work that joins them: a job's end and the
    presence report wait up to ``end_linger_ms`` for the next claim's transaction (ends
    that no claim came for are written together, their rows locked in one order)."""
    work = UnitOfWork(db, linger_s=settings.worker.end_linger_ms / 1000, lock=lock_rows)
    return WorkerRepository(
        db,
        events_topic=settings.events_topic,
        dead_letter_topic=settings.dead_letter_topic,
        work=work,
        dispatch_topic=settings.dispatch_topic,
        partitions=settings.partitions,
    )


def ends_of(
    settings: Settings,
    db: AsyncEngine,
    repo: WorkerRepository,
    at_once: AtOncePublisher | None,
) -> EndRepository:
    """The worker's job ends: riding in its claims, published at once, and the steps its
    graphs' parts trigger written with them."""
    return EndRepository(
        db,
        events_topic=settings.events_topic,
        at_once=at_once,
        work=repo.work,
        graphs=repo.graphs,
    )


async def run_worker(
    settings: Settings,
    stop: asyncio.Event,
    *,
    engine: InferenceEngine | None = None,
    gate_type: type[PullGate] = PullGate,
) -> None:
    """Run one worker until ``stop``, in the pool of its model (``worker_model``: its
    topic, its group, its settings); ``engine`` and ``gate_type`` as ``working`` takes
    them."""
    async with working(settings, stop, engine=engine, gate_type=gate_type) as worker:
        if worker is not None:
            await worker.run(stop)


@contextlib.asynccontextmanager
async def working(
    settings: Settings,
    stop: asyncio.Event,
    *,
    engine: InferenceEngine | None = None,
    gate_type: type[PullGate] = PullGate,
) -> AsyncIterator[Worker | None]:
    """One worker, made with everything it runs with (its engine started, its consumer,
    its control, its presence reports), for its caller to run; all of it stopped and closed
    after. None if ``stop`` came before the broker answered. ``engine``: the one to use
    (None: the one ``settings`` name); ``gate_type``: its pull gate's class (``build_gate``)."""
    pool = Pools(settings).for_worker()
    settings = pool.settings
    label("worker", model=pool.model)  # every family it exports: its pool's model
    serve_metrics("worker", settings.metrics_port)
    own = settings.worker
    inference = engine if engine is not None else build_engine(own.engine, settings.engines)
    db = make_engine(settings.require_database_url(), pool_size=own.worker_db_pool_size)
    await inference.start()
    try:
        consumer = await start_consumer(
            settings.require_kafka(), settings.consumer_group, own, stop
        )
        if consumer is None:
            yield None
            return
        repo = claims(settings, db)
        control = Control(
            engine=inference,
            repo=repo,
            database_url=settings.database_url,
            sweep_s=own.control_sweep_s,
        )
        at_once = at_once_publisher(settings, repo.work, topics=events_topic(settings))
        control_stop = asyncio.Event()  # and at once's: after the drain's last ends
        controls = [asyncio.create_task(control.run(control_stop), name="control")]
        if at_once is not None:
            controls.append(asyncio.create_task(at_once.run(control_stop), name="at-once"))
        try:
            gate = build_gate(own, inference, gate_type)
            executor = Executor(
                engine=inference,
                repo=repo,
                ends=ends_of(settings, db, repo, at_once),
                control=control,
                predecode=build_predecode(own, gate),
                # A revoked owner's jobs end or are aborted within its drain.
                takeover_grace_s=own.drain_timeout_s,
            )
            watch(inference, gate.reserved_blocks)
            presence_stop = asyncio.Event()
            reporting = build_presence(settings, db, inference, gate, repo.work)
            presence = asyncio.create_task(reporting.run(presence_stop), name="presence")
            try:
                yield Worker(
                    consumer=consumer,
                    gate=gate,
                    executor=executor,
                    topic=settings.dispatch_topic,
                    bootstrap=settings.require_kafka(),
                    drain_timeout_s=own.drain_timeout_s,
                    claim_batch=own.claim_batch,
                )
            finally:
                presence_stop.set()
                await presence
                executor.fenced.flush()  # the last burst, before the process ends
        finally:
            control_stop.set()  # after the drain: jobs still decoding can be stopped
            await asyncio.gather(*controls)
            await close_consumer(consumer)
    finally:
        await inference.close()
        await db.dispose()
