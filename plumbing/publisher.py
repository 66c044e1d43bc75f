"""Publishing outbox rows to the broker, with the cluster they went to: the relay's rounds
and the rows the API and workers publish at once (``plumbing.publish_at_once``) go out
through one.

Records are published with the id of the broker cluster they went to, read when the
producer connected and read again once a batch with dispatch records is acknowledged. A
producer reconnects by itself to a broker that came back empty (the embedded one keeps its
log in memory) with a new cluster id; recorded against the old id, every record it then
published would look gone to the reconciler, which would send it again pass after pass. A
batch whose id changed fails, and a new producer publishes it again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from plumbing.kafka import (
    LINGER_MS,
    ClusterIdReader,
    close_client,
    ensure_topics,
    make_producer,
    started,
)
from plumbing.published_store import Acked, OutboxRow


class ClusterReplaced(KafkaError):  # type: ignore[misc]
    """The broker's cluster id changed since the producer connected: the records of the
    cluster it knew are gone, and where a batch's records went is not known for sure."""


@dataclass(frozen=True, kw_only=True)
class Target:
    """Where and how to publish: the topics (created first, with their partitions), which
    of them carry dispatch records, and the producer's settings."""

    bootstrap: str
    topics: dict[str, int]
    dispatch_topics: frozenset[str]
    replication_factor: int = 1
    idempotent: bool = True
    send_timeout_s: float = 15.0
    linger_ms: int = LINGER_MS


class Publisher:
    def __init__(self, target: Target) -> None:
        self._target = target
        self._producer: AIOKafkaProducer | None = None
        self._cluster: ClusterIdReader | None = None
        self._cluster_id: str | None = None  # the broker cluster's id the records go to

    async def connect(self) -> AIOKafkaProducer:
        """Topics first, then a producer: a producer that sends to a missing topic makes the
        broker auto-create it (aiokafka always allows that), with the broker's defaults."""
        if self._producer is None:
            t = self._target
            await ensure_topics(t.bootstrap, t.topics, replication_factor=t.replication_factor)
            self._cluster = ClusterIdReader(t.bootstrap)
            self._cluster_id = await self._cluster.read()
            self._producer = await started(
                make_producer(t.bootstrap, idempotent=t.idempotent, linger_ms=t.linger_ms)
            )
        return self._producer

    async def disconnect(self) -> None:
        """Drop the producer and whatever it still holds: after an outage, nothing may be
        sent before the topics are known to exist again."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await close_client(producer)
        cluster, self._cluster = self._cluster, None
        if cluster is not None:
            await cluster.close()

    async def publish(self, rows: list[OutboxRow], *, check_cluster: bool = True) -> list[Acked]:
        """Send ``rows`` in order and wait for every acknowledgement (``send_timeout_s``).
        ``check_cluster``: then read the cluster id again if they hold dispatch records
        (without it, the caller must call ``same_cluster`` before it records their
        positions)."""
        producer = await self.connect()
        async with asyncio.timeout(self._target.send_timeout_s):
            futures = [
                await producer.send(row.topic, row.payload, key=row.key.encode()) for row in rows
            ]
            metadata = await asyncio.gather(*futures)
            if check_cluster and self.dispatches(rows):
                await self.same_cluster()  # their positions are recorded with the cluster id
        return [
            Acked(
                topic=m.topic, partition=m.partition, offset=m.offset, cluster_id=self._cluster_id
            )
            for m in metadata
        ]

    @property
    def dispatch_topics(self) -> frozenset[str]:
        return self._target.dispatch_topics

    def dispatches(self, rows: list[OutboxRow]) -> bool:
        return any(row.topic in self._target.dispatch_topics for row in rows)

    async def same_cluster(self) -> None:
        """Raise ClusterReplaced unless the broker still has the cluster id read at connect
        (a broker of a new id acknowledged the batch, or may have)."""
        if self._cluster is None:
            raise ClusterReplaced("not connected")
        found = await self._cluster.read()
        if found != self._cluster_id:
            raise ClusterReplaced(
                f"the broker's cluster id changed ({self._cluster_id} -> {found})"
            )
