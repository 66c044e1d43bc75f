"""HTTP request and response bodies."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from schemas.constants import DEFAULT_MODEL
from schemas.jobs import GraphProgress, Job, JobKind, Priority
from schemas.sampling import SamplingFields, SummaryOptions, summary_params
from schemas.states import JobState


class SubmitJob(SamplingFields):
    """POST /v1/jobs. Give an absolute ``deadline`` or a relative ``ttl_s``, not both.
    ``model``, ``temperature``, ``top_p``, ``stop`` and ``seed`` are OpenAI's; ``summary``
    (summarize jobs only) says what summary to write."""

    model_config = ConfigDict(extra="forbid")

    kind: JobKind
    input: Annotated[StrictStr, Field(min_length=1, description="The document or the prompt")]
    max_tokens: Annotated[StrictInt, Field(ge=1, description="Most output tokens")] = 256
    summary: SummaryOptions | None = Field(
        default=None,
        description="The summary asked for (kind summarize only): style, or instructions, "
        "language, words",
    )
    deadline: AwareDatetime | None = Field(
        default=None, description="When the job must have ended (RFC 3339, with an offset)"
    )
    ttl_s: Annotated[StrictFloat | StrictInt, Field(gt=0)] | None = Field(
        default=None, description="The deadline as seconds from now (default: default_ttl_s)"
    )
    priority: Priority = Field(
        default=Priority.NORMAL, description="low is shed first; high is never made to wait"
    )
    callback_url: Annotated[StrictStr, Field(max_length=2048)] | None = Field(
        default=None, description="Where the signed webhook goes when the job ends"
    )
    idempotency_key: Annotated[StrictStr, Field(min_length=1, max_length=255)] | None = Field(
        default=None, description="As the Idempotency-Key header (if both, they must match)"
    )
    abandon_on_disconnect: bool = Field(
        default=False,
        description="Abandon the job if the caller's waiting connection (?wait=) closes first",
    )
    abandon_after_s: (
        Annotated[
            StrictFloat | StrictInt,
            Field(ge=1, description="Abandon the job when it is not polled for this long"),
        ]
        | None
    ) = None

    def stored_params(self) -> dict[str, Any] | None:
        return summary_params(super().stored_params(), self.summary)


class ErrorBody(BaseModel):
    code: str
    message: str
    details: Any | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class SubmitResponse(BaseModel):
    id: str
    state: JobState
    deadline: datetime
    created_at: datetime
    status_url: str


class BulkSubmit(BaseModel):
    """POST /v1/jobs/bulk: many single submits in one request (the Python client sends
    concurrent ``submit()`` calls so). Each job is a ``POST /v1/jobs`` body, idempotency key
    included, and is validated, admitted and answered on its own."""

    model_config = ConfigDict(extra="forbid")

    jobs: list[Any] = Field(
        min_length=1, description="The jobs: each a body of POST /v1/jobs (an object)"
    )


class BulkAnswer(BaseModel):
    """What ``POST /v1/jobs`` would have answered for one job of a bulk submit."""

    status: int = Field(description="202 stored, 200 a replay, 4xx/5xx as POST /v1/jobs")
    body: dict[str, Any] = Field(description="A SubmitResponse, a yield, or an error body")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Location, Idempotent-Replayed, Retry-After (lower case)"
    )


class BulkAnswers(BaseModel):
    object: str = "list"
    data: list[BulkAnswer] = Field(description="One answer a job, in the request's order")


class GraphView(BaseModel):
    """A document summarized in parts: ``chunks`` jobs summarize its chunks (level 0), then
    reduce jobs combine their summaries, level by level, until one is left. ``level`` is
    the level running now, of ``levels`` planned; ``ended`` of its ``total`` jobs ended.
    The tokens are those of the jobs ended so far."""

    chunks: int
    level: int
    levels: int
    total: int
    ended: int
    prompt_tokens: int
    output_tokens: int


class JobView(BaseModel):
    id: str
    tenant: str
    kind: JobKind
    state: JobState
    priority: Priority
    max_tokens: int
    deadline: datetime
    callback_url: str | None
    created_at: datetime
    updated_at: datetime
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    attempt: int
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    abandon_on_disconnect: bool
    abandon_after_s: float | None
    last_seen_at: datetime
    decoded_tokens: int | None
    batch_id: str | None = None
    custom_id: str | None = None
    model: str = Field(
        default=DEFAULT_MODEL, description=f"The request's model ({DEFAULT_MODEL}: none named)"
    )
    status_url: str
    # An estimate for a job not started yet: jobs ahead of it (all tenants' queued and
    # dispatched jobs submitted before it) and when it may start at the measured drain rate.
    queue_position: int | None = None
    expected_start_at: datetime | None = None
    parent_id: str | None = Field(
        default=None, description="A part of a document's graph: the document's job"
    )
    level: int | None = Field(
        default=None, description="A part's level in its graph: 0 a chunk, 1 and up a reduce"
    )
    graph: GraphView | None = Field(
        default=None, description="A document too long for its engine: its graph's progress"
    )

    @classmethod
    def of(
        cls,
        job: Job,
        status_url: str,
        *,
        queue_position: int | None = None,
        expected_start_at: datetime | None = None,
        graph: GraphProgress | None = None,
    ) -> JobView:
        return cls(
            id=job.id,
            tenant=job.tenant,
            kind=job.kind,
            state=job.state,
            priority=job.priority,
            max_tokens=job.max_tokens,
            deadline=job.deadline,
            callback_url=job.callback_url,
            created_at=job.created_at,
            updated_at=job.updated_at,
            dispatched_at=job.dispatched_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            attempt=job.attempt,
            result=job.result,
            error=job.error,
            abandon_on_disconnect=job.abandon_on_disconnect,
            abandon_after_s=job.abandon_after_s,
            last_seen_at=job.last_seen_at,
            decoded_tokens=job.decoded_tokens,
            batch_id=job.batch_id,
            custom_id=job.custom_id,
            model=job.model or DEFAULT_MODEL,
            status_url=status_url,
            queue_position=queue_position,
            expected_start_at=expected_start_at,
            parent_id=job.parent_id,
            level=job.level,
            graph=GraphView(**asdict(graph)) if graph is not None else None,
        )


class JobList(BaseModel):
    """A page of jobs, oldest first; pass ``next_after`` as ``after`` for the next page."""

    data: list[JobView]
    next_after: str | None
