"""Batches in the OpenAI Batch format: the request lines, the batch object, the output lines.

A batch's input is OpenAI Batch input (one request per line: ``custom_id``, ``method``,
``url``, ``body``); its status is OpenAI's batch object with Sluicegate's per-state counts
beside OpenAI's ``request_counts``; its output is OpenAI Batch output (``id``,
``custom_id``, ``response`` or ``error``) with a ``sluicegate`` member holding the job's
state. A batch sent whole is refused whole or stored whole; one made from an uploaded file
is stored ``validating`` and its lines are checked in the background
(``producers.batches.lifecycle``): ``failed`` with OpenAI's per-line ``errors``, or
``in_progress``; once every line ended it is ``finalizing`` while its output and error
files are written, then ``completed``, ``expired`` or ``cancelled``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from schemas.batches.lines import ENDPOINTS as ENDPOINTS  # re-exported
from schemas.batches.lines import RequestLine as RequestLine
from schemas.batches.lines import line_job as line_job
from schemas.errors import InvalidRequest, SluicegateError
from schemas.states import TERMINAL_STATES, JobState

DEFAULT_WINDOW = "24h"
MAX_ERRORS_SHOWN = 20
_TERMINAL = frozenset(s.value for s in TERMINAL_STATES)
_WINDOW = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_UNIT_S = (86400, 3600, 60, 1)

Status = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "cancelling",
    "completed",
    "expired",
    "cancelled",
]
# The statuses a batch no longer leaves.
ENDED_STATUSES = ("failed", "completed", "expired", "cancelled")
MAX_BATCH_ERRORS = 1000  # the lines a failed batch's errors.data names, at most
BatchStatus = Status  # the list filter\'s name for it


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


class BatchError(BaseModel):
    """OpenAI's error of one input line (``line`` from 1), or of the whole file (no line)."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


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
    errors: BatchErrors | None = None
    input_file_id: str | None = None
    completion_window: str
    status: Status
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None
    expires_at: int
    finalizing_at: int | None = None
    completed_at: int | None
    failed_at: int | None = None
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


def _unix(at: datetime | None) -> int | None:
    return int(at.timestamp()) if at is not None else None


def batch_view(
    row: Mapping[Any, Any], counts: Mapping[str, int], ended_at: datetime | None = None
) -> BatchView:
    """The batch object of a stored batch (``row``: a ``batches`` row, whose ``status``,
    times and result files the lifecycle wrote) and its jobs' counts by state."""
    batch = batch_from_row(row)
    status: Status = row["status"]
    done = row["finished_at"] if status in ENDED_STATUSES else None
    succeeded = counts.get(JobState.SUCCEEDED.value, 0)
    ended = sum(n for state, n in counts.items() if state in _TERMINAL)
    errors = row["errors"]
    return BatchView(
        id=batch.id,
        endpoint=batch.endpoint,
        errors=BatchErrors(data=[BatchError(**e) for e in errors]) if errors else None,
        input_file_id=batch.input_file_id,
        completion_window=batch.completion_window,
        status=status,
        created_at=int(batch.created_at.timestamp()),
        in_progress_at=_unix(row["in_progress_at"]),
        expires_at=int(batch.deadline.timestamp()),
        finalizing_at=_unix(row["finalizing_at"]),
        completed_at=_unix(done) if status == "completed" else None,
        failed_at=_unix(done) if status == "failed" else None,
        expired_at=_unix(done) if status == "expired" else None,
        cancelling_at=_unix(batch.cancelled_at),
        cancelled_at=_unix(done) if status == "cancelled" else None,
        output_file_id=row["output_file_id"],
        error_file_id=row["error_file_id"],
        request_counts=RequestCounts(
            total=batch.total, completed=succeeded, failed=ended - succeeded
        ),
        metadata=batch.metadata,
        counts=dict(counts),
        deadline=batch.deadline,
        callback_url=batch.callback_url,
        results_url=f"/v1/batches/{batch.id}/results",
    )
