"""Turn a POST /v1/batches body (JSON, a JSONL upload, or raw JSONL) into a NewBatch.

Every line is checked before anything is stored; a batch with any bad line is refused
whole (422 ``invalid_batch``, the bad lines listed by number), so nothing partial is kept.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from plumbing.settings.api import ApiSettings
from producers.batches.repository import BatchRequest, NewBatch
from producers.files.checks import LineSplitter, SameBatch, json_line, validation_message
from schemas.batches import (
    DEFAULT_WINDOW,
    MAX_BATCH_ERRORS,
    MAX_ERRORS_SHOWN,
    BatchTooLarge,
    CreateBatch,
    InvalidBatch,
    InvalidCompletionWindow,
    InvalidJsonl,
    RequestLine,
    window_seconds,
)
from schemas.batches.lines import line_request
from schemas.errors import InvalidRequest, SluicegateError
from schemas.jobs import Priority, utf8_length
from schemas.sampling import check_model
from schemas.webhooks import check_callback_url

# Request lines written per statement (and held in memory at once) while a batch is stored.
CHUNK = 1000
# A stored file's line that is not JSON: OpenAI's code for it in a failed batch's errors.
INVALID_JSON_LINE = "invalid_json_line"
TOO_MANY_REQUESTS = "too_many_requests"  # past max_batch_requests
EMPTY_FILE = "empty_file"
_PARAMS = {"duplicate_custom_id": "custom_id", "mixed_urls": "url"}


def jsonl_lines(data: bytes) -> list[Any]:
    """The JSON values of a JSONL document (blank lines skipped), read as an uploaded
    file's lines are: split at ``\\n``, a bad line named by its number."""
    splitter = LineSplitter(max_line_bytes=len(data) + 1)  # the body's own limit bounds it
    lines = [*splitter.feed(data), *splitter.end()]
    return [json_line(number, line) for number, line in lines if line.strip()]


def _check_input(text: str, max_tokens: int, api: ApiSettings) -> None:
    if not text.strip():
        raise InvalidRequest("the input is blank")
    if utf8_length(text) > api.max_input_bytes:
        raise InvalidRequest(f"the input is over the limit of {api.max_input_bytes} bytes")
    if max_tokens > api.max_tokens_limit:
        raise InvalidRequest(f"max_tokens is over the limit of {api.max_tokens_limit}")


class RequestChecker:
    """A batch's request lines, checked one by one as they arrive (from a body or a stored
    file): ``check`` gives each valid line's request and keeps the bad lines; ``finish``
    refuses the batch whole (InvalidBatch, the first few bad lines in ``details``) if any
    line was bad. ``endpoint``: the url every line must name, when the caller gave one."""

    def __init__(self, api: ApiSettings, *, endpoint: str | None = None) -> None:
        self._api = api
        self.max_lines = api.max_batch_requests
        self._together = SameBatch()
        self._together.url = endpoint
        self._problems: list[dict[str, Any]] = []
        self.params: list[str | None] = []  # each problem's parameter, as OpenAI names it
        self.lines = 0
        self.max_tokens = 0
        self.kinds: Counter[str] = Counter()
        self.models: Counter[str | None] = Counter()  # the lines of each model named (None: none)

    @property
    def endpoint(self) -> str | None:
        return self._together.url

    def check(self, number: int, value: Any) -> BatchRequest | None:
        self.lines += 1
        if self.lines > self.max_lines:
            raise BatchTooLarge(f"a batch holds at most {self.max_lines} requests")
        custom_id = value.get("custom_id") if isinstance(value, dict) else None
        try:
            line = RequestLine.model_validate(value)
            asked = line_request(line)
            _check_input(asked.input, asked.max_tokens, self._api)
            check_model(asked.model, self._api.models)
        except ValidationError as exc:
            where = ".".join(str(p) for p in exc.errors(include_url=False)[0]["loc"])
            self._problem(number, custom_id, "invalid_request", validation_message(exc), where)
            return None
        except SluicegateError as exc:  # model_not_found, or invalid_request
            param = "body.model" if exc.code == "model_not_found" else None
            self._problem(number, custom_id, exc.code, str(exc), param)
            return None
        except ValueError as exc:
            self._problem(number, custom_id, "invalid_request", str(exc), "url")
            return None
        if (problem := self._together.problem(line)) is not None:
            code, message = problem
            self._problem(number, custom_id, code, message, _PARAMS.get(code))
            return None
        self.max_tokens = max(self.max_tokens, asked.max_tokens)
        self.kinds[asked.kind.value] += 1
        self.models[asked.model] += 1
        return BatchRequest(
            custom_id=line.custom_id,
            kind=asked.kind,
            input=asked.input,
            max_tokens=asked.max_tokens,
            params=asked.params,
        )

    def _problem(
        self, number: int, custom_id: object, code: str, message: str, param: str | None = None
    ) -> None:
        self._problems.append(
            {"line": number, "custom_id": custom_id, "code": code, "message": message}
        )
        self.params.append(param)

    def not_json(self, number: int, message: str) -> None:
        """Line ``number`` is not a JSON value (a stored file's, checked in the batch)."""
        self.lines += 1
        self._problem(number, None, INVALID_JSON_LINE, message)

    @property
    def problems(self) -> list[dict[str, Any]]:
        """The bad lines so far: ``line``, ``custom_id``, ``code``, ``message``."""
        return self._problems

    def finish(self) -> str:
        """The batch's endpoint, once every line was checked and none was bad."""
        if self.lines == 0:
            raise InvalidBatch("the batch has no requests")
        if self._problems:
            raise InvalidBatch(
                f"{len(self._problems)} of {self.lines} request lines are invalid; nothing "
                "was stored",
                details=self._problems[:MAX_ERRORS_SHOWN],
            )
        assert self.endpoint is not None
        return self.endpoint


class FileValidation:
    """A stored file's lines checked in its batch (``validating``), fed one at a time:
    ``feed`` gives each good line's request while no line was bad (after the first bad
    line, lines are only checked, to name the bad ones); ``errors`` lists the bad lines as
    OpenAI's ``errors.data`` (``code``, ``message``, ``param``, ``line``), at most
    ``max_errors``; ``done`` once nothing more needs reading."""

    def __init__(self, checker: RequestChecker, *, max_errors: int = MAX_BATCH_ERRORS) -> None:
        self.checker = checker
        self._max_errors = max_errors

    @property
    def done(self) -> bool:
        return len(self.checker.problems) >= self._max_errors

    def feed(self, number: int, line: bytes) -> BatchRequest | None:
        check = self.checker
        if check.lines >= check.max_lines:
            check.not_json(number, f"a batch holds at most {check.max_lines} requests")
            check.problems[-1]["code"] = TOO_MANY_REQUESTS
            self._max_errors = len(check.problems)  # nothing past it is read
            return None
        try:
            value = json_line(number, line)
        except InvalidJsonl as exc:
            check.not_json(number, exc.message)
            return None
        request = check.check(number, value)
        return request if not check.problems else None

    def errors(self) -> list[dict[str, Any]]:
        """OpenAI's errors.data; an empty file is one error without a line."""
        check = self.checker
        if not check.problems and check.lines == 0:
            return [
                {
                    "code": EMPTY_FILE,
                    "message": "the file holds no request lines",
                    "param": None,
                    "line": None,
                }
            ]
        return [
            {"code": p["code"], "message": p["message"], "param": param, "line": p["line"]}
            for p, param in zip(check.problems, check.params, strict=True)
        ][: self._max_errors]


def requests_of(
    values: list[Any], api: ApiSettings, *, endpoint: str | None = None
) -> tuple[str, list[BatchRequest]]:
    """The batch's endpoint (every line must name the same url, as in OpenAI's Batch API)
    and its requests; InvalidBatch lists every bad line (the first few in ``details``)."""
    checker = RequestChecker(api, endpoint=endpoint)
    requests = check_all(values, checker)
    return checker.finish(), requests


def check_all(values: list[Any], checker: RequestChecker) -> list[BatchRequest]:
    """Every line of a batch sent whole, checked before anything is written."""
    if len(values) > checker.max_lines:
        raise BatchTooLarge(
            f"a batch holds at most {checker.max_lines} requests, not {len(values)}"
        )
    requests = [
        r for number, value in enumerate(values, start=1) if (r := checker.check(number, value))
    ]
    checker.finish()
    return requests


async def chunked(
    requests: list[BatchRequest], *, chunk: int = CHUNK
) -> AsyncIterator[list[BatchRequest]]:
    for start in range(0, len(requests), chunk):
        yield requests[start : start + chunk]


async def file_requests(
    lines: AsyncIterator[tuple[int, bytes]], checker: RequestChecker, *, chunk: int = CHUNK
) -> AsyncIterator[list[BatchRequest]]:
    """A stored file's request lines, checked, in chunks of ``chunk`` (never the whole
    file in memory); raises at the end if any line was bad."""
    requests: list[BatchRequest] = []
    async for number, line in lines:
        if (request := checker.check(number, json_line(number, line))) is not None:
            requests.append(request)
        if len(requests) >= chunk:
            yield requests
            requests = []
    if requests:
        yield requests
    checker.finish()


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
    api: ApiSettings,
) -> NewBatch:
    window_s = window_seconds(body.completion_window)
    if window_s > api.max_ttl_s:
        raise InvalidCompletionWindow(f"completion_window is over the limit of {api.max_ttl_s:g} s")
    if body.callback_url is not None:
        check_callback_url(body.callback_url)
    return NewBatch(
        tenant=tenant,
        endpoint=body.endpoint,
        completion_window=body.completion_window,
        deadline=now + timedelta(seconds=window_s),
        priority=Priority(body.priority),
        callback_url=body.callback_url,
        metadata=body.metadata,
        idempotency_key=idempotency_key,
        request_hash=_request_hash(body) if idempotency_key else None,
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
