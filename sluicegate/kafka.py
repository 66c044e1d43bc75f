"""Kafka client factories and topic administration."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

log = logging.getLogger(__name__)

# A consumer re-reads metadata this often, so a topic recreated on a restarted broker is
# picked up quickly.
METADATA_MAX_AGE_MS = 5_000


def make_producer(bootstrap: str, *, idempotent: bool) -> AIOKafkaProducer:
    """acks=all; the idempotent producer only where the broker supports it."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=idempotent,
        linger_ms=5,
        request_timeout_ms=10_000,
        metadata_max_age_ms=METADATA_MAX_AGE_MS,
    )


def make_consumer(
    bootstrap: str, *topics: str, group_id: str, fetch_bytes: int = 256 * 1024
) -> AIOKafkaConsumer:
    """Manual commits only: the worker commits its watermark itself. ``fetch_bytes`` bounds
    what the client prefetches per partition (and, ten times over, per fetch)."""
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        metadata_max_age_ms=METADATA_MAX_AGE_MS,
        max_partition_fetch_bytes=fetch_bytes,
        fetch_max_bytes=10 * fetch_bytes,
    )


async def ensure_topics(
    bootstrap: str, topics: dict[str, int], *, replication_factor: int = 1
) -> None:
    """Create the topics that do not exist yet (idempotent)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [
            NewTopic(name, num_partitions=partitions, replication_factor=replication_factor)
            for name, partitions in topics.items()
            if name not in existing
        ]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(missing)
    finally:
        await admin.close()


async def cluster_id(bootstrap: str) -> str | None:
    """The broker cluster's id; a new id means a new log (the old records are gone)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        return await described_cluster_id(admin)
    finally:
        await admin.close()


async def described_cluster_id(admin: AIOKafkaAdminClient) -> str | None:
    """The cluster id, asked through a started admin client (one request)."""
    found = (await admin.describe_cluster()).get("cluster_id")
    return str(found) if found is not None else None


async def close_client(client: AIOKafkaConsumer | AIOKafkaProducer) -> None:
    """Stop a client even while the broker is down.

    aiokafka's consumer can leak the CancelledError of its own fetch task out of ``stop()``;
    that is swallowed here unless our task itself is being cancelled.
    """
    try:
        await client.stop()
    except KafkaError as exc:
        log.warning("closing a Kafka client: %r", exc)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise


class GroupReader:
    """A consumer with a group's id that never joins the group: it reads the group's
    committed offsets and the topic's first and end offsets. Started on first use; after a
    broker error the caller closes it and the next use starts a fresh one."""

    def __init__(self, bootstrap: str, group_id: str) -> None:
        self._bootstrap = bootstrap
        self._group_id = group_id
        self._consumer: AIOKafkaConsumer | None = None

    async def consumer(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self._bootstrap,
                group_id=self._group_id,
                enable_auto_commit=False,
                request_timeout_ms=5_000,
            )
            try:
                await consumer.start()
            except BaseException:
                await close_client(consumer)
                raise
            self._consumer = consumer
        return self._consumer

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await close_client(consumer)
