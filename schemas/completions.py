"""OpenAI's synchronous completions and models as Sluicegate serves them: the errors of
``POST /v1/chat/completions`` and ``/v1/completions`` (each one durable job, waited for),
and the model objects of ``GET /v1/models``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from schemas.errors import InvalidRequest, SluicegateError

# What Sluicegate serves under /v1, named where a caller asks for something else.
SERVED = (
    "POST /v1/chat/completions and /v1/completions (not streamed), the Batch API "
    "(POST /v1/files, /v1/batches), POST /v1/jobs, GET /v1/models"
)


class StreamUnsupported(InvalidRequest):
    """``stream: true``: Sluicegate answers a completion whole, once its job ended. Send
    the request without ``stream`` (or ``stream: false``), or many of them as a batch."""

    code = "stream_unsupported"
    status = 400


class UnknownEndpoint(SluicegateError):
    """A path under /v1 that Sluicegate does not serve (``/v1/embeddings``,
    ``/v1/responses``, ...); the message names what it serves."""

    code = "unknown_endpoint"
    status = 404


class InvalidDeadline(InvalidRequest):
    """``X-Sluicegate-Deadline-S`` is not a number of seconds over 0 and at most
    ``max_wait_s``."""

    code = "invalid_deadline"


class DeadlineExceeded(SluicegateError):
    """A synchronous completion's deadline passed before its job ended: the job is dropped
    as expired by the pipeline (``details``: its id)."""

    code = "deadline_exceeded"
    status = 504


class CompletionFailed(SluicegateError):
    """A synchronous completion's job ended without a result (``details``: the job id and
    its stop reason, as ``GET /v1/jobs/{id}`` shows it)."""

    code = "completion_failed"
    status = 502


class PoolState(BaseModel):
    """Sluicegate's own, beside OpenAI's fields: the model's worker pool now."""

    topic: str = Field(description="Its dispatch topic")
    consumer_group: str = Field(description="Its workers' consumer group")
    workers: int = Field(description="Its workers that reported lately")
    capacity: int = Field(description="Jobs those workers can run at once")
    running: int = Field(description="Jobs they run now")
    lag: int | None = Field(description="Its group's lag (None: unknown)")
    admission: str = Field(description="open, throttling, refusing or unknown")


class Model(BaseModel):
    """OpenAI's model object; ``pool`` is Sluicegate's own."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "sluicegate"
    pool: PoolState | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
