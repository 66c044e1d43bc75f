"""Versioned JSON envelopes carried on the Kafka topics."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.jobs import JobKind, Priority
from schemas.states import JobState


class Envelope(BaseModel):
    """The base of every record Sluicegate writes to a topic: versioned JSON."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    v: Literal[1] = 1

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode("utf-8")

    def outbox_row(self, topic: str, key: str) -> dict[str, object]:
        """The ``outbox`` row that publishes this envelope on ``topic`` under ``key``: the
        one mapping of that table's rows, whichever side writes them."""
        return {"topic": topic, "key": key, "payload": self.to_bytes()}


class DispatchEnvelope(Envelope):
    """One job to run. The input stays in PostgreSQL; the worker reads it when it claims."""

    type: Literal["dispatch"] = "dispatch"
    job_id: str
    tenant: str
    kind: JobKind
    priority: Priority
    max_tokens: int = Field(ge=1)
    prompt_tokens: int = Field(ge=1)
    deadline: datetime


class JobEvent(Envelope):
    """A state change of a job, emitted through the outbox after it is committed."""

    type: Literal["job.state"] = "job.state"
    job_id: str
    tenant: str
    state: JobState
    attempt: int
    at: datetime
    callback_url: str | None = None
    error_code: str | None = None
    # Whether the job is one of a batch (None: its writer did not say). A terminal event of
    # a job with no callback_url and in no batch calls for no delivery: the webhook
    # dispatcher need not read the job.
    in_batch: bool | None = None


class DeadRecord(Envelope):
    """A record set aside on the dead-letter topic because it could not be handled: where
    it came from, why, and what it held (as text, cut to MAX_DEAD_PAYLOAD characters)."""

    type: Literal["record.dead"] = "record.dead"
    source: str  # the consumer that gave up on it: "dispatch", "events"
    subject: str  # topic@partition:offset
    reason: str
    size: int  # the record's bytes
    payload: str


MAX_DEAD_PAYLOAD = 65_536
