"""Entry point of a worker process."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from prometheus_client import start_http_server

from sluicegate.aio import wait_first
from sluicegate.db import make_engine
from sluicegate.kafka import close_client, make_consumer
from sluicegate.settings import Settings
from workers.consumer import Worker
from workers.engines.base import InferenceEngine
from workers.engines.sim import SimEngine
from workers.execution import Executor
from workers.repository import WorkerRepository

log = logging.getLogger(__name__)


def build_engine(settings: Settings) -> InferenceEngine:
    if settings.engine == "sim":
        return SimEngine(
            token_time_s=settings.sim_token_time_s,
            prefill_token_time_s=settings.sim_prefill_token_time_s,
            slots=settings.worker_concurrency,
        )
    raise ValueError(f"unknown engine {settings.engine!r}")


async def start_consumer(settings: Settings, stop: asyncio.Event) -> AIOKafkaConsumer | None:
    backoff = 0.2
    while not stop.is_set():
        consumer = make_consumer(settings.require_kafka(), group_id=settings.consumer_group)
        try:
            await consumer.start()
        except (KafkaError, OSError) as exc:
            await close_client(consumer)
            log.warning("broker unavailable, retrying in %.1fs: %r", backoff, exc)
            await wait_first(stop, limit_s=backoff)
            backoff = min(backoff * 2, 5.0)
            continue
        return consumer
    return None


async def run_worker(
    settings: Settings, stop: asyncio.Event, *, engine: InferenceEngine | None = None
) -> None:
    if settings.metrics_port is not None:
        start_http_server(settings.metrics_port)
    inference = engine if engine is not None else build_engine(settings)
    db = make_engine(settings.require_database_url(), pool_size=settings.worker_concurrency + 1)
    await inference.start()
    try:
        consumer = await start_consumer(settings, stop)
        if consumer is None:
            return
        try:
            executor = Executor(
                engine=inference,
                repo=WorkerRepository(db, events_topic=settings.events_topic),
            )
            worker = Worker(
                consumer=consumer,
                engine=inference,
                executor=executor,
                topic=settings.dispatch_topic,
                bootstrap=settings.require_kafka(),
                drain_timeout_s=settings.drain_timeout_s,
            )
            await worker.run(stop)
        finally:
            await close_client(consumer)
    finally:
        await inference.close()
        await db.dispose()
