"""Settings of every process: the services it talks to, logging, metrics; the local stack's."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from platformdirs import user_data_path
from pydantic import Field

from sluicegate.settings.base import SettingsGroup


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

    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL of the job store (SQLAlchemy form, e.g. "
        "`postgresql+asyncpg://user:pass@host/db`). Unset: `up` and `demo` start an embedded "
        "PostgreSQL in `data_dir`.",
    )
    kafka_bootstrap_servers: str | None = Field(
        default=None,
        description="Kafka bootstrap servers (`host:port`, comma-separated). Unset: `up` and "
        "`demo` start an embedded broker.",
    )
    log_level: str = Field(
        default="INFO",
        description="Log level of every process (a `logging` level name: `DEBUG`, `INFO`, "
        "`WARNING`, ...).",
    )
    metrics_port: int | None = Field(
        default=None,
        description="Serve Prometheus metrics of a relay or worker process on this port; "
        "the local stack gives its processes consecutive ports from it. Unset: off (the "
        "local stack gives each a free loopback port).",
    )


class LocalStackSettings(SettingsGroup):
    """What the local stack (`sluicegate up`, `demo`) and the command-line clients use."""

    title: ClassVar[str] = "Local stack and command line"

    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Where the local stack keeps its state: the embedded PostgreSQL's and "
        "broker's data, its lock and `stack.json`, its API key (`api_key`) and the models "
        "`sluicegate model pull` fetches (`models/`).",
    )
    api_key: str | None = Field(
        default=None,
        description="The API key the command-line clients (`submit`, `summarize`, ...) send. "
        "Unset: the local stack's, read from `data_dir`.",
    )
