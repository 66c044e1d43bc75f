"""A consumer group's committed offsets and a topic's offsets, read from outside the group:
what the lag is measured from (``producers.lag``) and the reconciler's view of the dispatch
topic (``producers.outbox.topic_view``)."""

from __future__ import annotations

import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from plumbing.kafka import close_admin, close_client, started
from plumbing.retry import retriable_broker_error, retrying

log = logging.getLogger(__name__)


class GroupReader:
    """Reads a group's committed offsets through the admin API (OffsetFetch for the group's
    partitions, as ``kafka-consumer-groups.sh --describe`` reads them), and a topic's first
    and end offsets with a consumer that never joins a group. Its clients start on first
    use; after a broker error the caller closes it and the next use starts fresh ones."""

    def __init__(self, bootstrap: str, group_id: str) -> None:
        self._bootstrap = bootstrap
        self._group_id = group_id
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._coordinator: int | None = None  # the group coordinator's node, once found

    async def consumer(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            self._consumer = await started(
                AIOKafkaConsumer(
                    bootstrap_servers=self._bootstrap,
                    group_id=self._group_id,
                    enable_auto_commit=False,
                    request_timeout_ms=5_000,
                )
            )
        return self._consumer

    async def admin(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self._bootstrap, request_timeout_ms=5_000)
            try:
                await admin.start()
            except BaseException:
                await admin.close()
                raise
            self._admin = admin
        return self._admin

    async def committed(self, topic: str, partitions: int) -> dict[int, int]:
        """The group's committed offset of each partition of ``topic`` (0 where none)."""
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        admin = await self.admin()
        # The group's coordinator may be loading or not elected yet (on a new cluster, the
        # first lookup creates the offsets topic): the broker says to retry.
        found = await retrying(
            "group offsets",
            lambda: self._offsets(admin, parts),
            attempts=8,
            first_wait_s=0.05,
            max_wait_s=0.5,
            transient=retriable_broker_error,
        )
        return {tp.partition: max(found[tp].offset, 0) if tp in found else 0 for tp in parts}

    async def _offsets(
        self, admin: AIOKafkaAdminClient, parts: list[TopicPartition]
    ) -> dict[TopicPartition, Any]:
        """OffsetFetch from the group's coordinator, looked up once (a lookup asks a node
        picked with the process-wide ``random``) and again after an error."""
        try:
            if self._coordinator is None:
                self._coordinator = await admin.find_coordinator(self._group_id)
            found: dict[TopicPartition, Any] = await admin.list_consumer_group_offsets(
                self._group_id, group_coordinator_id=self._coordinator, partitions=parts
            )
            return found
        except KafkaError:
            self._coordinator = None
            raise

    async def close(self) -> None:
        self._coordinator = None
        consumer, self._consumer = self._consumer, None
        admin, self._admin = self._admin, None
        if consumer is not None:
            await close_client(consumer)
        if admin is not None:
            await close_admin(admin)
