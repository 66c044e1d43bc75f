"""``sluicegate webhooks``: the dispatcher process, wired together. The faust app
(``app.py``) feeds terminal job events to the event handler (``events.py``), which makes
delivery rows; the delivery loop (``dispatch.py``) sends them, woken by NOTIFY; a metrics
server when a port is set.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid

from plumbing.db import make_engine
from plumbing.metrics import serve as serve_metrics
from plumbing.notify import Listener
from plumbing.settings import Settings
from schemas.webhooks import WEBHOOKS_CHANNEL
from workers.webhooks.app import Consuming, consume
from workers.webhooks.attempt_repository import AttemptRepository
from workers.webhooks.claim_repository import ClaimRepository
from workers.webhooks.delivery_repository import DeliveryRepository
from workers.webhooks.dispatch import Dispatcher
from workers.webhooks.events import EventHandler
from workers.webhooks.http import WebhookClient
from workers.webhooks.retry import RetrySchedule
from workers.webhooks.ssrf import AddressPolicy


async def run_webhooks(settings: Settings, stop: asyncio.Event) -> None:
    """The dispatcher process until ``stop``: consume events, deliver, drain, exit."""
    serve_metrics("webhooks", settings.metrics_port)
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
    client = WebhookClient(
        policy=AddressPolicy(allow=settings.webhook_allow_networks),
        timeout_s=settings.webhook_timeout_s,
    )
    # The NOTIFY payload of the deliveries made here: this dispatcher claims them at once,
    # the others are woken by it.
    tag = f"dispatcher {uuid.uuid4().hex}"
    dispatcher = Dispatcher(
        ClaimRepository(db),
        AttemptRepository(db, dead_letter_topic=settings.dead_letter_topic),
        client,
        schedule=schedule,
        uniform=rng.uniform,
        timeout_s=settings.webhook_timeout_s,
        max_in_flight=settings.webhook_max_in_flight,
        per_endpoint=settings.webhook_max_in_flight_per_endpoint,
        claim_every_s=settings.webhook_claim_every_s,
        tag=tag,
    )
    listener = Listener(
        url, WEBHOOKS_CHANNEL, on_notice=dispatcher.notified, on_connect=dispatcher.wake
    )
    handler = EventHandler(
        DeliveryRepository(db, dead_letter_topic=settings.dead_letter_topic, tag=tag),
        dispatcher,
        schedule=schedule,
        uniform=rng.uniform,
    )
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(listener.run(stop), name="webhooks-listen")
            tasks.create_task(dispatcher.run(stop), name="webhooks-deliver")
            consuming = Consuming(
                bootstrap=settings.require_kafka(),
                kafka=settings.kafka,
                webhooks=settings.webhooks,
                data_dir=settings.data_dir,
            )
            tasks.create_task(consume(consuming, handler, stop), name="webhooks-consume")
    finally:
        await client.aclose()
        await db.dispose()
