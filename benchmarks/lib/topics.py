"""The topics read back with a consumer of their own: every record from given offsets until
nothing more comes (records and payload bytes by topic), and the terminal events per job
on the events topic."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from benchmarks.lib.stack import TERMINAL
from plumbing.settings import Settings
from schemas.envelopes import JobEvent


@dataclass
class Reading:
    positions: dict[TopicPartition, int]  # the next offset after the last record read
    watermarks: dict[TopicPartition, int]
    counters: dict[str, float]


async def read_topics(
    bootstrap: str,
    topics: dict[str, tuple[str, int]],
    start: dict[TopicPartition, int],
    quiet_s: float = 2.0,
) -> Reading:
    """Every record from ``start`` (0 where not given) until nothing more comes for
    ``quiet_s``: records and payload bytes by topic (``topics``: label -> (name,
    partitions))."""
    label_of = {name: label for label, (name, _) in topics.items()}
    tps = [TopicPartition(name, p) for name, count in topics.values() for p in range(count)]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    counters: dict[str, float] = {
        f"kafka.{k}.{t}": 0.0 for k in ("records", "bytes") for t in topics
    }
    positions = {tp: start.get(tp, 0) for tp in tps}
    try:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, positions[tp])
        watermarks = await consumer.end_offsets(tps)
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < quiet_s:
            batch = await consumer.getmany(timeout_ms=300)
            behind = [tp for tp in tps if await consumer.position(tp) < watermarks[tp]]
            if batch or behind:
                quiet_since = time.monotonic()
            for tp, records in batch.items():
                label = label_of[tp.topic]
                for record in records:
                    counters[f"kafka.records.{label}"] += 1
                    counters[f"kafka.bytes.{label}"] += record_bytes(record)
                    positions[tp] = record.offset + 1
    finally:
        await consumer.stop()
    return Reading(positions, dict(watermarks), counters)


def record_bytes(record: Any) -> int:
    headers = sum(len(k.encode()) + len(v or b"") for k, v in record.headers or ())
    return len(record.key or b"") + len(record.value or b"") + headers


def watermark_growth(
    before: dict[TopicPartition, int], after: dict[TopicPartition, int], topics: dict[str, str]
) -> dict[str, int]:
    return {
        label: sum(after[tp] - before.get(tp, 0) for tp in after if tp.topic == name)
        for label, name in topics.items()
    }


def terminal_event(payload: bytes) -> bool:
    try:
        event = JobEvent.model_validate_json(payload)
    except ValueError:
        return False  # a dispatch record
    return event.state.value in TERMINAL


async def events_on_topic(settings: Settings, accepted: set[str]) -> dict[str, int]:
    """Terminal events per job on the events topic, read from its start."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.require_kafka(), enable_auto_commit=False
    )
    await consumer.start()
    try:
        count = settings.topic_partitions()[settings.events_topic]
        partitions = [TopicPartition(settings.events_topic, p) for p in range(count)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        ends_by_job: Counter[str] = Counter()
        records = 0
        quiet_since = time.monotonic()
        # To the end offsets, then until nothing more comes for 3 s (the embedded broker's
        # reported end can trail the last batch).
        while time.monotonic() - quiet_since < 3.0:
            batch = await consumer.getmany(timeout_ms=500)
            got = [record for chunk in batch.values() for record in chunk]
            behind = [tp for tp in partitions if await consumer.position(tp) < ends[tp]]
            if got or behind:
                quiet_since = time.monotonic()
            for record in got:
                records += 1
                if record.value is not None and terminal_event(record.value):
                    key = record.key.decode() if record.key else "?"
                    if key in accepted:
                        ends_by_job[key] += 1
    finally:
        await consumer.stop()
    return {
        "records": records,
        "jobs_with_terminal_event": len(ends_by_job),
        "duplicated_on_topic": sum(1 for n in ends_by_job.values() if n > 1),
    }
