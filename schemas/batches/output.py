"""OpenAI Batch output: one line per request (``response`` with the body its endpoint
answers in, ``usage`` from the engine's counts and ``finish_reason`` as the engine reported
it, or ``error``, an expired line's code being OpenAI's ``batch_expired``), and the ids of a
batch's output and error files. The same bodies answer the synchronous
``POST /v1/chat/completions`` and ``/v1/completions``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from schemas.jobs import FinishReason, Job, finish_reason_of
from schemas.states import JobState

# OpenAI's code of a line that did not run before its batch expired (its job ``expired``,
# whatever Sluicegate's own reason: ``deadline_passed``, ``deadline_unreachable``).
BATCH_EXPIRED = "batch_expired"


ResultPart = Literal["output", "error"]


def result_file_id(batch_id: str, part: ResultPart) -> str:
    """The id of a batch's output file (its succeeded lines) or error file (the rest), as
    OpenAI splits them: stored files (purpose ``batch_output``), written while the batch
    is finalizing."""
    return f"file-{batch_id}-{part}"


def in_part(job: Job, part: ResultPart | None) -> bool:
    """Whether a terminal job's line belongs in ``part`` (None: every line)."""
    if part is None:
        return True
    return (job.state is JobState.SUCCEEDED) == (part == "output")


def _usage(result: Mapping[str, Any]) -> dict[str, int]:
    """OpenAI's usage from the engine's counts (the worker stores both with the result)."""
    prompt_tokens = int(result.get("prompt_tokens", 0))
    output_tokens = int(result.get("output_tokens", 0))
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": prompt_tokens + output_tokens,
    }


def finish_reason(job: Job, result: Mapping[str, Any]) -> FinishReason:
    """Why the job's output ended, as its engine reported it (the result's
    ``finish_reason``); for a result written before results carried it, what its token
    count says (all of ``max_tokens`` decoded: ``length``)."""
    reported = finish_reason_of(result.get("finish_reason"))
    if reported is not None:
        return reported
    return "length" if int(result.get("output_tokens", 0)) >= job.max_tokens else "stop"


def response_body(endpoint: str, job: Job) -> dict[str, Any]:
    """A succeeded job's result in the shape its endpoint answers in (a batch's output
    line, or the synchronous /v1/chat/completions and /v1/completions)."""
    result = job.result or {}
    text = str(result.get("text", ""))
    usage = _usage(result)
    finish = finish_reason(job, result)
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
    return {"object": "job.result", "finish_reason": finish, "usage": usage, **result}


def result_line(endpoint: str, job: Job) -> dict[str, Any]:
    """One line of OpenAI Batch output for a terminal job: ``response`` when it
    succeeded, else ``error`` with the stop reason's code and message."""
    ended = job.state is JobState.SUCCEEDED
    error = None
    stop = job.error or {}
    reason = None if ended else str(stop.get("code", job.state.value))
    if reason is not None:
        message = str(stop.get("message", f"the job ended {job.state.value}"))
        if job.state is JobState.EXPIRED:  # OpenAI's code; Sluicegate's reason is kept
            error = {
                "code": BATCH_EXPIRED,
                "message": f"This line could not be executed before the batch expired "
                f"({reason}: {message})",
            }
        else:
            error = {"code": reason, "message": message}
    return {
        "id": f"batch_req_{job.id}",
        "custom_id": job.custom_id,
        "response": (
            {"status_code": 200, "request_id": job.id, "body": response_body(endpoint, job)}
            if ended
            else None
        ),
        "error": error,
        "sluicegate": {
            "job_id": job.id,
            "state": job.state.value,
            "finished_at": job.finished_at.isoformat() if job.finished_at else None,
            "decoded_tokens": job.decoded_tokens,
            "reason": reason,
        },
    }
