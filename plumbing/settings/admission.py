"""Settings of admission control: the lag it reads, its thresholds, its refusals' hints."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from plumbing.settings.base import SettingsGroup


class AdmissionSettings(SettingsGroup):
    """How the API decides, before storing anything, to accept a submit, make it wait or
    refuse it (docs/operations.md derives the defaults from Little's law)."""

    title: ClassVar[str] = "Admission"
    path: ClassVar[str] = "admission"

    lag_interval_s: float = Field(
        default=0.5, gt=0, description="How often the API reads the worker group's lag."
    )
    lag_stale_after_s: float = Field(
        default=5.0,
        gt=0,
        description="A lag reading older than this is unknown, and unknown counts as full "
        "(503 `lag_unknown`).",
    )
    lag_reader: Literal["shared", "own"] = Field(
        default="shared",
        description="`shared`: one API replica reads the lag from the broker (the one holding "
        "a PostgreSQL advisory lock) and stores each reading in `lag_readings`, which the other "
        "replicas read instead; a reader that dies is replaced within an interval. `own`: every "
        "replica reads the broker itself.",
    )
    lag_measure: Literal["open", "consumer"] = Field(
        default="open",
        description="What the thresholds compare: `open`, the records past the worker "
        "group's committed offset whose job has not ended (PostgreSQL knows each job's "
        "dispatch position); or `consumer`, the plain consumer lag (end - committed). A worker "
        "runs many jobs of a partition at once and commits only up to its oldest running one, "
        "so the consumer lag also counts records of jobs that already ended.",
    )
    lag_soft: int = Field(
        default=2000,
        ge=0,
        description="From this lag a normal-priority submit waits (`admission_mode=block`) "
        "or is refused (`reject`); low priority is refused from it.",
    )
    lag_hard: int = Field(
        default=4000,
        ge=1,
        description="From this lag a submit is refused at once (429 `lag_hard`); high "
        "priority is admitted up to it without waiting.",
    )
    admission_mode: Literal["block", "reject"] = Field(
        default="block",
        description="Between `lag_soft` and `lag_hard`: `block` makes the request wait (up "
        "to `max_block_ms`) for the lag to fall; `reject` refuses it at once (429 "
        "`lag_soft`).",
    )
    max_block_ms: int = Field(
        default=5000,
        ge=0,
        description="Longest a blocked request waits for the lag to fall before it is "
        "refused (429 `block_timeout`).",
    )
    max_blocked: int = Field(
        default=64,
        ge=0,
        description="Most requests blocked at once; the next one is refused at once (429 "
        "`too_many_blocked`).",
    )
    admission_hysteresis: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="Leave the throttled state only once the lag falls below "
        "`lag_soft * (1 - admission_hysteresis)`.",
    )
    low_priority_factor: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Low-priority jobs block from `lag_soft * low_priority_factor` and are "
        "refused at `lag_soft`.",
    )
    deadline_aware: bool = Field(
        default=True,
        description="Refuse at once (429 `deadline_unreachable`) a job whose predicted queue "
        "wait plus service time passes its deadline.",
    )
    deadline_speed: Literal["measured", "static"] = Field(
        default="measured",
        description="The service time deadline-aware admission predicts is max_tokens x "
        "seconds per output token: with `measured`, the median of the jobs that succeeded in "
        "the last minute (started to finished over tokens decoded, prefill included) once "
        "`speed_min_samples` of them ended; until then, and with `static`, "
        "`expected_token_time_s`.",
    )
    expected_token_time_s: float = Field(
        default=0.02,
        ge=0,
        description="Seconds per output token assumed before the speed is measured (and "
        "always with `deadline_speed=static`).",
    )
    retry_after_min_s: float = Field(
        default=1.0, gt=0, description="Shortest `Retry-After` a refusal hands out."
    )
    retry_after_max_s: float = Field(
        default=60.0,
        gt=0,
        description="Longest `Retry-After` a refusal hands out; also the hint when nothing "
        "is known to drain the lag or no worker takes jobs.",
    )
    no_worker_after_s: float = Field(
        default=10.0,
        gt=0,
        description="A refusal for lag says that no worker consumes when the backlog has not "
        "moved for this long and no job is running.",
    )
    batch_fill: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="A batch is accepted whole and held in PostgreSQL; its jobs are released "
        "into the dispatch topic while the backlog is under `lag_soft` and the batches' own "
        "released jobs are under `lag_soft * batch_fill`. The rest of the room under "
        "`lag_soft` stays free for single submits, which are admitted beside a running batch.",
    )
    tenant_rpm: int | None = Field(
        default=None,
        ge=1,
        description="Requests a tenant may submit per minute (429 `tenant_rpm`). Unset: unlimited.",
    )
    tenant_tpm: int | None = Field(
        default=None,
        ge=1,
        description="Tokens a tenant may submit per minute (429 `tenant_tpm`). Unset: "
        "unlimited. A batch is one request to `tenant_rpm` and takes no tokens here: its "
        "jobs are metered in, round-robin between tenants.",
    )
