"""What the outbox's relay, reconciler and log reader read of the settings: where the
broker and the database are, the Kafka group (topics, the worker group, the broker's
abilities) and the relay's own group."""

from __future__ import annotations

from dataclasses import dataclass

from plumbing.settings import Settings
from plumbing.settings.kafka import KafkaSettings
from plumbing.settings.relay import RelaySettings


@dataclass(frozen=True, kw_only=True)
class OutboxConfig:
    bootstrap: str
    database_url: str
    kafka: KafkaSettings
    relay: RelaySettings

    @classmethod
    def of(cls, settings: Settings) -> OutboxConfig:
        return cls(
            bootstrap=settings.require_kafka(),
            database_url=settings.require_database_url(),
            kafka=settings.kafka,
            relay=settings.relay,
        )
