"""Ids of a graph's parts: UUIDv7, like every job's, so a document's parts sort after it; and
each drawn so that its dispatch record lands on the partition its place calls for.

A record's partition is its key's (the job id's) murmur2 hash, as the relay's producer
partitions it (aiokafka's ``DefaultPartitioner``, Apache Kafka's Java default too). Left to
chance, a document's chunks spread unevenly over the partitions and the busiest worker set
the map's time (docs/performance.md); drawn in turn, each partition gets its share. A draw
takes ``partitions`` tries on average (uuid7 and a hash each: microseconds)."""

from __future__ import annotations

import uuid_utils
from aiokafka.partitioner import DefaultPartitioner

_PARTITIONER = DefaultPartitioner()
MAX_DRAWS = 10_000  # never reached with a sane partition count; then any id will do


def partition_of(job_id: str, partitions: int) -> int:
    """The partition the producer puts the record keyed ``job_id`` on."""
    every = list(range(partitions))
    return int(_PARTITIONER(job_id.encode(), every, every))


def new_id(partition: int | None = None, partitions: int = 0) -> str:
    """A new job id; with ``partitions``, one whose record lands on ``partition``."""
    job_id = str(uuid_utils.uuid7())
    if partition is None or partitions <= 1:
        return job_id
    for _ in range(MAX_DRAWS):
        if partition_of(job_id, partitions) == partition % partitions:
            break
        job_id = str(uuid_utils.uuid7())
    return job_id
