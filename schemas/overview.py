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


class Overview(BaseModel):
    """Jobs and drops are the caller's tenant's (every tenant's for an operator key);
    admission and workers are the deployment's. ``jobs``: every model and state with jobs
    not ended now, and the jobs that ended within the last ``window_s``."""

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
