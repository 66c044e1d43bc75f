"""Outbox rows published at once by the writer that committed them (the API its jobs'
dispatch records, a worker its job events), and marked in that writer's next statement.

The relay publishes a row in a round of its own: a lock, a send, a mark and a commit, per
job at a low rate. Here the writer hands the rows it just committed to ``offer``; a task
sends them, and their marks (``plumbing.mark_store``) wait in ``take`` for the writer's
next statement, which gives them back with ``restore`` if it fails. Marks that waited
``linger_s`` are written by ``flush``, in a statement of their own.

Such a row is stored with ``publish_after`` ``grace_s`` ahead: until then the relay leaves
it alone. A row not sent (the broker down, too many waiting, the process stopping) or not
marked by then is the relay's, which publishes it again if it was sent: a repeated record,
which a worker takes as a redelivery and the webhook dispatcher as the same event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka.errors import KafkaError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.mark_store import Mark, OutboxRow, marker
from plumbing.metrics import AT_ONCE
from plumbing.publisher import Publisher, Target
from plumbing.retry import wait_first
from plumbing.settings import Settings

log = logging.getLogger(__name__)

Flush = Callable[[list[Mark]], Awaitable[None]]

DOWN_S = 5.0  # after a failed send, rows are left to the relay this long
CONFIRM_S = 0.5  # dispatch records' log read again at most this often
WAITING = 10_000  # most rows waiting to be sent


class AtOnce:
    def __init__(self, target: Target, *, flush: Flush, linger_s: float, grace_s: float) -> None:
        self._publisher = Publisher(target)
        self._flush = flush
        self._linger_s = linger_s
        self.grace_s = grace_s  # what the writer stores as the row's publish_after, ahead
        self._pending: list[OutboxRow] = []
        self._marks: list[Mark] = []
        # Dispatch records acknowledged, whose log is to be read again before their marks
        # may be written (their positions are recorded with the log).
        self._unconfirmed: list[Mark] = []
        self._confirmed_at = 0.0
        self._since: float | None = None  # when the oldest waiting mark was made
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

    @property
    def marks_waiting(self) -> int:
        return len(self._marks)

    def take(self) -> list[Mark]:
        """The marks waiting for a statement; the caller's statement writes them."""
        marks, self._marks, self._since = self._marks, [], None
        return marks

    def restore(self, marks: list[Mark]) -> None:
        """``marks`` taken by a statement that failed: they wait again."""
        if marks:
            self._marks[:0] = marks
            self._since = self._since or time.monotonic()
            self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Send what is offered and write the marks that waited, until ``stop``; then write
        the marks left (what was not sent is the relay's)."""
        self._running = True
        try:
            while not stop.is_set():
                await wait_first(stop, self._wake, limit_s=self._wait_s())
                self._wake.clear()
                if self._pending:
                    await self._send()
                if self._unconfirmed and time.monotonic() - self._confirmed_at >= CONFIRM_S:
                    await self._confirm()
                if self._since is not None and time.monotonic() - self._since >= self._linger_s:
                    await self._write()
        finally:
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
        if self._since is not None:
            waits.append(self._since + self._linger_s - now)
        return max(min(waits), 0.0) if waits else None

    async def _send(self) -> None:
        rows, self._pending = self._pending, []
        try:
            acked = await self._publisher.publish(rows, check_log=False)
        except (KafkaError, OSError, TimeoutError) as exc:
            self._leave(rows, exc)
            await self._publisher.disconnect()
            return
        AT_ONCE.labels(outcome="published").inc(len(rows))
        marks = [Mark(row=r, acked=a) for r, a in zip(rows, acked, strict=True)]
        if self._publisher.dispatches(rows):
            self._unconfirmed += marks
        else:
            self._marks += marks
            self._since = self._since or time.monotonic()

    async def _confirm(self) -> None:
        """The log read again after the acknowledgements: their marks may be written (a
        log replaced meanwhile: they are left to the relay). One read for every dispatch
        record acknowledged since the last, at most every ``CONFIRM_S``."""
        marks, self._unconfirmed = self._unconfirmed, []
        self._confirmed_at = time.monotonic()
        try:
            await self._publisher.same_log()
        except (KafkaError, OSError, TimeoutError) as exc:
            self._leave([m.row for m in marks], exc)
            await self._publisher.disconnect()
            return
        self._marks += marks
        self._since = self._since or time.monotonic()

    def _leave(self, rows: list[OutboxRow], exc: BaseException) -> None:
        AT_ONCE.labels(outcome="left_to_relay").inc(len(rows))
        log.warning("publishing %d rows at once failed; the relay will: %r", len(rows), exc)
        self._down_until = time.monotonic() + DOWN_S

    async def _write(self) -> None:
        marks = self.take()
        if not marks:
            return
        try:
            await self._flush(marks)
        except (SQLAlchemyError, OSError) as exc:
            log.warning("marking %d rows published failed; retrying: %r", len(marks), exc)
            self.restore(marks)


def at_once_of(
    settings: Settings,
    engine: AsyncEngine,
    *,
    topics: dict[str, int],
    dispatch_topics: frozenset[str] = frozenset(),
) -> AtOnce | None:
    """A process's ``AtOnce`` for ``topics`` (None: ``publish_at_once`` is off, or there is
    no broker to publish to); its marks' own statements go through ``engine``."""
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
    return AtOnce(
        target,
        flush=marker(engine, dispatch_topics),
        linger_s=settings.publish_mark_linger_s,
        grace_s=settings.publish_at_once_grace_s,
    )
