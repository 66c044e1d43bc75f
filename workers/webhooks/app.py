"""The webhook dispatcher's faust-streaming app: one agent over the job-events topic that
hands each record to a handler (``workers/webhooks/events.py``), and running it until a stop.

The app keeps no tables and declares no topics: it needs only a consumer group, which is
why it runs on the Tansu fallback broker as on Apache Kafka.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust

from plumbing.kafka import ensure_topics
from plumbing.settings.kafka import KafkaSettings
from plumbing.settings.webhooks import WebhookSettings

# One record of the events topic: topic, partition, offset, value.
Handler = Callable[[str, int, int, bytes], Awaitable[None]]


@dataclass(frozen=True, kw_only=True)
class Consuming:
    """What the app reads: the broker, the topics, its group's values and its folder."""

    bootstrap: str
    kafka: KafkaSettings
    webhooks: WebhookSettings
    data_dir: Path


def build_app(c: Consuming, handle: Handler) -> Any:
    """The faust app: one agent over the events topic, nothing else (no tables, no leader
    topic, no web server, no topic declarations)."""
    session_s = c.webhooks.webhook_session_timeout_s
    app = faust.App(
        c.webhooks.webhook_group,
        broker=[f"kafka://{host}" for host in c.bootstrap.split(",")],
        store="memory://",
        datadir=str(c.data_dir / "webhooks"),
        web_enabled=False,
        topic_allow_declare=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=session_s,
        broker_heartbeat_interval=session_s / 5,
        broker_rebalance_timeout=session_s,
        producer_acks=-1,
    )
    topic = app.topic(c.kafka.events_topic, value_type=bytes, value_serializer="raw")

    async def agent(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            await handle(message.topic, message.partition, message.offset, event.value)

    app.agent(topic, name="webhooks.job_events")(agent)
    return app


async def consume(c: Consuming, handler: Handler, stop: asyncio.Event) -> None:
    """Run the faust app until ``stop``; a crash of the app ends the process (whoever
    supervises it starts it again)."""
    await ensure_topics(
        c.bootstrap, c.kafka.topic_partitions(), replication_factor=c.kafka.replication_factor
    )
    app = build_app(c, handler)
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
