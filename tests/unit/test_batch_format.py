"""The OpenAI Batch format: completion windows, request lines, batch status, output lines."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from schemas.batches import (
    CreateBatch,
    InvalidCompletionWindow,
    RequestLine,
    batch_status,
    batch_view,
    line_job,
    window_seconds,
)
from schemas.batches.output import in_part, result_file_id, result_line
from schemas.jobs import Job, JobKind, Priority
from schemas.states import JobState

AT = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("window", "seconds"),
    [("24h", 86400), ("30m", 1800), ("1h30m", 5400), ("2d", 172800), ("90s", 90)],
)
def test_windows(window: str, seconds: float) -> None:
    assert window_seconds(window) == seconds


@pytest.mark.parametrize("window", ["", "soon", "0h", "24", "h", "1.5h", "30m1h"])
def test_bad_windows(window: str) -> None:
    with pytest.raises(InvalidCompletionWindow):
        window_seconds(window)


def line(url: str, body: dict[str, object]) -> RequestLine:
    return RequestLine(custom_id="c", method="POST", url=url, body=body)


def test_each_url_becomes_a_job() -> None:
    assert line_job(line("/v1/jobs", {"kind": "complete", "input": "hi", "max_tokens": 5})) == (
        JobKind.COMPLETE,
        "hi",
        5,
    )
    assert line_job(line("/v1/summarize", {"input": "doc"})) == (JobKind.SUMMARIZE, "doc", 256)
    completion = {"model": "m", "prompt": "Once", "max_tokens": 7, "temperature": 0}
    assert line_job(line("/v1/completions", completion)) == (JobKind.COMPLETE, "Once", 7)
    chat = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Sum up"}]},
        ],
        "max_completion_tokens": 9,
    }
    assert line_job(line("/v1/chat/completions", chat)) == (
        JobKind.COMPLETE,
        "system: Be brief.\n\nuser: Sum up",
        9,
    )


def test_bad_lines_are_refused() -> None:
    with pytest.raises(ValueError, match="not one of"):
        line_job(line("/v1/embeddings", {"input": "x"}))
    with pytest.raises(ValidationError):
        line_job(line("/v1/jobs", {"input": "x", "deadline": "tomorrow"}))
    with pytest.raises(ValidationError):
        line_job(line("/v1/chat/completions", {"messages": []}))
    with pytest.raises(ValidationError):
        RequestLine.model_validate(
            {"custom_id": "c", "method": "GET", "url": "/v1/jobs", "body": {}}
        )


def test_status_follows_the_jobs() -> None:
    assert batch_status(None, {"queued": 2, "succeeded": 1}, 3) == "in_progress"
    assert batch_status(AT, {"running": 1, "cancelled": 2}, 3) == "cancelling"
    assert batch_status(None, {"succeeded": 2, "failed": 1}, 3) == "completed"
    assert batch_status(None, {"succeeded": 2, "expired": 1}, 3) == "expired"
    assert batch_status(AT, {"succeeded": 2, "cancelled": 1}, 3) == "cancelled"


def job(state: JobState, **extra: object) -> Job:
    fields: dict[str, object] = {
        "id": "0195",
        "tenant": "t",
        "kind": JobKind.COMPLETE,
        "state": state,
        "priority": Priority.NORMAL,
        "max_tokens": 5,
        "deadline": AT,
        "callback_url": None,
        "idempotency_key": None,
        "created_at": AT,
        "updated_at": AT,
        "dispatched_at": None,
        "started_at": None,
        "finished_at": AT,
        "attempt": 1,
        "result": None,
        "error": None,
        "abandon_on_disconnect": False,
        "abandon_after_s": None,
        "last_seen_at": AT,
        "decoded_tokens": 5,
        "custom_id": "req-1",
        **extra,
    }
    return Job(**fields)  # type: ignore[arg-type]


def test_an_output_line_carries_the_engines_finish_reason() -> None:
    # vLLM checks the end-of-text token before the length: an output whose last allowed
    # token was the EOS is "stop", though it took all of max_tokens.
    reported = {"text": "Short.", "prompt_tokens": 3, "output_tokens": 5, "finish_reason": "stop"}
    done = job(JobState.SUCCEEDED, result=reported)
    chat = result_line("/v1/chat/completions", done)["response"]["body"]
    assert chat["choices"][0]["finish_reason"] == "stop"
    completion = result_line("/v1/completions", done)["response"]["body"]
    assert completion["choices"][0]["finish_reason"] == "stop"
    summary = result_line("/v1/summarize", done)["response"]["body"]
    assert summary["finish_reason"] == "stop"
    cut = {**reported, "output_tokens": 2, "finish_reason": "length"}
    chat = result_line("/v1/chat/completions", job(JobState.SUCCEEDED, result=cut))
    assert chat["response"]["body"]["choices"][0]["finish_reason"] == "length"


def test_output_lines() -> None:
    result = {"text": "Short.", "engine": "sim", "prompt_tokens": 3, "output_tokens": 5}
    ok = result_line("/v1/completions", job(JobState.SUCCEEDED, result=result))
    assert ok["id"] == "batch_req_0195"
    assert ok["custom_id"] == "req-1"
    assert ok["error"] is None
    body = ok["response"]["body"]
    assert body["object"] == "text_completion"
    assert body["choices"] == [{"index": 0, "text": "Short.", "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert ok["sluicegate"] == {
        "job_id": "0195",
        "state": "succeeded",
        "finished_at": AT.isoformat(),
        "decoded_tokens": 5,
        "reason": None,
    }
    # Issue 31 changes the requirement: an expired line carries OpenAI's batch_expired (was
    # Sluicegate's deadline_passed, which the message and sluicegate.reason still give).
    stop = {"code": "deadline_passed", "reason": "deadline_passed", "message": "too late"}
    late = result_line("/v1/completions", job(JobState.EXPIRED, error=stop))
    assert late["response"] is None
    assert late["error"]["code"] == "batch_expired"
    assert "deadline_passed: too late" in late["error"]["message"]
    assert late["sluicegate"]["reason"] == "deadline_passed"
    failed = {"code": "request_too_large", "message": "too long"}
    refused = result_line("/v1/completions", job(JobState.FAILED, error=failed))
    assert refused["error"] == {"code": "request_too_large", "message": "too long"}
    jobs_line = result_line("/v1/jobs", job(JobState.SUCCEEDED, result=result))
    assert jobs_line["response"]["body"]["usage"]["total_tokens"] == 8


def test_an_output_line_names_the_model_that_served_it() -> None:
    asked = {"text": "Hi.", "engine": "llamacpp", "prompt_tokens": 3, "output_tokens": 2}
    served = {**asked, "model": "llamacpp", "served_model": "SmolLM2-135M-Instruct.Q4_1"}
    for endpoint in ("/v1/completions", "/v1/chat/completions"):
        line = result_line(endpoint, job(JobState.SUCCEEDED, result=served))
        assert line["response"]["body"]["model"] == "SmolLM2-135M-Instruct.Q4_1"
        # A result from before results named their model: as asked, else the engine.
        older = result_line(endpoint, job(JobState.SUCCEEDED, result=asked))
        assert older["response"]["body"]["model"] == "llamacpp"


BATCH = "0195a3c2-7d4e-7f00-8a1b-2c3d4e5f6a7b"


def batch_row(**extra: object) -> dict[str, object]:
    return {
        "id": BATCH,
        "tenant": "t",
        "endpoint": "/v1/completions",
        "completion_window": "24h",
        "deadline": AT,
        "callback_url": None,
        "metadata": None,
        "total": 3,
        "created_at": AT,
        "cancelled_at": None,
        "input_file_id": "file-abc",
        "status": "in_progress",
        "errors": None,
        "in_progress_at": None,
        "finalizing_at": None,
        "finished_at": None,
        "output_file_id": None,
        "error_file_id": None,
        **extra,
    }


def test_result_files_are_split_as_openai_splits_them() -> None:
    assert result_file_id(BATCH, "output") == f"file-{BATCH}-output"
    ok, late = job(JobState.SUCCEEDED), job(JobState.EXPIRED)
    assert [in_part(ok, p) for p in ("output", "error", None)] == [True, False, True]
    assert [in_part(late, p) for p in ("output", "error", None)] == [False, True, True]


def test_the_batch_shows_its_stored_status_times_and_files() -> None:
    checking = batch_view(batch_row(status="validating", total=5), {})
    assert (checking.status, checking.in_progress_at, checking.errors) == ("validating", None, None)
    errors = [{"code": "model_not_found", "message": "no", "param": "body.model", "line": 2}]
    failed = batch_view(batch_row(status="failed", errors=errors, finished_at=AT, total=0), {})
    assert failed.status == "failed"
    assert failed.failed_at == int(AT.timestamp())
    assert failed.errors is not None
    assert failed.errors.model_dump() == {"object": "list", "data": errors}
    running = batch_view(batch_row(in_progress_at=AT), {"succeeded": 1, "queued": 2})
    assert running.in_progress_at == int(AT.timestamp())
    assert (running.output_file_id, running.error_file_id, running.completed_at) == (None,) * 3
    ended = batch_view(
        batch_row(
            status="completed",
            finalizing_at=AT,
            finished_at=AT,
            output_file_id=f"file-{BATCH}-output",
        ),
        {"succeeded": 3},
    )
    assert (ended.finalizing_at, ended.completed_at) == (int(AT.timestamp()),) * 2
    assert (ended.output_file_id, ended.error_file_id) == (f"file-{BATCH}-output", None)
    assert ended.request_counts.model_dump() == {"total": 3, "completed": 3, "failed": 0}


def test_a_batch_is_its_lines_or_a_file_of_them() -> None:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}
    assert CreateBatch.model_validate({"requests": [line]}).input_file_id is None
    made = CreateBatch.model_validate(
        {"input_file_id": "file-abc", "endpoint": "/v1/completions", "completion_window": "24h"}
    )
    assert (made.input_file_id, made.requests) == ("file-abc", None)
    for neither_or_both in ({}, {"requests": [line], "input_file_id": "file-abc"}):
        with pytest.raises(ValidationError, match="either requests or input_file_id"):
            CreateBatch.model_validate(neither_or_both)
