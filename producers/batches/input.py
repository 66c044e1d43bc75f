"""Turn a POST /v1/batches body (JSON, a JSONL upload, or raw JSONL) into a NewBatch.

Every line is checked before anything is stored; a batch with any bad line is refused
whole (422 ``invalid_batch``, the bad lines listed by number), so nothing partial is kept.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from producers.batches.repository import BatchRequest, NewBatch
from producers.files.checks import LineSplitter, SameBatch, json_line, validation_message
from schemas.batch_lines import line_request
from schemas.batches import (
    DEFAULT_WINDOW,
    MAX_ERRORS_SHOWN,
    BatchTooLarge,
    CreateBatch,
    InvalidBatch,
    InvalidCompletionWindow,
    RequestLine,
    window_seconds,
)
from schemas.errors import InvalidRequest, SluicegateError
from schemas.jobs import Priority, utf8_length
from schemas.sampling import check_model
from schemas.webhooks import check_callback_url
from sluicegate.settings import Settings


def jsonl_lines(data: bytes) -> list[Any]:
    """The JSON values of a JSONL document (blank lines skipped), read as an uploaded
    file's lines are: split at ``\\n``, a bad line named by its number."""
    splitter = LineSplitter(max_line_bytes=len(data) + 1)  # the body's own limit bounds it
    lines = [*splitter.feed(data), *splitter.end()]
    return [json_line(number, line) for number, line in lines if line.strip()]


def _problem(number: int, custom_id: object, code: str, message: str) -> dict[str, Any]:
    return {"line": number, "custom_id": custom_id, "code": code, "message": message}


def _check_input(text: str, max_tokens: int, settings: Settings) -> None:
    if not text.strip():
        raise InvalidRequest("the input is blank")
    if utf8_length(text) > settings.max_input_bytes:
        raise InvalidRequest(f"the input is over the limit of {settings.max_input_bytes} bytes")
    if max_tokens > settings.max_tokens_limit:
        raise InvalidRequest(f"max_tokens is over the limit of {settings.max_tokens_limit}")


def requests_of(values: list[Any], settings: Settings) -> tuple[str, list[BatchRequest]]:
    """The batch's endpoint (every line must name the same url, as in OpenAI's Batch API)
    and its requests; InvalidBatch lists every bad line (the first few in ``details``)."""
    if not values:
        raise InvalidBatch("the batch has no requests")
    if len(values) > settings.max_batch_requests:
        raise BatchTooLarge(
            f"a batch holds at most {settings.max_batch_requests} requests, not {len(values)}"
        )
    problems: list[dict[str, Any]] = []
    together = SameBatch()
    requests = []
    for number, value in enumerate(values, start=1):
        custom_id = value.get("custom_id") if isinstance(value, dict) else None
        try:
            line = RequestLine.model_validate(value)
            asked = line_request(line)
            _check_input(asked.input, asked.max_tokens, settings)
            check_model(asked.model, settings.models)
        except ValidationError as exc:
            problems.append(_problem(number, custom_id, "invalid_request", validation_message(exc)))
            continue
        except SluicegateError as exc:  # model_not_found, or invalid_request
            problems.append(_problem(number, custom_id, exc.code, str(exc)))
            continue
        except ValueError as exc:
            problems.append(_problem(number, custom_id, "invalid_request", str(exc)))
            continue
        if (problem := together.problem(line)) is not None:
            problems.append(_problem(number, custom_id, *problem))
            continue
        requests.append(
            BatchRequest(
                custom_id=line.custom_id,
                kind=asked.kind,
                input=asked.input,
                max_tokens=asked.max_tokens,
                params=asked.params,
            )
        )
    if problems:
        raise InvalidBatch(
            f"{len(problems)} of {len(values)} request lines are invalid; nothing was stored",
            details=problems[:MAX_ERRORS_SHOWN],
        )
    assert together.url is not None
    return together.url, requests


def _request_hash(body: CreateBatch) -> str:
    try:
        parts = body.model_dump()
        canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    except RecursionError:  # parsed just under the parser's depth, too deep to encode
        raise InvalidRequest("the batch is nested too deeply") from None
    return hashlib.sha256(canonical.encode()).hexdigest()


def new_batch(
    body: CreateBatch,
    *,
    tenant: str,
    idempotency_key: str | None,
    now: datetime,
    settings: Settings,
) -> NewBatch:
    window_s = window_seconds(body.completion_window)
    if window_s > settings.max_ttl_s:
        raise InvalidCompletionWindow(
            f"completion_window is over the limit of {settings.max_ttl_s:g} s"
        )
    if body.callback_url is not None:
        check_callback_url(body.callback_url)
    if body.requests is None:
        raise InvalidRequest("the batch has no requests (its input file is not read yet)")
    endpoint, requests = requests_of(body.requests, settings)
    if body.endpoint is not None and body.endpoint != endpoint:
        raise InvalidBatch(
            f"the batch's endpoint is {body.endpoint}, but its request lines name {endpoint}"
        )
    return NewBatch(
        tenant=tenant,
        endpoint=endpoint,
        completion_window=body.completion_window,
        deadline=now + timedelta(seconds=window_s),
        priority=Priority(body.priority),
        callback_url=body.callback_url,
        metadata=body.metadata,
        idempotency_key=idempotency_key,
        request_hash=_request_hash(body) if idempotency_key else None,
        requests=requests,
        input_file_id=body.input_file_id,
    )


def create_body(
    requests: list[Any],
    *,
    completion_window: str | None = None,
    metadata: str | None = None,
    callback_url: str | None = None,
    priority: str | None = None,
) -> CreateBatch:
    """A CreateBatch from an uploaded file's lines and form or query fields."""
    fields: dict[str, Any] = {
        "requests": requests,
        "completion_window": completion_window or DEFAULT_WINDOW,
    }
    if metadata:
        try:
            fields["metadata"] = json.loads(metadata)
        except (json.JSONDecodeError, RecursionError):
            raise InvalidRequest("metadata must be a JSON object of strings") from None
    if callback_url:
        fields["callback_url"] = callback_url
    if priority:
        fields["priority"] = priority
    return parse_create(fields)


def parse_create(value: Any) -> CreateBatch:
    try:
        return CreateBatch.model_validate(value)
    except ValidationError as exc:
        details = exc.errors(include_url=False, include_context=False, include_input=False)
        raise InvalidRequest(validation_message(exc), details=details) from None
