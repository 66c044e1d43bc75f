"""What `sluicegate jobs show ID` prints: a job's state, times and tokens, why its output ended
(finish_reason), a failed job's error or a succeeded job's text; an unknown id is one line."""

from __future__ import annotations

import asyncio
import io
import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from rich.console import Console, RenderableType

from client.api import ApiError, AsyncClient
from plumbing.settings import Settings
from schemas.api import GraphView
from schemas.jobs import Job, JobKind, Priority
from schemas.states import JobState
from schemas.timeline import JobTimeline
from sluicegate.commands import ops, views

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
SUMMARY = "The north lock reopened on Monday [after repairs]."


def text(renderable: RenderableType) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def job(state: JobState, **extra: Any) -> Job:
    fields: dict[str, Any] = {
        "id": "0195e0a4-0000-7000-8000-000000000001",
        "tenant": "t",
        "kind": JobKind.SUMMARIZE,
        "state": state,
        "priority": Priority.NORMAL,
        "max_tokens": 64,
        "deadline": AT,
        "callback_url": None,
        "idempotency_key": None,
        "created_at": AT,
        "updated_at": AT,
        "dispatched_at": AT,
        "started_at": AT,
        "finished_at": AT,
        "attempt": 1,
        "result": None,
        "error": None,
        "abandon_on_disconnect": False,
        "abandon_after_s": None,
        "last_seen_at": AT,
        "decoded_tokens": 64,
        **extra,
    }
    return Job(**fields)


def succeeded(finish_reason: str | None = "length") -> JobTimeline:
    result = {
        "text": SUMMARY,
        "engine": "sim",
        "served_model": "sim",
        "prompt_tokens": 120,
        "output_tokens": 64,
    }
    if finish_reason is not None:
        result["finish_reason"] = finish_reason
    return JobTimeline.of(job(JobState.SUCCEEDED, result=result), [])


def test_a_succeeded_job_shows_its_text_tokens_and_why_it_ended() -> None:
    timeline = succeeded()
    assert (timeline.finish_reason, timeline.text) == ("length", SUMMARY)
    shown = text(views.timeline(timeline))
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in shown.splitlines() if line}
    assert rows["state"] == "succeeded"
    assert rows["tokens"] == "120 in, 64 out"
    assert rows["finish"] == "length (cut at max_tokens: raise it for a whole output)"
    assert "error" not in rows
    # The text last, as it is (brackets are not markup).
    assert shown.rstrip().endswith(f"summary:\n{SUMMARY}")
    assert text(views.timeline(succeeded("stop"))).count("stop (the output ended)") == 1


def test_a_result_written_before_finish_reason_existed_shows_none() -> None:
    timeline = succeeded(finish_reason=None)
    assert timeline.finish_reason is None
    assert "finish" not in text(views.timeline(timeline)).split()


def test_a_failed_job_shows_its_error_code_and_message() -> None:
    error = {"code": "engine_unavailable", "message": "the server answered 503: [busy]"}
    timeline = JobTimeline.of(job(JobState.FAILED, error=error, decoded_tokens=3), [])
    shown = text(views.timeline(timeline))
    assert "error       engine_unavailable: the server answered 503: [busy]" in shown
    assert "summary:" not in shown
    assert "finish " not in shown
    dropped = {"code": "deadline_passed", "reason": "deadline_passed", "stage": "decode"}
    assert views.error_text(dropped) == "deadline_passed"


def answering(status: int, body: Any) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path.endswith("/timeline")  # never GET /v1/jobs/{id}: no renewal
        return httpx.Response(status, content=json.dumps(body).encode())

    return httpx.MockTransport(handler)


async def show(transport: httpx.MockTransport, job_id: str) -> tuple[int, str]:
    out = Console(width=200, record=True, file=io.StringIO())
    async with AsyncClient("http://api", transport=transport) as client:
        code = await ops._show(out, job_id)(client, asyncio.Event())
    return code, out.export_text()


async def test_jobs_show_prints_the_timeline_it_reads() -> None:
    body = succeeded().model_dump(mode="json")
    code, shown = await show(answering(200, body), str(body["id"]))
    assert code == 0
    assert "finish      length" in shown
    assert SUMMARY in shown


async def test_an_unknown_or_bad_id_is_one_line() -> None:
    error = {"error": {"code": "job_not_found", "message": "no job nope"}}
    with pytest.raises(ApiError) as refused:
        await show(answering(404, error), "nope")
    line = ops.refusal(refused.value, Settings())
    assert line == "refused: 404 job_not_found: no job nope"
    assert "\n" not in line


def test_a_documents_graph_is_one_line_of_its_progress() -> None:
    running = GraphView(
        chunks=15, level=1, levels=3, total=3, ended=2, prompt_tokens=1, output_tokens=1
    )
    assert views.graph_text(running) == "15 chunks in 3 levels: level 1 running, 2 of 3 ended"
    done = running.model_copy(update={"level": 2, "total": 1, "ended": 1})
    assert views.graph_text(done) == "15 chunks in 3 levels, all ended"
