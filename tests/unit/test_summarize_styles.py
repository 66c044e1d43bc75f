"""`sluicegate summarize --style/--instructions/--language/--words`: the summary each document
asks for, part of the batch's fingerprint; and the closing report naming the summaries the
engine cut at --max-tokens."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from client.api import AsyncClient
from client.summarize.report import cut_at_length, cut_text, finish_reason
from client.summarize.requests import InputError, build_requests, digest
from client.summarize.run import Options, summarize
from schemas.sampling import SummaryOptions, SummaryStyle
from sluicegate import cli
from sluicegate.commands.client import summary_of

MAX = 262_144


def folder(tmp_path: Path, **docs: str) -> Path:
    for name, text in docs.items():
        (tmp_path / f"{name}.txt").write_text(text)
    return tmp_path


def test_the_cli_names_the_styles() -> None:
    assert tuple(style.value for style in SummaryStyle) == cli.SUMMARY_STYLES


def args(*flags: str) -> Any:
    return cli._parser().parse_args(["summarize", "docs", *flags])


def test_the_flags_become_the_summary_asked_for() -> None:
    assert summary_of(args()) is None
    asked = summary_of(args("--style", "bullets", "--language", "French", "--words", "60"))
    assert asked == SummaryOptions(style=SummaryStyle.BULLETS, language="French", words=60)
    own = summary_of(args("--instructions", "Name every barge."))
    assert own == SummaryOptions(instructions="Name every barge.")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--words", "0"), "--words: Input should be greater than or equal to 1"),
        (("--language", "French; and ignore"), "--language: String should match pattern"),
        (("--style", "headline", "--instructions", "x"), "--style and --instructions: give"),
    ],
)
def test_a_bad_flag_is_named(flags: tuple[str, ...], said: str) -> None:
    with pytest.raises(InputError) as refused:
        summary_of(args(*flags))
    assert str(refused.value).startswith(said)


def test_every_document_asks_for_the_summary_and_the_fingerprint_holds_it(
    tmp_path: Path,
) -> None:
    source = folder(tmp_path, a="alpha", b="beta")
    plain = build_requests(source, max_tokens=64, max_bytes=MAX).requests
    assert [r["body"] for r in plain] == [
        {"input": "alpha", "max_tokens": 64},  # as before: a resumed run keeps its batch
        {"input": "beta", "max_tokens": 64},
    ]
    bullets = SummaryOptions(style=SummaryStyle.BULLETS, words=40)
    asked = build_requests(source, max_tokens=64, max_bytes=MAX, summary=bullets).requests
    assert [r["body"]["summary"] for r in asked] == [{"style": "bullets", "words": 40}] * 2
    headline = SummaryOptions(style=SummaryStyle.HEADLINE)
    other = build_requests(source, max_tokens=64, max_bytes=MAX, summary=headline).requests
    fingerprints = {digest(requests, "1h") for requests in (plain, asked, other)}
    assert len(fingerprints) == 3  # another style is another batch


def test_a_jsonl_files_lines_keep_their_own_summary(tmp_path: Path) -> None:
    lines = tmp_path / "in.jsonl"
    line = {"custom_id": "x", "method": "POST", "url": "/v1/summarize", "body": {"input": "d"}}
    lines.write_text(json.dumps(line) + "\n")
    with pytest.raises(InputError, match="--style, --instructions, --language and --words"):
        build_requests(
            lines, max_tokens=1, max_bytes=MAX, summary=SummaryOptions(style=SummaryStyle.BULLETS)
        )


def result(custom_id: str, finish: str | None, url: str = "/v1/summarize") -> dict[str, Any]:
    if finish is None:
        return {"custom_id": custom_id, "response": None, "error": {"code": "engine_error"}}
    if url == "/v1/summarize":
        body: dict[str, Any] = {"object": "job.result", "finish_reason": finish, "text": "s."}
    else:
        body = {"choices": [{"index": 0, "text": "s.", "finish_reason": finish}]}
    return {"custom_id": custom_id, "response": {"status_code": 200, "body": body}}


def test_the_summaries_cut_at_max_tokens_are_named(tmp_path: Path) -> None:
    assert finish_reason(result("a", "length")) == "length"
    assert finish_reason(result("a", "stop", "/v1/chat/completions")) == "stop"
    assert finish_reason(result("a", None)) is None
    out = tmp_path / "results.jsonl"
    lines = [
        result("a.txt", "length"),
        result("b.pdf", "stop"),
        result("c.md", None),
        result("d.txt", "length", "/v1/completions"),
    ]
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    cut = cut_at_length(out)
    assert cut == ["a.txt", "d.txt"]
    assert cut_text(cut, 128) == (
        "2 summaries were cut at --max-tokens (128): a.txt, d.txt; raise --max-tokens"
    )
    assert (
        cut_text(["x"], None) == "1 summary was cut at their max_tokens: x; raise it in their lines"
    )
    many = cut_text([f"{i}.txt" for i in range(13)], 64)
    assert many.startswith("13 summaries were cut at --max-tokens (64): 0.txt, 1.txt,")
    assert "9.txt and 3 more; raise --max-tokens" in many


BATCH = {
    "id": "batch_1",
    "object": "batch",
    "endpoint": "/v1/summarize",
    "completion_window": "1h",
    "status": "completed",
    "created_at": 1_700_000_000,
    "in_progress_at": None,
    "expires_at": 1_700_003_600,
    "completed_at": 1_700_000_100,
    "expired_at": None,
    "cancelling_at": None,
    "cancelled_at": None,
    "request_counts": {"total": 2, "completed": 2, "failed": 0},
    "metadata": None,
    "counts": {"succeeded": 2},
    "deadline": "2023-11-14T23:13:20Z",
    "callback_url": None,
    "results_url": "/v1/batches/batch_1/results",
}


class FakeApi:
    """The batch endpoints as a finished batch answers them; what was submitted."""

    def __init__(self) -> None:
        self.submitted: list[dict[str, Any]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            self.submitted = json.loads(request.content)["requests"]
            return httpx.Response(201, json=BATCH)
        if request.url.path.endswith("/results"):
            if request.url.params.get("after"):
                return httpx.Response(200, content=b"")
            finishes = {"a.txt": "length", "b.txt": "stop"}
            lines = [
                {**result(r["custom_id"], finishes[r["custom_id"]]), "sluicegate": {"job_id": i}}
                for i, r in enumerate(self.submitted)
            ]
            return httpx.Response(200, content="".join(json.dumps(x) + "\n" for x in lines))
        return httpx.Response(200, json=BATCH)


async def test_the_closing_report_names_the_cut_summaries(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    source = folder(tmp_path / "docs", a="alpha.", b="beta.")
    api = FakeApi()
    console = Console(width=200, record=True, file=io.StringIO())
    out = tmp_path / "results.jsonl"
    options = Options(
        window="1h",
        out=out,
        max_tokens=32,
        max_bytes=MAX,
        summary=SummaryOptions(style=SummaryStyle.KEY_FACTS),
    )
    async with AsyncClient("http://api", transport=httpx.MockTransport(api.handle)) as client:
        code = await summarize(client, source, options, console, poll_s=0)
    assert code == 0
    assert [r["body"]["summary"] for r in api.submitted] == [{"style": "key_facts"}] * 2
    said = console.export_text()
    assert "1 summary was cut at --max-tokens (32): a.txt; raise --max-tokens" in said
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [finish_reason(line) for line in written] == ["length", "stop"]
