"""Kafka settings: topics, the worker group, and what the broker supports."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from plumbing.settings.base import SettingsGroup
from schemas import constants


class KafkaSettings(SettingsGroup):
    """The topics and consumer group the pipeline uses, and the broker's abilities (Apache
    Kafka has them all; the Tansu fallback broker lacks some: `sluicegate up` sets these
    for its processes when it runs on Tansu)."""

    title: ClassVar[str] = "Kafka"
    path: ClassVar[str] = "kafka"

    dispatch_topic: str = Field(
        default=constants.DISPATCH_TOPIC,
        description="Topic of dispatch records (one per job attempt), written to the outbox, "
        "published by the API at once (`publish_at_once`) or by the relay, and consumed by the "
        "workers.",
    )
    events_topic: str = Field(
        default=constants.EVENTS_TOPIC,
        description="Topic of job state-change events, written to the outbox with each change, "
        "published by their writer at once (`publish_at_once`) or by the relay, and consumed "
        "by the webhook dispatcher.",
    )
    dead_letter_topic: str = Field(
        default=constants.DEAD_LETTER_TOPIC,
        description="Topic of records that could not be processed (poison records, "
        "undeliverable webhooks); one partition.",
    )
    consumer_group: str = Field(
        default=constants.WORKER_GROUP,
        description="The workers' consumer group on the dispatch topic (the API and the "
        "reconciler read its committed offsets for the lag).",
    )
    partitions: int = Field(
        default=4,
        ge=1,
        description="Partitions of the dispatch and events topics when they are created.",
    )
    replication_factor: int = Field(
        default=1, ge=1, description="Replication factor of the topics when they are created."
    )
    kafka_idempotent_producer: bool = Field(
        default=True,
        description="Use the idempotent producer. Apache Kafka supports it; the Tansu "
        "fallback broker does not (`sluicegate up` turns it off on Tansu).",
    )
    kafka_exact_end_offsets: bool = Field(
        default=True,
        description="Whether the broker's ListOffsets end is exact (the high watermark of "
        "acknowledged records), as Apache Kafka's is; Tansu's can trail by a record batch. "
        "Off, the reconciler does not take a record at or past the end for a lost one.",
    )

    def topic_partitions(self) -> dict[str, int]:
        """The topics the pipeline uses, with their partitions."""
        return {
            self.dispatch_topic: self.partitions,
            self.events_topic: self.partitions,
            self.dead_letter_topic: 1,
        }
