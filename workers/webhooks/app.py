"""The webhook dispatcher's faust-streaming app: one agent over the job-events topic that
hands its records to a handler (``workers/webhooks/events.py``) in batches, and running it
until a stop.

The batches need no timer: the agent hands over a record as soon as it comes, and the
records that come while the handler is busy go together in its next call (``batched``). A
lone event is not held back, a burst is one call, and an idle agent does nothing. A record
is acknowledged (its offset may be committed) only once the call that had it returned.

The app keeps no tables and declares no topics: it needs only a consumer group, which is
why it runs on the Tansu fallback broker as on Apache Kafka.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import faust

from plumbing.kafka import ensure_topics
from plumbing.settings.kafka import KafkaSettings
from plumbing.settings.webhooks import WebhookSettings
from workers.webhooks.events import EventRecord

# The records the agent took together; they are acknowledged once it returns.
Handler = Callable[[Sequence[EventRecord]], Awaitable[None]]

# The most records in one call of the handler.
BATCH_MAX = 500

T = TypeVar("T")


async def batched(
    items: AsyncIterator[T], write: Callable[[list[T]], Awaitable[None]], most: int = BATCH_MAX
) -> None:
    """Pull ``items`` and ``write`` them: a write starts as soon as an item comes and no
    write is running, with every item that came meanwhile (at most ``most``). Pulling stops
    while ``most`` wait. A failed write raises here; the items it had are not written."""
    waiting: list[T] = []
    pulling: asyncio.Future[T] | None = None
    writing: asyncio.Future[None] | None = None
    ended = False
    try:
        while not ended or waiting or writing is not None:
            if pulling is None and not ended and len(waiting) < most:
                pulling = asyncio.ensure_future(anext(items))
            if writing is None and waiting:
                batch, waiting = waiting[:most], waiting[most:]
                writing = asyncio.ensure_future(write(batch))
            running = [f for f in (pulling, writing) if f is not None]
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            if writing is not None and writing in done:
                wrote = writing
                writing = None
                wrote.result()
            if pulling is not None and pulling in done:
                pulled = pulling
                pulling = None
                try:
                    waiting.append(pulled.result())
                except StopAsyncIteration:
                    ended = True
    finally:
        for future in (pulling, writing):
            if future is not None:
                future.cancel()


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
        manual = stream.noack()  # acknowledged by ``write``, once handled

        async def write(events: list[Any]) -> None:
            await handle(
                [
                    EventRecord(
                        topic=e.message.topic,
                        partition=e.message.partition,
                        offset=e.message.offset,
                        value=e.value,
                    )
                    for e in events
                ]
            )
            for event in events:
                await manual.ack(event)

        await batched(manual.events(), write)

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
