"""Batches in the OpenAI Batch format: the request lines, the batch object, the output lines.

A batch's input is OpenAI Batch input (one request per line: ``custom_id``, ``method``,
``url``, ``body``); its status is OpenAI's batch object with Sluicegate's per-state counts
beside OpenAI's ``request_counts``; its output is OpenAI Batch output (``id``,
``custom_id``, ``response`` or ``error``) with a ``sluicegate`` member holding the job's
state. A batch is refused whole or stored whole, so it is never ``validating`` or
``failed``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from schemas.errors import InvalidRequest, SluicegateError
from schemas.jobs import Job, JobKind
from schemas.states import TERMINAL_STATES, JobState

# The urls a request line may name, and the job kind each becomes.
ENDPOINTS: Mapping[str, JobKind] = {
    "/v1/jobs": JobKind.SUMMARIZE,  # the body names its kind; summarize if it does not
    "/v1/summarize": JobKind.SUMMARIZE,
    "/v1/completions": JobKind.COMPLETE,
    "/v1/chat/completions": JobKind.COMPLETE,
}
DEFAULT_WINDOW = "24h"
MAX_ERRORS_SHOWN = 20
_TERMINAL = frozenset(s.value for s in TERMINAL_STATES)
_WINDOW = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_UNIT_S = (86400, 3600, 60, 1)

Status = Literal["in_progress", "cancelling", "completed", "expired", "cancelled"]


class InvalidBatch(InvalidRequest):
    """Some request lines cannot become jobs; ``details`` lists them by line."""

    code = "invalid_batch"


class InvalidJsonl(SluicegateError):
    """A JSONL line (or file) that is not JSON, or not UTF-8; ``details`` names the line."""

    code = "invalid_jsonl"
    status = 400


class InvalidMultipart(SluicegateError):
    """A multipart/form-data body that cannot be parsed (no boundary, cut short, too many
    parts)."""

    code = "invalid_multipart"
    status = 400


class InvalidCompletionWindow(InvalidRequest):
    """``completion_window`` is not a duration such as ``24h``, or is over ``max_ttl_s``."""

    code = "invalid_completion_window"


class BatchTooLarge(SluicegateError):
    """The batch can never be admitted: more jobs than its priority's refusal threshold, more
    tokens than the tenant's TPM, or over ``max_batch_requests``."""

    code = "batch_too_large"
    status = 413


class BatchTerminal(SluicegateError):
    """The batch has already completed, expired or been cancelled."""

    code = "batch_terminal"
    status = 409


class UnsupportedMediaType(SluicegateError):
    """The body is not application/json, multipart/form-data or application/jsonl."""

    code = "unsupported_media_type"
    status = 415


def window_seconds(window: str) -> float:
    """``24h``, ``30m``, ``1h30m``, ``2d``, ``90s``: the completion window in seconds."""
    match = _WINDOW.fullmatch(window.strip())
    if not window.strip() or match is None:
        raise InvalidCompletionWindow(
            f"completion_window {window!r} is not a duration such as 24h, 30m or 1h30m"
        )
    seconds = sum(int(n) * unit for n, unit in zip(match.groups(), _UNIT_S, strict=True) if n)
    if seconds <= 0:
        raise InvalidCompletionWindow("completion_window must be longer than zero")
    return float(seconds)


class CreateBatch(BaseModel):
    """POST /v1/batches as JSON. ``requests`` are OpenAI Batch input lines."""

    model_config = ConfigDict(extra="forbid")

    requests: Annotated[
        list[dict[str, Any]],
        Field(min_length=1, description="OpenAI Batch request lines: custom_id, method, url, body"),
    ]
    completion_window: Annotated[
        StrictStr, Field(description="The batch's deadline from now: 24h, 30m, 1h30m")
    ] = DEFAULT_WINDOW
    metadata: dict[str, StrictStr] | None = Field(default=None, max_length=16)
    callback_url: Annotated[StrictStr, Field(max_length=2048)] | None = None
    priority: Literal["low", "normal", "high"] = "normal"


class RequestLine(BaseModel):
    """One line of OpenAI Batch input."""

    model_config = ConfigDict(extra="forbid")

    custom_id: Annotated[StrictStr, Field(min_length=1, max_length=512)]
    method: Literal["POST"]
    url: StrictStr
    body: dict[str, Any]


class JobBody(BaseModel):
    """The body of a ``/v1/jobs`` line: a job without its deadline (the batch's)."""

    model_config = ConfigDict(extra="forbid")

    kind: JobKind = JobKind.SUMMARIZE
    input: StrictStr
    max_tokens: Annotated[int, Field(ge=1, strict=True)] = 256


class CompletionBody(BaseModel):
    """``/v1/completions``: model and sampling parameters are accepted and not applied (a
    worker's engine serves one model)."""

    model_config = ConfigDict(extra="allow")

    prompt: StrictStr
    max_tokens: Annotated[int, Field(ge=1, strict=True)] = 256


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: StrictStr
    content: StrictStr | list[dict[str, Any]]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")


class ChatBody(BaseModel):
    """``/v1/chat/completions``: the messages become one prompt, ``role: content`` each."""

    model_config = ConfigDict(extra="allow")

    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1, strict=True)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, strict=True)] | None = None


def line_job(line: RequestLine) -> tuple[JobKind, str, int]:
    """The kind, input and max_tokens a request line asks for (pydantic's ValidationError
    or ValueError when its body does not fit its url)."""
    if line.url not in ENDPOINTS:
        raise ValueError(f"url {line.url!r} is not one of {', '.join(ENDPOINTS)}")
    if line.url == "/v1/jobs":
        job = JobBody.model_validate(line.body)
        return job.kind, job.input, job.max_tokens
    if line.url == "/v1/summarize":
        doc = JobBody.model_validate({**line.body, "kind": JobKind.SUMMARIZE.value})
        return JobKind.SUMMARIZE, doc.input, doc.max_tokens
    if line.url == "/v1/completions":
        completion = CompletionBody.model_validate(line.body)
        return JobKind.COMPLETE, completion.prompt, completion.max_tokens
    chat = ChatBody.model_validate(line.body)
    prompt = "\n\n".join(f"{m.role}: {m.text()}" for m in chat.messages)
    return JobKind.COMPLETE, prompt, chat.max_completion_tokens or chat.max_tokens or 256


@dataclass(frozen=True, kw_only=True)
class Batch:
    """A ``batches`` row as stored (its request hash aside)."""

    id: str
    tenant: str
    endpoint: str
    completion_window: str
    deadline: datetime
    callback_url: str | None
    metadata: dict[str, Any] | None
    total: int
    created_at: datetime
    cancelled_at: datetime | None


def batch_from_row(row: Mapping[Any, Any]) -> Batch:
    """The one mapping of a ``batches`` row (every column) to a Batch."""
    return Batch(
        id=str(row["id"]),
        tenant=row["tenant"],
        endpoint=row["endpoint"],
        completion_window=row["completion_window"],
        deadline=row["deadline"],
        callback_url=row["callback_url"],
        metadata=row["metadata"],
        total=row["total"],
        created_at=row["created_at"],
        cancelled_at=row["cancelled_at"],
    )


def batch_status(cancelled_at: datetime | None, counts: Mapping[str, int], total: int) -> Status:
    """OpenAI's status from the jobs' states: in progress until every job is terminal,
    then cancelled (the batch was), expired (some jobs ran out of time) or completed."""
    ended = sum(n for state, n in counts.items() if state in _TERMINAL)
    if ended < total:
        return "cancelling" if cancelled_at is not None else "in_progress"
    if cancelled_at is not None:
        return "cancelled"
    if counts.get(JobState.EXPIRED.value):
        return "expired"
    return "completed"


class RequestCounts(BaseModel):
    total: int
    completed: int  # succeeded
    failed: int  # ended any other way


class BatchView(BaseModel):
    """OpenAI's batch object; times are Unix seconds as there. ``counts`` (jobs per
    state), ``deadline`` and ``results_url`` are Sluicegate's."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: None = None
    input_file_id: None = None
    completion_window: str
    status: Status
    output_file_id: None = None
    error_file_id: None = None
    created_at: int
    in_progress_at: int
    expires_at: int
    finalizing_at: int | None = None
    completed_at: int | None
    failed_at: None = None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None
    counts: dict[str, int]
    deadline: datetime
    callback_url: str | None
    results_url: str


class BatchList(BaseModel):
    data: list[BatchView]
    next_after: str | None


def _unix(at: datetime | None) -> int | None:
    return int(at.timestamp()) if at is not None else None


def batch_view(
    row: Mapping[Any, Any], counts: Mapping[str, int], ended_at: datetime | None
) -> BatchView:
    """The batch object of a stored batch (``row``: a ``batches`` row), its jobs' counts by
    state, and when its last job ended."""
    batch = batch_from_row(row)
    status = batch_status(batch.cancelled_at, counts, batch.total)
    done = ended_at if status in ("completed", "expired", "cancelled") else None
    succeeded = counts.get(JobState.SUCCEEDED.value, 0)
    ended = sum(n for state, n in counts.items() if state in _TERMINAL)
    return BatchView(
        id=batch.id,
        endpoint=batch.endpoint,
        completion_window=batch.completion_window,
        status=status,
        created_at=int(batch.created_at.timestamp()),
        in_progress_at=int(batch.created_at.timestamp()),
        expires_at=int(batch.deadline.timestamp()),
        completed_at=_unix(done) if status == "completed" else None,
        expired_at=_unix(done) if status == "expired" else None,
        cancelling_at=_unix(batch.cancelled_at),
        cancelled_at=_unix(done) if status == "cancelled" else None,
        request_counts=RequestCounts(
            total=batch.total, completed=succeeded, failed=ended - succeeded
        ),
        metadata=batch.metadata,
        counts=dict(counts),
        deadline=batch.deadline,
        callback_url=batch.callback_url,
        results_url=f"/v1/batches/{batch.id}/results",
    )


def _response_body(endpoint: str, job: Job) -> dict[str, Any]:
    """A succeeded job's result in the shape its endpoint answers in."""
    result = job.result or {}
    text = str(result.get("text", ""))
    prompt_tokens = int(result.get("prompt_tokens", 0))
    output_tokens = int(result.get("output_tokens", 0))
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": prompt_tokens + output_tokens,
    }
    finish = "length" if output_tokens >= job.max_tokens else "stop"
    created = int((job.finished_at or job.created_at).timestamp())
    model = str(result.get("engine", ""))
    if endpoint == "/v1/chat/completions":
        return {
            "id": f"chatcmpl-{job.id}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish,
                }
            ],
            "usage": usage,
        }
    if endpoint == "/v1/completions":
        return {
            "id": f"cmpl-{job.id}",
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish}],
            "usage": usage,
        }
    return {"object": "job.result", "finish_reason": finish, **result}


def result_line(endpoint: str, job: Job) -> dict[str, Any]:
    """One line of OpenAI Batch output for a terminal job: ``response`` when it
    succeeded, else ``error`` with the stop reason's code and message."""
    ended = job.state is JobState.SUCCEEDED
    error = None
    if not ended:
        stop = job.error or {}
        error = {
            "code": str(stop.get("code", job.state.value)),
            "message": str(stop.get("message", f"the job ended {job.state.value}")),
        }
    return {
        "id": f"batch_req_{job.id}",
        "custom_id": job.custom_id,
        "response": (
            {"status_code": 200, "request_id": job.id, "body": _response_body(endpoint, job)}
            if ended
            else None
        ),
        "error": error,
        "sluicegate": {
            "job_id": job.id,
            "state": job.state.value,
            "finished_at": job.finished_at.isoformat() if job.finished_at else None,
            "decoded_tokens": job.decoded_tokens,
        },
    }
