"""Outbox rows published at once by the writer that committed them (the API its jobs'
dispatch records, a worker its job events), and recorded as published by that writer's
next statement.

The relay publishes a row in a round of its own: a lock, a send, a record and a commit,
per job at a low rate. Here the writer hands the rows it just committed to ``offer``; a
task sends them, and hands where their records went (``plumbing.published_store``) to the
writer's unit of work (``plumbing.unit_of_work``), where the next statement that can
record them takes them. Records that waited ``linger_s`` are written in a statement of
their own.

Such a row is stored with ``publish_after`` ``grace_s`` ahead: until then the relay leaves
it alone. A row not sent (the broker down, too many waiting, the process stopping) or not
recorded by then is the relay's, which publishes it again if it was sent: a repeated record,
which a worker takes as a redelivery and the webhook dispatcher as the same event.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka.errors import KafkaError
from sqlalchemy.exc import SQLAlchemyError

from plumbing.metrics import AT_ONCE
from plumbing.published_store import OutboxRow, Published, record
from plumbing.publisher import Publisher, Target
from plumbing.retry import forward, wait_first
from plumbing.settings import Settings
from plumbing.unit_of_work import Unit, UnitOfWork

log = logging.getLogger(__name__)

DOWN_S = 5.0  # after a failed send, rows are left to the relay this long
CONFIRM_S = 0.5  # the cluster id read again for dispatch records at most this often
WAITING = 10_000  # most rows waiting to be sent


class AtOncePublisher:
    def __init__(
        self, target: Target, *, work: UnitOfWork, linger_s: float, grace_s: float
    ) -> None:
        self._publisher = Publisher(target)
        self._work = work
        self._linger_s = linger_s
        self.grace_s = grace_s  # what the writer stores as the row's publish_after, ahead
        self._pending: list[OutboxRow] = []
        # Dispatch records acknowledged, for which the cluster id is to be read again before
        # they may be recorded (their positions are recorded with the cluster id).
        self._unconfirmed: list[Published] = []
        self._confirmed_at = 0.0
        self._wake = asyncio.Event()
        self._running = False
        self._down_until = 0.0

    def offer(self, rows: list[OutboxRow]) -> None:
        """Send ``rows`` (committed) soon; or leave them to the relay."""
        if not rows:
            return
        if (
            not self._running
            or time.monotonic() < self._down_until
            or len(self._pending) + len(rows) > WAITING
        ):
            AT_ONCE.labels(outcome="left_to_relay").inc(len(rows))
            return
        self._pending.extend(rows)
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Send what is offered and write the records that waited, until ``stop``; then
        write the records left (what was not sent is the relay's)."""
        self._running = True
        # What wakes the loop, as one event: an offer, a stop, records given back.
        wakes = (
            forward(stop, self._wake),
            forward(self._work.published_returned, self._wake, again=True),
        )
        try:
            while not stop.is_set():
                await wait_first(self._wake, limit_s=self._wait_s())
                self._wake.clear()
                if self._pending:
                    await self._send()
                if self._unconfirmed and time.monotonic() - self._confirmed_at >= CONFIRM_S:
                    await self._confirm()
                since = self._work.published_since
                if since is not None and time.monotonic() - since >= self._linger_s:
                    await self._write()
        finally:
            for wake in wakes:
                wake.cancel()
            self._running = False
            if self._pending:
                AT_ONCE.labels(outcome="left_to_relay").inc(len(self._pending))
                self._pending = []
            if self._unconfirmed:
                await self._confirm()
            await self._write()
            await self._publisher.disconnect()

    def _wait_s(self) -> float | None:
        now = time.monotonic()
        waits = [self._confirmed_at + CONFIRM_S - now] if self._unconfirmed else []
        if self._work.published_since is not None:
            waits.append(self._work.published_since + self._linger_s - now)
        return max(min(waits), 0.0) if waits else None

    async def _send(self) -> None:
        rows, self._pending = self._pending, []
        try:
            acked = await self._publisher.publish(rows, check_cluster=False)
        except (KafkaError, OSError, TimeoutError) as exc:
            self._leave(rows, exc)
            await self._publisher.disconnect()
            return
        AT_ONCE.labels(outcome="published").inc(len(rows))
        dispatch = self._publisher.dispatch_topics
        records = [
            Published(row=r, acked=a, dispatch=r.topic in dispatch)
            for r, a in zip(rows, acked, strict=True)
        ]
        if any(r.dispatch for r in records):
            self._unconfirmed += records
        else:
            self._work.add_published(records)

    async def _confirm(self) -> None:
        """The cluster id read again after the acknowledgements: their records may be
        written (a cluster id changed meanwhile: they are left to the relay). One read for
        every dispatch record acknowledged since the last, at most every ``CONFIRM_S``."""
        records, self._unconfirmed = self._unconfirmed, []
        self._confirmed_at = time.monotonic()
        try:
            await self._publisher.same_cluster()
        except (KafkaError, OSError, TimeoutError) as exc:
            self._leave([r.row for r in records], exc)
            await self._publisher.disconnect()
            return
        self._work.add_published(records)

    def _leave(self, rows: list[OutboxRow], exc: BaseException) -> None:
        AT_ONCE.labels(outcome="left_to_relay").inc(len(rows))
        log.warning("publishing %d rows at once failed; the relay will: %r", len(rows), exc)
        self._down_until = time.monotonic() + DOWN_S

    async def _write(self) -> None:
        """The records waiting, in a statement of their own (given back if it fails)."""
        if not self._work.published_waiting:
            return
        try:
            await self._work.alone(_record_waiting)
        except (SQLAlchemyError, OSError) as exc:
            log.warning("recording rows published failed; retrying: %r", exc)
            self._wake.set()


async def _record_waiting(unit: Unit) -> None:
    await record(unit.connection, unit.take_published())


def at_once_publisher(
    settings: Settings,
    work: UnitOfWork,
    *,
    topics: dict[str, int],
    dispatch_topics: frozenset[str] = frozenset(),
) -> AtOncePublisher | None:
    """A process's ``AtOncePublisher`` for ``topics`` (None: ``publish_at_once`` is off, or there is
    no broker to publish to); where the records went waits in ``work``."""
    if not settings.publish_at_once or not settings.kafka_bootstrap_servers:
        return None
    target = Target(
        bootstrap=settings.require_kafka(),
        topics=topics,
        dispatch_topics=dispatch_topics,
        replication_factor=settings.replication_factor,
        idempotent=settings.kafka_idempotent_producer,
        send_timeout_s=settings.relay_send_timeout_s,
        linger_ms=settings.publish_at_once_linger_ms,
    )
    return AtOncePublisher(
        target,
        work=work,
        linger_s=settings.publish_mark_linger_s,
        grace_s=settings.publish_at_once_grace_s,
    )
