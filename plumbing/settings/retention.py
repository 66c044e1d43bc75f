"""Settings of retention: how long what has ended is kept before the relay prunes it."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from plumbing.settings.base import SettingsGroup

DAY_S = 86_400.0


class RetentionSettings(SettingsGroup):
    """What the relay process deletes once it is past its window (`producers/retention/`),
    in batches of `prune_batch_rows`, each its own short transaction."""

    title: ClassVar[str] = "Retention"
    path: ClassVar[str] = "retention"

    retention_outbox_s: float = Field(
        default=3_600.0,
        gt=0,
        description="Outbox rows are deleted this long after the relay published them "
        "(an unpublished row is never deleted).",
    )
    retention_ended_s: float = Field(
        default=7 * DAY_S,
        gt=0,
        description="Ended jobs and their results, batches whose jobs have all ended, ended "
        "webhook deliveries with their attempts, and dead letters are deleted this long after "
        "they ended (a batch: after its deadline and its last job's end). Keep it at least "
        "as long as the events topic's retention, so that a replayed event never finds its "
        "job gone.",
    )
    prune_interval_s: float = Field(
        default=60.0, gt=0, description="How often the relay process looks for rows to prune."
    )
    prune_batch_rows: int = Field(
        default=1_000,
        ge=1,
        description="Rows one prune statement deletes at most (each in its own transaction, "
        "so no lock is held for long).",
    )
