"""Which broker the local stack starts: Apache Kafka where it has been pulled and Java 17 or
newer runs, else Tansu, and why (``broker = "auto"``); or the one the user named."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from plumbing.settings import Settings
from sluicegate.local.broker import dist
from sluicegate.local.broker.apache import ApacheKafka
from sluicegate.local.broker.base import Broker, BrokerKind
from sluicegate.local.broker.tansu import TansuBroker


@dataclass(frozen=True, kw_only=True)
class Choice:
    kind: BrokerKind
    java: dist.Java | None = None
    why: str | None = None  # why Apache Kafka is not used, where "auto" fell back to Tansu


def home_of(settings: Settings) -> Path:
    return settings.kafka_home or dist.kafka_home(settings.data_dir)


def choose(settings: Settings, requested: str, *, java_home: str | None) -> Choice:
    """``requested`` is "auto", "kafka" or "tansu"; "kafka" raises ``KafkaUnavailable`` (with
    its code) where Apache Kafka cannot run, "auto" falls back to Tansu and says why."""
    if requested == "tansu":
        return Choice(kind="tansu")
    try:
        java = dist.find_java(java_home=java_home)
        if not dist.is_pulled(home := home_of(settings)):
            raise dist.NotPulled(
                f"Apache Kafka {dist.KAFKA_VERSION} has not been pulled into {home} "
                "(`sluicegate kafka pull` fetches it)"
            )
    except dist.KafkaUnavailable as exc:
        if requested == "kafka":
            raise
        return Choice(kind="tansu", why=f"{exc.code}: {exc}")
    return Choice(kind="kafka", java=java)


def make_broker(choice: Choice, settings: Settings) -> Broker:
    """The broker of ``choice``, its files and log in the data directory."""
    data_dir = settings.data_dir
    if choice.kind == "tansu":
        return TansuBroker(log_path=data_dir / "broker.log")
    assert choice.java is not None
    return ApacheKafka(
        root=data_dir / "kafka",
        home=home_of(settings),
        java=choice.java,
        heap_mb=settings.kafka_heap_mb,
        log_path=data_dir / "broker.log",
    )
