"""Settings of the relay process: the outbox relay and the reconciler."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from plumbing.settings.base import SettingsGroup


class RelaySettings(SettingsGroup):
    """The outbox relay (`sluicegate relay`), which publishes the rows the API and workers
    wrote to the outbox, and the reconciler beside it."""

    title: ClassVar[str] = "Relay and reconciler"
    path: ClassVar[str] = "relay"

    relay_batch_size: int = Field(
        default=500, ge=1, description="Most outbox rows the relay publishes in one round."
    )
    relay_idle_poll_s: float = Field(
        default=10.0,
        gt=0,
        description="With the outbox drained, how long the relay waits for a notice of new "
        "rows before it looks again anyway (a new row's NOTIFY wakes it at once; the look "
        "is for a notice lost with its LISTEN connection).",
    )
    relay_send_timeout_s: float = Field(
        default=15.0,
        gt=0,
        description="Longest the relay waits for the broker to acknowledge a round's records.",
    )
    publish_at_once: bool = Field(
        default=True,
        description="The API publishes each job's dispatch record, and a worker each job "
        "event, as soon as its row is committed, and marks the row published in its next "
        "statement: no relay round per job. A row not published and marked within "
        "`publish_at_once_grace_s` (the broker was down, the process died) is the relay's. "
        "Off: the relay publishes every row.",
    )
    publish_at_once_grace_s: float = Field(
        default=10.0,
        gt=0,
        description="How long the relay leaves a row its writer publishes at once. A writer "
        "that publishes it and dies before it marks it makes the relay publish it again after "
        "this (a repeated record: a redelivery to a worker).",
    )
    publish_at_once_linger_ms: int = Field(
        default=20,
        ge=0,
        le=1000,
        description="How long a record published at once waits for others to share its "
        "batch to the broker (the producer's `linger.ms`). Longer: under load, larger batches "
        "and less broker CPU a record (docs/performance.md); a lone record reaches its "
        "consumers up to this much later.",
    )
    publish_mark_linger_s: float = Field(
        default=1.0,
        gt=0,
        description="Longest a row published at once waits for its writer's next statement "
        "to mark it; then the writer marks what waits in a statement of its own. Well under "
        "`publish_at_once_grace_s`.",
    )
    reconcile_interval_s: float = Field(
        default=15.0,
        gt=0,
        description="How often the reconciler (`producers/outbox/reconciler.py`) compares "
        "each job's dispatch record position with the broker's cluster id and offsets and "
        "dispatches again the jobs whose record is gone: the bound on how long such a job waits.",
    )
    reconcile_running_after_s: float = Field(
        default=900.0,
        gt=0,
        description="A running job whose record is gone is dispatched again (a new attempt "
        "that fences the old one) only once its attempt has run this long: its worker may "
        "still be decoding.",
    )
