"""Reading the real broker from tests: a topic's records from the start, and whether a
consumer group has committed the end of a topic."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition


async def read_until(
    bootstrap: str,
    topic: str,
    enough: Callable[[list[Any]], bool],
    *,
    within_s: float = 30,
) -> list[Any]:
    """Partition 0 of ``topic`` from its start, until ``enough`` of what was read."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        found: list[Any] = []
        async with asyncio.timeout(within_s):
            while not enough(found):
                batch = await consumer.getmany(tp, timeout_ms=500)
                found += batch.get(tp, [])
        return found
    finally:
        await consumer.stop()


async def caught_up(
    bootstrap: str, group: str, topic: str, partitions: int, *, within_s: float = 60
) -> None:
    """Until ``group`` has committed the end of every partition of ``topic``."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        ends = await consumer.end_offsets(parts)
        async with asyncio.timeout(within_s):
            while True:
                committed = {tp: await consumer.committed(tp) or 0 for tp in parts}
                if all(committed[tp] >= ends[tp] for tp in parts):
                    return
                await asyncio.sleep(0.3)
    finally:
        await consumer.stop()


async def log_records(
    bootstrap: str, topic: str, partitions: int, *, within_s: float = 30
) -> tuple[dict[int, int], Counter[str]]:
    """Each partition's first offset, and the topic's records by key, read from those first
    offsets to the ends."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(parts)
        first = await consumer.beginning_offsets(parts)
        ends = await consumer.end_offsets(parts)
        for tp in parts:
            consumer.seek(tp, first[tp])
        keys: Counter[str] = Counter()
        async with asyncio.timeout(within_s):
            while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    keys.update(r.key.decode() for r in records if r.key is not None)
        return {tp.partition: first[tp] for tp in parts}, keys
    finally:
        await consumer.stop()
