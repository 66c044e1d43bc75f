"""One frozen settings object, built once per entry point and passed down. Its fields come
in groups by role, one class each; docs/settings.md lists them (tools/settingsdoc.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, Self, TypeVar, cast

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

    @cached_property
    def services(self) -> CommonSettings:
        return _group(self, CommonSettings)

    @cached_property
    def local(self) -> LocalStackSettings:
        return _group(self, LocalStackSettings)

    @cached_property
    def kafka(self) -> KafkaSettings:
        return _group(self, KafkaSettings)

    @cached_property
    def pool(self) -> PoolSettings:
        return _group(self, PoolSettings)

    @cached_property
    def api(self) -> ApiSettings:
        return _group(self, ApiSettings)

    @cached_property
    def admission(self) -> AdmissionSettings:
        return _group(self, AdmissionSettings)

    @cached_property
    def relay(self) -> RelaySettings:
        return _group(self, RelaySettings)

    @cached_property
    def retention(self) -> RetentionSettings:
        return _group(self, RetentionSettings)

    @cached_property
    def worker(self) -> WorkerSettings:
        return _group(self, WorkerSettings)

    @cached_property
    def engines(self) -> Engines:
        return Engines(
            sim=_group(self, SimSettings),
            vllm=_group(self, VllmSettings),
            llamacpp=_group(self, LlamacppSettings),
        )

    @cached_property
    def webhooks(self) -> WebhookSettings:
        return _group(self, WebhookSettings)

    @cached_property
    def documents(self) -> DocumentSettings:
        return _group(self, DocumentSettings)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; with ``update``, its groups are made again from its own values (the ones
        made of this object's, kept in its ``__dict__``, are not copied)."""
        copied = super().model_copy(update=update, deep=deep)
        for name in _GROUP_PROPERTIES:
            copied.__dict__.pop(name, None)
        return copied


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

# Settings' groups: each made once, on first use (``functools.cached_property``).
_GROUP_PROPERTIES = tuple(
    name for name, value in vars(Settings).items() if isinstance(value, cached_property)
)


def _group(settings: Settings, group: type[G]) -> G:
    """``settings``' values of one group, as that group (validated already: not again, and
    not read from the environment again). Settings is frozen: made once, it stays true."""
    values = {name: getattr(settings, name) for name in group.model_fields}
    return cast(G, group.model_construct(**values))


# The groups in the order docs/settings.md lists them.
GROUPS: tuple[type[SettingsGroup], ...] = tuple(
    base for base in Settings.__bases__ if issubclass(base, SettingsGroup)
)
