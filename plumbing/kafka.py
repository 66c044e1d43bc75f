"""Kafka client factories and topic administration."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError, KafkaTimeoutError, TopicAlreadyExistsError
from aiokafka.protocol.admin import ApiVersionRequest

log = logging.getLogger(__name__)

# A consumer re-reads metadata this often, so a topic recreated on a restarted broker is
# picked up quickly.
METADATA_MAX_AGE_MS = 5_000
# How long closing a producer waits for the broker to acknowledge what it holds.
PRODUCER_CLOSE_GRACE_S = 5.0
LINGER_MS = 5  # how long a record waits, by default, for others to share its batch


def make_producer(
    bootstrap: str, *, idempotent: bool, linger_ms: int = LINGER_MS
) -> AIOKafkaProducer:
    """acks=all; the idempotent producer only where the broker supports it; a record waits
    up to ``linger_ms`` for others to go in its batch."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=idempotent,
        linger_ms=linger_ms,
        request_timeout_ms=10_000,
        metadata_max_age_ms=METADATA_MAX_AGE_MS,
    )


def make_consumer(
    bootstrap: str,
    *topics: str,
    group_id: str,
    fetch_bytes: int = 256 * 1024,
    group_instance_id: str | None = None,
    session_timeout_ms: int = 10_000,
) -> AIOKafkaConsumer:
    """Manual commits only: the worker commits its watermark itself. ``fetch_bytes`` bounds
    what the client prefetches per partition (and, ten times over, per fetch). With
    ``group_instance_id`` the consumer is a static member (KIP-345): it does not leave the
    group when it stops, and the same id rejoining within the session timeout takes its
    partitions back without a rebalance."""
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id=group_id,
        group_instance_id=group_instance_id,
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=min(3_000, session_timeout_ms // 3),
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


async def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Delete the topics that exist (others are ignored)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        if doomed := [t for t in topics if t in existing]:
            await admin.delete_topics(doomed)
    finally:
        await admin.close()


async def cluster_id(bootstrap: str) -> str | None:
    """The broker cluster's id, read once (a client of its own, closed after)."""
    reader = ClusterIdReader(bootstrap)
    try:
        return await reader.read()
    finally:
        await reader.close()


class ClusterIdReader:
    """Reads the broker cluster's id; a new id means a new cluster (the old records are gone).

    One admin client, started on first use and kept: a read is one DescribeCluster request
    on its connection, which follows the broker to wherever it comes back (a broker whose
    data was replaced answers with its new id). After an error the client is closed, and
    the next read starts a new one. aiokafka's producer and consumer keep no cluster id of
    their metadata, so reading it takes this request.
    """

    def __init__(self, bootstrap: str) -> None:
        self._bootstrap = bootstrap
        self._admin: AIOKafkaAdminClient | None = None

    async def read(self) -> str | None:
        if self._admin is None:
            admin = AIOKafkaAdminClient(
                bootstrap_servers=self._bootstrap, request_timeout_ms=10_000
            )
            try:
                await admin.start()
            except BaseException:
                await close_admin(admin)
                raise
            self._admin = admin
        try:
            return await described_cluster_id(self._admin)
        except (KafkaError, OSError):
            await self.close()
            raise

    async def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            await close_admin(admin)


async def close_admin(admin: AIOKafkaAdminClient) -> None:
    """Close an admin client; a failure to close is logged, not raised."""
    try:
        await admin.close()
    except (KafkaError, OSError) as exc:
        log.warning("closing a Kafka admin client: %r", exc)


async def broker_api_keys(bootstrap: str) -> set[int]:
    """The request kinds (API keys) the broker answers, from its ApiVersions."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        await client.bootstrap()
        node = next(iter(client.cluster.brokers())).nodeId
        response = await client.send(node, ApiVersionRequest())
        return {api_key for api_key, _, _ in response.api_versions}
    finally:
        await client.close()


async def described_cluster_id(admin: AIOKafkaAdminClient) -> str | None:
    """The cluster id, asked through a started admin client (one request)."""
    found = (await admin.describe_cluster()).get("cluster_id")
    return str(found) if found is not None else None


ClientT = TypeVar("ClientT", AIOKafkaConsumer, AIOKafkaProducer)


async def started(client: ClientT) -> ClientT:
    """``client`` started; one whose start failed is closed (``close_client``) first."""
    try:
        await client.start()
    except BaseException:
        await close_client(client)
        raise
    return client


async def close_client(
    client: AIOKafkaConsumer | AIOKafkaProducer, *, grace_s: float = PRODUCER_CLOSE_GRACE_S
) -> None:
    """Stop a client even while the broker is down.

    A producer's ``stop()`` waits for every record it holds to be acknowledged, and
    aiokafka's idempotent producer never expires a record (it retries until the broker takes
    it): with the broker down that wait has no end. After ``grace_s`` what the producer
    still holds is failed, unacknowledged, and the caller sends it again. aiokafka's
    consumer can leak the CancelledError of its own fetch task out of ``stop()``; that is
    swallowed here unless our task itself is being cancelled.
    """
    try:
        if isinstance(client, AIOKafkaProducer):
            await _stop_producer(client, grace_s)
        else:
            await client.stop()
    except KafkaError as exc:
        log.warning("closing a Kafka client: %r", exc)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise


async def _stop_producer(producer: AIOKafkaProducer, grace_s: float) -> None:
    stopping = asyncio.ensure_future(producer.stop())
    try:
        done, _ = await asyncio.wait([stopping], timeout=grace_s)
    except asyncio.CancelledError:
        _abandon(producer)  # its stop goes on, and ends soon, after we are gone
        raise
    if not done:
        log.warning("records not acknowledged in %.0f s: failing them", grace_s)
        _abandon(producer)
    await stopping


def _abandon(producer: AIOKafkaProducer) -> None:
    """Stop the producer's sender (its ``stop()`` then goes on to close the connections) and
    fail every record it still holds, so that nothing waits on them. aiokafka has no public
    way to give up on an idempotent producer's records (``stop()`` takes no timeout, and
    cancelling it leaves the connections open): this is the one place that reaches into
    it, held to the installed version by tests/unit/test_library_contracts.py, and aiokafka
    is pinned below its next minor."""
    task = producer._sender.sender_task
    if task is not None:
        task.cancel()
    producer._message_accumulator.fail_all(
        KafkaTimeoutError("the producer closed before the broker acknowledged it")
    )
