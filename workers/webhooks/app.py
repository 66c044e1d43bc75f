"""The webhook dispatcher: a faust-streaming app over the job-events topic, and the
delivery loop beside it in the same process.

The agent turns each terminal job event into delivery rows (``WebhookRepository.enqueue``:
the job's own when it has a ``callback_url``, its batch's when it was the batch's last job
to end). A row is unique per subject and event, so an event consumed twice (at-least-once)
makes one delivery sequence. The delivery loop (``workers/webhooks/dispatch.py``) sends
them. The app keeps no tables and declares no topics: it needs only a consumer group,
which is why it runs on the embedded Tansu broker as on Apache Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import faust
from prometheus_client import start_http_server
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from schemas.envelopes import JobEvent
from schemas.webhooks import WEBHOOKS_CHANNEL
from sluicegate.db import make_engine
from sluicegate.kafka import ensure_topics
from sluicegate.notify import Listener
from sluicegate.settings import Settings
from workers.webhooks.dispatch import Dispatcher
from workers.webhooks.http import WebhookClient
from workers.webhooks.repository import WebhookRepository
from workers.webhooks.retry import RetrySchedule, Uniform
from workers.webhooks.ssrf import AddressPolicy

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0

# One record of the events topic: topic, partition, offset, value.
Handler = Callable[[str, int, int, bytes], Awaitable[None]]


def build_app(settings: Settings, handle: Handler) -> Any:
    """The faust app: one agent over the events topic, nothing else (no tables, no leader
    topic, no web server, no topic declarations)."""
    session_s = settings.webhook_session_timeout_s
    app = faust.App(
        settings.webhook_group,
        broker=[f"kafka://{host}" for host in settings.require_kafka().split(",")],
        store="memory://",
        datadir=str(settings.data_dir / "webhooks"),
        web_enabled=False,
        topic_allow_declare=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=session_s,
        broker_heartbeat_interval=session_s / 5,
        broker_rebalance_timeout=session_s,
        producer_acks=-1,
    )
    topic = app.topic(settings.events_topic, value_type=bytes, value_serializer="raw")

    async def agent(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            await handle(message.topic, message.partition, message.offset, event.value)

    app.agent(topic, name="webhooks.job_events")(agent)
    return app


class EventHandler:
    """Terminal job events to delivery rows; a database error is retried (the event is
    not acknowledged until its rows are written)."""

    def __init__(
        self,
        repo: WebhookRepository,
        dispatcher: Dispatcher,
        *,
        schedule: RetrySchedule,
        uniform: Uniform,
    ) -> None:
        self._repo = repo
        self._dispatcher = dispatcher
        self._schedule = schedule
        self._uniform = uniform

    async def __call__(self, topic: str, partition: int, offset: int, value: bytes) -> None:
        backoff = 0.1
        while True:
            try:
                await self._handle(topic, partition, offset, value)
                return
            except (DBAPIError, OSError, PoolTimeout) as exc:
                log.warning("webhooks: database unavailable, retrying in %.1fs: %r", backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _handle(self, topic: str, partition: int, offset: int, value: bytes) -> None:
        try:
            event = JobEvent.model_validate_json(value)
        except ValidationError:
            log.error("webhooks: %s@%d:%d is not a job event", topic, partition, offset)
            await self._repo.poison(topic=topic, partition=partition, offset=offset, payload=value)
            return
        if not event.state.terminal:
            return
        first_wait_s = self._schedule.wait_before(1, self._uniform)
        if await self._repo.enqueue(event.job_id, first_wait_s=first_wait_s):
            self._dispatcher.wake()


async def run_webhooks(settings: Settings, stop: asyncio.Event) -> None:
    """The dispatcher process until ``stop``: consume events, deliver, drain, exit."""
    if settings.metrics_port is not None:
        start_http_server(settings.metrics_port)
    if settings.log_level.upper() != "DEBUG":
        for name in ("faust", "mode"):  # their start and stop take forty INFO lines
            logging.getLogger(name).setLevel(logging.WARNING)
    url = settings.require_database_url()
    db = make_engine(url, pool_size=4)
    rng = random.Random()
    schedule = RetrySchedule(
        steps_s=settings.webhook_retry_schedule_s,
        retry_after_max_s=settings.webhook_retry_after_max_s,
    )
    repo = WebhookRepository(db, dead_letter_topic=settings.dead_letter_topic)
    client = WebhookClient(
        policy=AddressPolicy(allow=settings.webhook_allow_networks),
        timeout_s=settings.webhook_timeout_s,
    )
    dispatcher = Dispatcher(
        repo,
        client,
        schedule=schedule,
        uniform=rng.uniform,
        timeout_s=settings.webhook_timeout_s,
        max_in_flight=settings.webhook_max_in_flight,
        per_endpoint=settings.webhook_max_in_flight_per_endpoint,
    )
    listener = Listener(
        url, WEBHOOKS_CHANNEL, on_notice=lambda _: dispatcher.wake(), on_connect=dispatcher.wake
    )
    handler = EventHandler(repo, dispatcher, schedule=schedule, uniform=rng.uniform)
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(listener.run(stop), name="webhooks-listen")
            tasks.create_task(dispatcher.run(stop), name="webhooks-deliver")
            tasks.create_task(_consume(settings, handler, stop), name="webhooks-consume")
    finally:
        await client.aclose()
        await db.dispose()


async def _consume(settings: Settings, handler: Handler, stop: asyncio.Event) -> None:
    """Run the faust app until ``stop``; a crash of the app ends the process (whoever
    supervises it starts it again)."""
    await ensure_topics(
        settings.require_kafka(),
        settings.topic_partitions(),
        replication_factor=settings.replication_factor,
    )
    app = build_app(settings, handler)
    await app.start()
    stopped = asyncio.ensure_future(app.wait_until_stopped())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([stopped, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        stopping.cancel()
        crashed = app.crash_reason
        await app.stop()
    if crashed is not None and not stop.is_set():
        raise RuntimeError("the webhooks faust app crashed") from crashed
