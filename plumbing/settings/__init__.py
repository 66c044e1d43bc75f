"""One frozen settings object, built once per entry point and passed down. Its fields come
in groups by role, one class each; docs/settings.md lists them (tools/settingsdoc.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, cast

from plumbing.settings.admission import AdmissionSettings
from plumbing.settings.api import ApiSettings
from plumbing.settings.base import MissingSetting, SettingsGroup
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
    """Every setting, read from ``SLUICEGATE_*`` environment variables (flat names, as
    docs/settings.md lists them). A component is given only its group (``settings.worker``,
    ``settings.engines.llamacpp``, ...), or the few values it reads; the process entry
    points that wire components take the whole object."""

    @property
    def services(self) -> CommonSettings:
        return _group(self, CommonSettings)

    @property
    def local(self) -> LocalStackSettings:
        return _group(self, LocalStackSettings)

    @property
    def kafka(self) -> KafkaSettings:
        return _group(self, KafkaSettings)

    @property
    def api(self) -> ApiSettings:
        return _group(self, ApiSettings)

    @property
    def admission(self) -> AdmissionSettings:
        return _group(self, AdmissionSettings)

    @property
    def relay(self) -> RelaySettings:
        return _group(self, RelaySettings)

    @property
    def retention(self) -> RetentionSettings:
        return _group(self, RetentionSettings)

    @property
    def worker(self) -> WorkerSettings:
        return _group(self, WorkerSettings)

    @property
    def engines(self) -> Engines:
        return Engines(
            sim=_group(self, SimSettings),
            vllm=_group(self, VllmSettings),
            llamacpp=_group(self, LlamacppSettings),
        )

    @property
    def webhooks(self) -> WebhookSettings:
        return _group(self, WebhookSettings)


@dataclass(frozen=True, kw_only=True)
class Engines:
    """The engines' groups: a worker runs one of them (``settings.worker.engine``)."""

    sim: SimSettings
    vllm: VllmSettings
    llamacpp: LlamacppSettings


G = TypeVar("G", bound=SettingsGroup)


def _group(settings: Settings, group: type[G]) -> G:
    """``settings``' values of one group, as that group (validated already: not again, and
    not read from the environment again)."""
    values = {name: getattr(settings, name) for name in group.model_fields}
    return cast(G, group.model_construct(**values))


# The groups in the order docs/settings.md lists them.
GROUPS: tuple[type[SettingsGroup], ...] = tuple(
    base for base in Settings.__bases__ if issubclass(base, SettingsGroup)
)
