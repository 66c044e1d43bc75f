"""What the outbox's relay, reconciler and topic view reader read of the settings: where the
broker and the database are, the Kafka group (topics, the worker group, the broker's
abilities) and the relay's own group."""

from __future__ import annotations

from dataclasses import dataclass

from plumbing.pools import Pools
from plumbing.settings import Settings
from plumbing.settings.kafka import KafkaSettings
from plumbing.settings.relay import RelaySettings


@dataclass(frozen=True, kw_only=True)
class OutboxConfig:
    bootstrap: str
    database_url: str
    kafka: KafkaSettings
    relay: RelaySettings
    # Every topic the relay publishes to, with its partitions, and every pool's dispatch
    # topic (None: ``kafka``'s, one pool).
    pool_topics: dict[str, int] | None = None
    pool_dispatch_topics: frozenset[str] | None = None

    @property
    def topics(self) -> dict[str, int]:
        return self.pool_topics or self.kafka.topic_partitions()

    @property
    def dispatch_topics(self) -> frozenset[str]:
        return self.pool_dispatch_topics or frozenset([self.kafka.dispatch_topic])

    @classmethod
    def of(cls, settings: Settings) -> OutboxConfig:
        """Of ``settings``, a pool's (its ``kafka`` is its topic and group)."""
        pools = Pools(settings)
        return cls(
            bootstrap=settings.require_kafka(),
            database_url=settings.require_database_url(),
            kafka=settings.kafka,
            relay=settings.relay,
            pool_topics=pools.topic_partitions(),
            pool_dispatch_topics=pools.topics(),
        )
