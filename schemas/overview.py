"""GET /v1/overview: the pipeline at a glance (the web page and ``sluicegate status``).

Stable names: fields are added, never renamed. Times are Unix seconds (floats)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from schemas.constants import DEFAULT_MODEL


class AdmissionView(BaseModel):
    state: Literal["open", "throttling", "refusing", "unknown"] = Field(
        description="What a normal-priority submit meets now: open (accepted at once), "
        "throttling (the lag is at lag_soft: it waits, or is refused with admission_mode="
        "reject), refusing (at lag_hard: 429), unknown (the lag cannot be read: 503)"
    )
    lag: int | None = Field(description="Records the worker group is behind (null: unknown)")
    lag_soft: int
    lag_hard: int
    reading_age_s: float | None = Field(description="Age of the lag reading (null: none yet)")
    retry_after_s: float | None = Field(
        description="The Retry-After a refused submit (max_tokens 256) gets now; null while open"
    )


class PoolAdmissionView(AdmissionView):
    """One pool's admission: its model's submits meet it."""

    model: str = Field(description="The pool's model")


class JobCount(BaseModel):
    model: str = Field(description=f"The request's model ({DEFAULT_MODEL}: none named)")
    state: str
    count: int


class DropCount(BaseModel):
    state: str = Field(description="expired, cancelled or abandoned")
    reason: str = Field(
        description="deadline_passed, deadline_unreachable, cancelled, heartbeat_lapsed, "
        "disconnected, ..."
    )
    count: int


class WorkerView(BaseModel):
    id: str = Field(description="worker-N (its static member id), else host:pid")
    model: str = Field(description="The model its engine serves")
    engine: str = Field(description="sim (simulated output), vllm_http, vllm_local, llamacpp")
    capacity: int = Field(description="Jobs it may run at once (its slots, or max running)")
    running: int
    kv_usage: float | None = Field(description="Fraction of its KV cache or slots in use")
    last_seen_s: float = Field(description="Seconds since it last reported")
    stale: bool = Field(description="Not reported for three intervals: stopped or stuck")


class DeliveriesView(BaseModel):
    """The webhook deliveries not yet delivered or dead. A dispatcher leases a row it claims
    by moving its ``next_attempt_at`` ahead, so one due is one no dispatcher has claimed."""

    pending: int = Field(description="Not delivered or dead: due, in flight, or awaiting a retry")
    due: int = Field(description="Due now and not claimed by a dispatcher")
    oldest_due_s: float | None = Field(
        description="How long the oldest due one has been due, by the database's clock "
        "(null: none is due)"
    )
    behind: bool = Field(
        description="The oldest due one has been due over a minute: a slow receiver holds "
        "its endpoint's slots, the dispatchers are full, or none runs"
    )


class Overview(BaseModel):
    """Jobs, drops and deliveries are the caller's tenant's (every tenant's for an operator
    key); admission and workers are the deployment's. ``jobs``: every model and state with
    jobs not ended now, and the jobs that ended within the last ``window_s``."""

    generated_at: float
    window_s: int
    operator: bool = Field(description="Whether the counts cover every tenant")
    admission: AdmissionView = Field(description="The first pool's (the only one without pools)")
    pools: list[PoolAdmissionView] = Field(
        default=[], description="Each pool's admission, in the order the pools are configured"
    )
    jobs: list[JobCount]
    drops: list[DropCount]
    workers: list[WorkerView]
    deliveries: DeliveriesView = Field(
        default=DeliveriesView(pending=0, due=0, oldest_due_s=None, behind=False),
        description="The webhook deliveries waiting",
    )
