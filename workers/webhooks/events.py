"""Terminal job events to webhook delivery rows.

Each terminal job event becomes delivery rows (``DeliveryRepository.enqueue``: the job's
own when it has a ``callback_url``, its batch's when it was the batch's last job to end). A
row is unique per subject and event, so an event consumed twice (at-least-once) makes one
delivery sequence; the delivery loop (``workers/webhooks/dispatch.py``) sends them.
"""

from __future__ import annotations

import logging

from pydantic import ValidationError

from plumbing.retry import outage, retrying
from schemas.envelopes import JobEvent
from workers.webhooks.delivery_repository import DeliveryRepository
from workers.webhooks.dispatch import DEAD_LETTERED, Dispatcher
from workers.webhooks.retry import RetrySchedule, Uniform

log = logging.getLogger(__name__)


class EventHandler:
    """Terminal job events to delivery rows; a database error is retried (the event is
    not acknowledged until its rows are written)."""

    def __init__(
        self,
        repo: DeliveryRepository,
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
        """Handle one event, until the database takes it (the agent's offset is committed
        only after it)."""
        await retrying(
            "webhook_enqueue",
            lambda: self._handle(topic, partition, offset, value),
            transient=outage,
        )

    async def _handle(self, topic: str, partition: int, offset: int, value: bytes) -> None:
        try:
            event = JobEvent.model_validate_json(value)
        except ValidationError:
            log.error("webhooks: %s@%d:%d is not a job event", topic, partition, offset)
            await self._repo.poison(topic=topic, partition=partition, offset=offset, payload=value)
            DEAD_LETTERED.labels(source="events", reason="invalid_event").inc()
            return
        if not event.state.terminal:
            return
        first_wait_s = self._schedule.wait_before(1, self._uniform)
        if await self._repo.enqueue(event.job_id, first_wait_s=first_wait_s):
            self._dispatcher.wake()
