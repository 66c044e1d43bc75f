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

from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from schemas.batch_lines import ENDPOINTS as ENDPOINTS  # re-exported
from schemas.batch_lines import RequestLine as RequestLine
from schemas.batch_lines import line_job as line_job
from schemas.errors import InvalidRequest, SluicegateError
from schemas.jobs import Job
from schemas.states import TERMINAL_STATES, JobState

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
    """POST /v1/batches as JSON: the request lines themselves (``requests``), or, as in
    OpenAI's Batch API, an uploaded file of them (``input_file_id`` and ``endpoint``)."""

    model_config = ConfigDict(extra="forbid")

    requests: Annotated[
        list[dict[str, Any]] | None,
        Field(min_length=1, description="OpenAI Batch request lines: custom_id, method, url, body"),
    ] = None
    input_file_id: Annotated[
        StrictStr | None,
        Field(
            max_length=64,
            description="A file uploaded with POST /v1/files (purpose batch) that holds the "
            "request lines, instead of requests",
        ),
    ] = None
    endpoint: Annotated[
        StrictStr | None,
        Field(
            max_length=64,
            description="The url every request line names (/v1/chat/completions, "
            "/v1/completions or /v1/jobs); checked against the lines when given",
        ),
    ] = None
    output_expires_after: Annotated[
        dict[str, Any] | None,
        Field(description="Accepted for OpenAI's clients; result files are kept with the batch"),
    ] = None
    completion_window: Annotated[
        StrictStr, Field(description="The batch's deadline from now: 24h, 30m, 1h30m")
    ] = DEFAULT_WINDOW
    metadata: dict[str, StrictStr] | None = Field(default=None, max_length=16)
    callback_url: Annotated[StrictStr, Field(max_length=2048)] | None = None
    priority: Literal["low", "normal", "high"] = "normal"

    @model_validator(mode="after")
    def _one_source(self) -> CreateBatch:
        if (self.requests is None) == (self.input_file_id is None):
            raise ValueError("send either requests or input_file_id, not both and not neither")
        return self


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
    input_file_id: str | None


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
        input_file_id=row["input_file_id"],
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
    input_file_id: str | None = None
    completion_window: str
    status: Status
    output_file_id: str | None = None
    error_file_id: str | None = None
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
    """OpenAI's list of batches (``first_id``, ``last_id``, ``has_more``: ask again with
    ``after=last_id``); ``next_after`` is the same cursor, null on the last page."""

    object: Literal["list"] = "list"
    data: list[BatchView]
    first_id: str | None
    last_id: str | None
    has_more: bool
    next_after: str | None


ResultPart = Literal["output", "error"]
_RESULT_FILE = re.compile(
    r"^file-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})-(output|error)$"
)


def result_file_id(batch_id: str, part: ResultPart) -> str:
    """The id of a batch's output file (its succeeded lines) or error file (the rest), as
    OpenAI splits them; read with GET /v1/files/{id}/content once the batch has ended."""
    return f"file-{batch_id}-{part}"


def result_file(file_id: str) -> tuple[str, ResultPart] | None:
    """The batch and part a result file id names; None for any other file id."""
    match = _RESULT_FILE.match(file_id)
    if match is None:
        return None
    part: ResultPart = "output" if match.group(2) == "output" else "error"
    return match.group(1), part


def in_part(job: Job, part: ResultPart | None) -> bool:
    """Whether a terminal job's line belongs in ``part`` (None: every line)."""
    if part is None:
        return True
    return (job.state is JobState.SUCCEEDED) == (part == "output")


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
        input_file_id=batch.input_file_id,
        completion_window=batch.completion_window,
        status=status,
        created_at=int(batch.created_at.timestamp()),
        in_progress_at=int(batch.created_at.timestamp()),
        expires_at=int(batch.deadline.timestamp()),
        completed_at=_unix(done) if status == "completed" else None,
        expired_at=_unix(done) if status == "expired" else None,
        cancelling_at=_unix(batch.cancelled_at),
        cancelled_at=_unix(done) if status == "cancelled" else None,
        output_file_id=result_file_id(batch.id, "output") if done and succeeded else None,
        error_file_id=result_file_id(batch.id, "error") if done and ended > succeeded else None,
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
    # The model that made it (as its engine names it), else as asked, else the engine.
    model = str(result.get("served_model") or result.get("model") or result.get("engine", ""))
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
