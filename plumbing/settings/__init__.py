"""One frozen settings object, built once per entry point and passed down. Its fields come
in groups by role, one class each; docs/settings.md lists them (tools/settingsdoc.py)."""

from __future__ import annotations

from plumbing.settings.admission import AdmissionSettings
from plumbing.settings.api import ApiSettings
from plumbing.settings.base import SettingsGroup
from plumbing.settings.engines import LlamacppSettings, SimSettings, VllmSettings
from plumbing.settings.kafka import KafkaSettings
from plumbing.settings.relay import RelaySettings
from plumbing.settings.retention import RetentionSettings
from plumbing.settings.services import CommonSettings, LocalStackSettings, default_data_dir
from plumbing.settings.webhooks import WebhookSettings
from plumbing.settings.worker import WorkerSettings

__all__ = [
    "GROUPS",
    "MissingSetting",
    "Settings",
    "SettingsGroup",
    "default_data_dir",
]


class MissingSetting(RuntimeError):
    """A role started without a setting it cannot run without."""


class Settings(
    CommonSettings,
    LocalStackSettings,
    KafkaSettings,
    ApiSettings,
    AdmissionSettings,
    RelaySettings,
    RetentionSettings,
    WorkerSettings,
    SimSettings,
    VllmSettings,
    LlamacppSettings,
    WebhookSettings,
):
    """Every setting, read from ``SLUICEGATE_*`` environment variables."""

    def topic_partitions(self) -> dict[str, int]:
        return {
            self.dispatch_topic: self.partitions,
            self.events_topic: self.partitions,
            self.dead_letter_topic: 1,
        }

    def require_database_url(self) -> str:
        if not self.database_url:
            raise MissingSetting("SLUICEGATE_DATABASE_URL is not set")
        return self.database_url

    def require_kafka(self) -> str:
        if not self.kafka_bootstrap_servers:
            raise MissingSetting("SLUICEGATE_KAFKA_BOOTSTRAP_SERVERS is not set")
        return self.kafka_bootstrap_servers


# The groups in the order docs/settings.md lists them.
GROUPS: tuple[type[SettingsGroup], ...] = tuple(
    base for base in Settings.__bases__ if issubclass(base, SettingsGroup)
)
