"""One frozen settings object, built once per entry point and passed down. Its fields come
in groups by role, one class each; docs/settings.md lists them (tools/settingsdoc.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, cast

from pydantic import TypeAdapter, ValidationError, model_validator

from plumbing.settings.admission import AdmissionSettings
from plumbing.settings.api import ApiSettings
from plumbing.settings.base import MissingSetting, SettingsGroup
from plumbing.settings.documents import DocumentSettings
from plumbing.settings.engines import LlamacppSettings, SimSettings, VllmSettings
from plumbing.settings.kafka import KafkaSettings
from plumbing.settings.pools import PoolSettings
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
    PoolSettings,
    ApiSettings,
    AdmissionSettings,
    RelaySettings,
    RetentionSettings,
    WorkerSettings,
    SimSettings,
    VllmSettings,
    LlamacppSettings,
    WebhookSettings,
    DocumentSettings,
):
    """Every setting, read from ``SLUICEGATE_*`` environment variables (flat names, as
    docs/settings.md lists them). A component is given only its group (``settings.worker``,
    ``settings.engines.llamacpp``, ...), or the few values it reads; the process entry
    points that wire components take the whole object."""

    @model_validator(mode="before")
    @classmethod
    def _models_of_pools(cls, data: Any) -> Any:
        """With pools, the names a request may give are the pools' models."""
        if isinstance(data, dict) and data.get("pools"):
            pools = data["pools"]
            if isinstance(pools, str):
                pools = json.loads(pools)
            if isinstance(pools, dict):
                data = {**data, "models": list(pools)}
        return data

    @model_validator(mode="after")
    def _pools_name_settings(self) -> Settings:
        for model, overrides in self.pools.items():
            unknown = sorted(
                set(overrides) - set(type(self).model_fields) | set(overrides) & _NOT_PER_POOL
            )
            if unknown:
                raise ValueError(
                    f"pools: the pool of {model!r} sets {', '.join(unknown)}, which are not "
                    "settings a pool may set"
                )
        fields = type(self).model_fields
        for model, overrides in self.pools.items():  # each pool's values, checked now
            for name, value in overrides.items():
                field = fields[name]
                form: Any = field.annotation
                if field.metadata:
                    form = Annotated[form, *field.metadata]
                try:
                    TypeAdapter(form).validate_python(value)
                except ValidationError as exc:
                    message = exc.errors(include_url=False)[0]["msg"]
                    raise ValueError(f"pools: the pool of {model!r}: {name}: {message}") from None
        if self.worker_model is not None and self.pools and self.worker_model not in self.pools:
            pools = ", ".join(self.pools)
            raise ValueError(f"worker_model {self.worker_model!r} is not one of the pools: {pools}")
        return self

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
    def pool(self) -> PoolSettings:
        return _group(self, PoolSettings)

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

    @property
    def documents(self) -> DocumentSettings:
        return _group(self, DocumentSettings)


@dataclass(frozen=True, kw_only=True)
class Engines:
    """The engines' groups: a worker runs one of them (``settings.worker.engine``)."""

    sim: SimSettings
    vllm: VllmSettings
    llamacpp: LlamacppSettings


# What every pool shares: the pools themselves, the names, where the services are.
_NOT_PER_POOL = {
    "pools",
    "models",
    "worker_model",
    "database_url",
    "kafka_bootstrap_servers",  # one relay publishes every pool's topic, on one cluster
    "events_topic",
}

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
