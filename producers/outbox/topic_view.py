"""The reconciler's reader of the broker's dispatch topic: the cluster id, and first, end and
worker-group committed offset per partition, as a TopicView."""

from __future__ import annotations

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from plumbing.kafka import ClusterIdReader
from plumbing.settings.kafka import KafkaSettings
from producers.lag.group_reader import GroupReader
from producers.outbox.rule import TopicView


class TopicViewReader:
    """Reads a TopicView: first and end offsets with a consumer that never joins a group, the
    worker group's commit points through the admin API (``GroupReader``)."""

    def __init__(self, bootstrap: str, kafka: KafkaSettings) -> None:
        self._kafka = kafka
        self._reader = GroupReader(bootstrap, kafka.consumer_group)
        self._cluster_ids = ClusterIdReader(bootstrap)

    async def read(self) -> TopicView:
        s = self._kafka
        consumer = await self._reader.consumer()
        parts = [TopicPartition(s.dispatch_topic, p) for p in range(s.partitions)]
        try:
            found = await self._cluster_ids.read()
            first = await consumer.beginning_offsets(parts)
            end = await consumer.end_offsets(parts)
            committed = await self._reader.committed(s.dispatch_topic, s.partitions)
        except (KafkaError, OSError):
            await self.close()
            raise
        return TopicView(
            cluster_id=found,
            first={tp.partition: o for tp, o in first.items()},
            end={tp.partition: o for tp, o in end.items()},
            exact_end=s.kafka_exact_end_offsets,
            committed=committed,
        )

    async def close(self) -> None:
        await self._reader.close()
        await self._cluster_ids.close()
