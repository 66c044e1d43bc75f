"""The base of every settings group: one env prefix, frozen, unknown variables ignored."""

from __future__ import annotations

from typing import ClassVar

from pydantic_settings import BaseSettings, SettingsConfigDict


class SettingsGroup(BaseSettings):
    """Settings of one role, read from ``SLUICEGATE_<FIELD>`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="SLUICEGATE_", frozen=True, extra="ignore")
    # The group's heading in docs/settings.md.
    title: ClassVar[str] = ""
    # Where the group is on the whole settings object (``settings.worker``, ...).
    path: ClassVar[str] = ""


class MissingSetting(RuntimeError):
    """A role started without a setting it cannot run without."""
