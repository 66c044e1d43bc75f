"""GET /v1/jobs/{id}/timeline: one job's way through the pipeline, as recorded."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from schemas.api import GraphView
from schemas.constants import DEFAULT_MODEL
from schemas.jobs import (
    FinishReason,
    GraphProgress,
    Job,
    JobKind,
    Priority,
    finish_reason_of,
)
from schemas.states import JobState
from schemas.webhooks import DeliveryDetail


class JobTimeline(BaseModel):
    """When the job was accepted, dispatched, started and ended, how it ended, what it
    decoded (a succeeded job's text, and why its output ended), and its webhook deliveries
    with every attempt. A time is null until the job reaches that step (a job dropped before
    it started has no ``started_at``)."""

    id: str
    tenant: str
    kind: JobKind
    priority: Priority
    model: str = Field(description=f"The request's model ({DEFAULT_MODEL}: none named)")
    batch_id: str | None
    custom_id: str | None
    state: JobState
    accepted_at: datetime = Field(description="Admitted and stored (the job's created_at)")
    dispatched_at: datetime | None = Field(description="Its record acknowledged by the broker")
    started_at: datetime | None = Field(description="Its latest attempt began on a worker")
    ended_at: datetime | None = Field(description="It reached its terminal state")
    deadline: datetime
    attempts: int = Field(description="Attempts started on workers (a redelivery adds one)")
    end_reason: str | None = Field(
        description="Why it ended without a result (error.reason): deadline_passed, "
        "deadline_unreachable, cancelled, heartbeat_lapsed, disconnected, ..."
    )
    error: dict[str, Any] | None
    engine: str | None = Field(description="The engine that produced the result")
    served_model: str | None = Field(
        default=None, description="The model that produced the result, as its engine names it"
    )
    prompt_tokens: int | None = Field(description="As the engine counted them (a result's)")
    completion_tokens: int | None = Field(
        description="Output tokens decoded by the attempt that ended it (wasted unless it "
        "succeeded)"
    )
    finish_reason: FinishReason | None = Field(
        default=None,
        description="Why the engine ended a succeeded job's output: stop, or length (cut at "
        "max_tokens)",
    )
    text: str | None = Field(default=None, description="A succeeded job's output (result.text)")
    parent_id: str | None = Field(
        default=None, description="A part of a document's graph: the document's job"
    )
    graph: GraphView | None = Field(
        default=None, description="A document cut into a graph of jobs: its progress"
    )
    deliveries: list[DeliveryDetail] = Field(
        description="The job's webhook deliveries, with every attempt"
    )

    @classmethod
    def of(
        cls, job: Job, deliveries: list[DeliveryDetail], graph: GraphProgress | None = None
    ) -> JobTimeline:
        result = job.result or {}
        prompt = result.get("prompt_tokens")
        engine = result.get("engine")
        served = result.get("served_model")
        return cls(
            id=job.id,
            tenant=job.tenant,
            kind=job.kind,
            priority=job.priority,
            model=job.model or DEFAULT_MODEL,
            batch_id=job.batch_id,
            custom_id=job.custom_id,
            state=job.state,
            accepted_at=job.created_at,
            dispatched_at=job.dispatched_at,
            started_at=job.started_at,
            ended_at=job.finished_at,
            deadline=job.deadline,
            attempts=job.attempt,
            end_reason=(job.error or {}).get("reason"),
            error=job.error,
            engine=engine if isinstance(engine, str) else None,
            served_model=served if isinstance(served, str) else None,
            prompt_tokens=prompt if isinstance(prompt, int) else None,
            completion_tokens=job.decoded_tokens,
            finish_reason=finish_reason_of(result.get("finish_reason")),
            text=text if isinstance(text := result.get("text"), str) else None,
            parent_id=job.parent_id,
            graph=GraphView(**asdict(graph)) if graph is not None else None,
            deliveries=deliveries,
        )
