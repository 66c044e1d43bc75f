"""The outbox relay: the only writer to the dispatch topic. Several may run at once: each
publishes the rows it locked, and each key's rows in their order (``OutboxStore``).

It wakes on the outbox trigger's NOTIFY (with a slow fallback poll), publishes unpublished
rows in id order, waits for the broker's acknowledgement of every record, and only then marks
the rows published. A crash between the two re-publishes; workers treat a repeated dispatch
record as a redelivery, never as a second job.

Dispatch records are recorded with the log they went to: the broker cluster's id, read when
the producer connected and read again once a round with dispatch records is acknowledged.
A producer reconnects by itself to a broker that came back empty (the embedded one keeps
its log in memory) with a new id; recorded against the old log, every record it then
published would look gone to the reconciler, which would send it again pass after pass. A
round whose id changed fails, and a new producer publishes it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from plumbing.aio import wait_first
from plumbing.db import libpq_url
from plumbing.kafka import close_client, described_cluster_id, ensure_topics, make_producer
from plumbing.retry import Stopped, outage, retrying
from producers.metrics import RELAY_PUBLISHED
from producers.outbox.config import OutboxConfig
from producers.outbox.repository import Acked, OutboxRow, OutboxStore, Round
from schemas import constants

log = logging.getLogger(__name__)

DEFERRED_RETRY_S = 0.02


class LogReplaced(KafkaError):  # type: ignore[misc]
    """The broker's cluster id changed since the producer connected: the log it knew is
    gone, and where a round's records went is not known for sure."""


class OutboxRelay:
    def __init__(self, config: OutboxConfig, store: OutboxStore) -> None:
        self._config = config
        self._store = store
        self._producer: AIOKafkaProducer | None = None
        self._admin: AIOKafkaAdminClient | None = None  # reads the cluster id
        self._wake = asyncio.Event()
        self._listener: asyncpg.Connection | None = None
        self._log: str | None = None  # the broker cluster's id: which log the records go to

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
            await self._disconnect()
            await self._unlisten()

    async def _round(self) -> Round:
        """Publish one batch of rows. A failed round drops the producer: after an outage,
        nothing may be sent before the topics are known to exist again."""
        try:
            await self._connect()
            return await self._store.publish_batch(
                self._config.relay.relay_batch_size, self._publish
            )
        except BaseException as exc:
            if outage(exc) is not None:
                await self._disconnect()
            raise

    async def _connect(self) -> AIOKafkaProducer:
        """Topics first, then a producer: a producer that sends to a missing topic makes the
        broker auto-create it (aiokafka always allows that), with the broker's defaults."""
        if self._producer is None:
            c = self._config
            await ensure_topics(
                c.bootstrap,
                c.topics,
                replication_factor=c.kafka.replication_factor,
            )
            admin = AIOKafkaAdminClient(bootstrap_servers=c.bootstrap, request_timeout_ms=10_000)
            self._admin = admin
            await admin.start()
            self._log = await described_cluster_id(admin)
            producer = make_producer(c.bootstrap, idempotent=c.kafka.kafka_idempotent_producer)
            try:
                await producer.start()
            except BaseException:
                await close_client(producer)
                raise
            self._producer = producer
        return self._producer

    async def _disconnect(self) -> None:
        """Drop the producer and whatever it still holds: after an outage, nothing may be
        sent before the topics are known to exist again."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await close_client(producer)
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(KafkaError, OSError):
                await admin.close()

    async def _publish(self, rows: list[OutboxRow]) -> list[Acked]:
        producer = await self._connect()
        async with asyncio.timeout(self._config.relay.relay_send_timeout_s):
            futures = [
                await producer.send(row.topic, row.payload, key=row.key.encode()) for row in rows
            ]
            metadata = await asyncio.gather(*futures)
            if any(row.topic in self._config.dispatch_topics for row in rows):
                await self._same_log()  # their positions are recorded with the log
        for row in rows:
            RELAY_PUBLISHED.labels(topic=row.topic).inc()
        return [
            Acked(topic=m.topic, partition=m.partition, offset=m.offset, log=self._log)
            for m in metadata
        ]

    async def _same_log(self) -> None:
        """Raise LogReplaced unless the broker still has the cluster id read at connect
        (a broker of a new id acknowledged the round, or may have)."""
        if self._admin is None:
            raise LogReplaced("not connected")
        found = await described_cluster_id(self._admin)
        if found != self._log:
            raise LogReplaced(f"the broker's log was replaced ({self._log} -> {found})")

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
