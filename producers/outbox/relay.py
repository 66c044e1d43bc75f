"""The outbox relay: the writer of the outbox rows nobody published at once. Several may run
at once: each publishes the rows it locked, and each key's rows in their order
(``OutboxStore``).

It wakes on the outbox trigger's NOTIFY (with a slow fallback poll), publishes unpublished
rows in id order, waits for the broker's acknowledgement of every record, and only then marks
the rows published. A crash between the two re-publishes; workers treat a repeated dispatch
record as a redelivery, never as a second job. A row the API or a worker publishes at once
(``plumbing.publish_at_once``) is the relay's only once its ``publish_after`` has passed:
when it was not published and recorded by then. Where records went, with their cluster id:
``plumbing.publisher``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from plumbing.db import libpq_url
from plumbing.published_store import Acked, OutboxRow
from plumbing.publisher import Publisher, Target
from plumbing.retry import Stopped, outage, retrying, wait_first
from producers.metrics import RELAY_PUBLISHED
from producers.outbox.config import OutboxConfig
from producers.outbox.repository import OutboxStore, RelayRound
from schemas import constants

log = logging.getLogger(__name__)

DEFERRED_RETRY_S = 0.02


class OutboxRelay:
    def __init__(self, config: OutboxConfig, store: OutboxStore) -> None:
        self._config = config
        self._store = store
        self._publisher = Publisher(
            Target(
                bootstrap=config.bootstrap,
                topics=config.topics,
                dispatch_topics=config.dispatch_topics,
                replication_factor=config.kafka.replication_factor,
                idempotent=config.kafka.kafka_idempotent_producer,
                send_timeout_s=config.relay.relay_send_timeout_s,
            )
        )
        self._wake = asyncio.Event()
        self._listener: asyncpg.Connection | None = None

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                await self._listen()
                self._wake.clear()
                try:
                    done = await retrying("relay_round", self._round, stop=stop, transient=outage)
                except Stopped:
                    break
                if done.deferred:  # another relay is publishing their keys' earlier rows
                    await wait_first(stop, limit_s=DEFERRED_RETRY_S)
                elif done.published < self._config.relay.relay_batch_size:
                    await wait_first(stop, self._wake, limit_s=self._config.relay.relay_idle_poll_s)
        finally:
            await self._publisher.disconnect()
            await self._unlisten()

    async def _round(self) -> RelayRound:
        """Publish one batch of rows. A failed round drops the producer: after an outage,
        nothing may be sent before the topics are known to exist again."""
        try:
            await self._publisher.connect()
            return await self._store.publish_batch(
                self._config.relay.relay_batch_size, self._publish
            )
        except BaseException as exc:
            if outage(exc) is not None:
                await self._publisher.disconnect()
            raise

    async def _publish(self, rows: list[OutboxRow]) -> list[Acked]:
        acked = await self._publisher.publish(rows)
        for row in rows:
            RELAY_PUBLISHED.labels(topic=row.topic).inc()
        return acked

    async def _listen(self) -> None:
        if self._listener is not None and not self._listener.is_closed():
            return
        try:
            self._listener = await asyncpg.connect(libpq_url(self._config.database_url), timeout=5)
            await self._listener.add_listener(constants.OUTBOX_CHANNEL, self._notified)
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            log.warning("relay: LISTEN unavailable, polling: %r", exc)
            self._listener = None
        else:
            self._wake.set()  # rows may have arrived while we were not listening

    async def _unlisten(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close(timeout=2)
            self._listener = None

    def _notified(self, *_: object) -> None:
        self._wake.set()
