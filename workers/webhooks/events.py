"""Terminal job events to webhook delivery rows, a batch of events at a time.

Each terminal job event calls for delivery rows (``DeliveryRepository.enqueue``: the job's
own when it has a ``callback_url``, its batch's when it was the batch's last job to end). A
row is unique per subject and event, so an event consumed twice (at-least-once) makes one
delivery sequence; the delivery loop (``workers/webhooks/dispatch.py``) sends them. The
events the faust agent took together are written together: one read and one insert.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from plumbing.retry import outage, retrying
from schemas.envelopes import JobEvent
from workers.webhooks.delivery_repository import DeliveryRepository
from workers.webhooks.dispatch import DEAD_LETTERED, Dispatcher
from workers.webhooks.retry import RetrySchedule, Uniform

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class EventRecord:
    """One record of the events topic."""

    topic: str
    partition: int
    offset: int
    value: bytes


class EventHandler:
    """Terminal job events to delivery rows; a database error is retried (the events are
    not acknowledged until their rows are written)."""

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

    async def __call__(self, records: Sequence[EventRecord]) -> None:
        """Handle a batch of records, until the database takes them (the agent's offsets
        are committed only after it)."""
        ended: dict[str, None] = {}  # terminal jobs, in order, once each
        for record in records:
            try:
                event = JobEvent.model_validate_json(record.value)
            except ValidationError:
                await self._poison(record)
                continue
            # A job with no callback and in no batch calls for no delivery: not read.
            if event.state.terminal and (event.callback_url or event.in_batch is not False):
                ended[event.job_id] = None
        if not ended:
            return
        ids = list(ended)
        waits = [self._schedule.wait_before(1, self._uniform) for _ in ids]
        made = await retrying(
            "webhook_enqueue", lambda: self._repo.enqueue(ids, waits), transient=outage
        )
        if made.ids:
            self._dispatcher.due_in(min(made.waits_s))

    async def _poison(self, record: EventRecord) -> None:
        r = record
        log.error("webhooks: %s@%d:%d is not a job event", r.topic, r.partition, r.offset)
        await retrying(
            "webhook_enqueue",
            lambda: self._repo.poison(
                topic=r.topic, partition=r.partition, offset=r.offset, payload=r.value
            ),
            transient=outage,
        )
        DEAD_LETTERED.labels(source="events", reason="invalid_event").inc()
