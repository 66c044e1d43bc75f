"""OpenAI's own Python client against `sluicegate up`, as a batch user's code runs it:
files.create → batches.create → batches.retrieve until it ends → files.content of its
output file; cancel, the error file, and the list paged by the client itself."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI
from openai.types import Batch

from tests.e2e.stack import RunningStack

ENDED = ("completed", "expired", "cancelled", "failed")


def request(custom_id: str) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "sim",  # the stack's engine, one of the served models
            "messages": [{"role": "user", "content": f"Summarize: document {custom_id}."}],
            "max_tokens": 16,
        },
    }


def client_of(stack: RunningStack) -> OpenAI:
    key = stack.headers["Authorization"].removeprefix("Bearer ")
    return OpenAI(base_url=f"{stack.api_url}/v1", api_key=key, max_retries=0)


def upload(client: OpenAI, tmp_path: Path, custom_ids: list[str]) -> str:
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(request(c)) + "\n" for c in custom_ids))
    with path.open("rb") as f:
        return client.files.create(file=f, purpose="batch").id


def statuses_until_ended(
    client: OpenAI, batch_id: str, first: str, timeout_s: float = 90
) -> tuple[list[str], Batch]:
    """Every status the batch showed, in order (repeats dropped): ``first`` (what the call
    that made or changed it answered), then each retrieve's; and the ended batch."""
    seen: list[str] = [first]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if not seen or seen[-1] != batch.status:
            seen.append(batch.status)
        if batch.status in ENDED:
            return seen, batch
        time.sleep(0.02)
    raise AssertionError(f"batch {batch_id} did not end: {seen}")


def wait_ended(client: OpenAI, batch_id: str, timeout_s: float = 90) -> Batch:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ENDED:
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} did not end: {batch}")


def lines_of(client: OpenAI, file_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_from_an_uploaded_file_completes_and_its_output_file_parses(
    stack_factory: Callable[..., RunningStack], tmp_path: Path
) -> None:
    with client_of(stack_factory(workers=1)) as client:
        run_to_the_end(client, tmp_path)


def run_to_the_end(client: OpenAI, tmp_path: Path) -> None:
    custom_ids = [f"doc-{i}" for i in range(5)]
    file_id = upload(client, tmp_path, custom_ids)
    made = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"who": "e2e"},
    )
    # Issue 31: a batch of an uploaded file is validating first (was in_progress at once).
    assert (made.status, made.input_file_id, made.metadata) == (
        "validating",
        file_id,
        {"who": "e2e"},
    )
    seen, done = statuses_until_ended(client, made.id, made.status)
    assert done.status == "completed", done
    order = ["validating", "in_progress", "finalizing", "completed"]
    assert seen[0] == "validating", seen
    assert seen == sorted(seen, key=order.index), seen
    assert done.in_progress_at is not None
    assert done.finalizing_at is not None
    assert done.completed_at is not None
    assert done.created_at <= done.in_progress_at <= done.finalizing_at <= done.completed_at
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (5, 5)
    assert done.error_file_id is None
    assert done.output_file_id is not None
    output = lines_of(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == custom_ids
    for line in output:
        body = line["response"]["body"]
        assert line["error"] is None
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"]
        usage = body["usage"]
        assert usage["prompt_tokens"] > 0, usage
        assert usage["completion_tokens"] > 0, usage
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    shown = client.files.retrieve(done.output_file_id)
    assert shown.purpose == "batch_output"
    assert done.output_file_id in [f.id for f in client.files.list()]
    assert [f.id for f in client.files.list(purpose="batch_output")] == [done.output_file_id]
    assert shown.bytes == len(client.files.content(done.output_file_id).content)


def test_cancel_fills_the_error_file_and_the_list_pages(
    stack_factory: Callable[..., RunningStack], tmp_path: Path
) -> None:
    # No worker: every job is still queued when its batch is cancelled.
    with client_of(stack_factory(workers=0)) as client:
        cancel_and_page(client, tmp_path)


def cancel_and_page(client: OpenAI, tmp_path: Path) -> None:
    file_id = upload(client, tmp_path, ["a", "b", "c"])
    made = [
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        for _ in range(3)
    ]
    listed = [batch.id for batch in client.batches.list(limit=2)]  # the client pages itself
    assert listed == [batch.id for batch in reversed(made)]
    for batch in made:  # validated (no worker: their jobs stay queued)
        while client.batches.retrieve(batch.id).status == "validating":
            time.sleep(0.05)
    cancelling = client.batches.cancel(made[0].id)
    assert cancelling.status == "cancelling"
    assert cancelling.cancelling_at is not None
    assert cancelling.cancelled_at is None
    seen, ended = statuses_until_ended(client, made[0].id, cancelling.status)
    assert ended.status == "cancelled"
    assert seen[0] == "cancelling", seen
    assert seen == sorted(seen, key=["cancelling", "finalizing", "cancelled"].index), seen
    assert ended.cancelled_at is not None
    assert ended.finalizing_at is not None
    assert cancelling.cancelling_at <= ended.finalizing_at <= ended.cancelled_at
    assert ended.output_file_id is None
    assert ended.error_file_id is not None
    errors = lines_of(client, ended.error_file_id)
    assert sorted(line["custom_id"] for line in errors) == ["a", "b", "c"]
    assert {line["error"]["code"] for line in errors} == {"cancelled"}
    assert all(line["response"] is None for line in errors)
    with pytest.raises(openai.NotFoundError) as missing:
        client.batches.create(
            input_file_id="file-0123456789abcdef01234567",
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
    assert missing.value.code == "file_not_found"
    with pytest.raises(openai.NotFoundError):
        client.files.content(f"file-{made[1].id}-output")  # still running: no such file yet


LONG_PROMPT = " ".join(f"w{j}" for j in range(200))


def line_of(custom_id: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": "sim", "prompt": prompt, "max_tokens": max_tokens}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}


def test_the_error_file_holds_the_expired_and_the_failed_lines(
    stack_factory: Callable[..., RunningStack], tmp_path: Path
) -> None:
    # A simulated GPU of 128 KV blocks (2,048 tokens), each step slowed a hundredfold (to
    # about 0.2 s); lag_soft 2 lets the meter release one batch job at a time, in the
    # file's order (one deadline, then submission order).
    stack = stack_factory(
        workers=1,
        SLUICEGATE_SIM_NUM_BLOCKS="128",
        SLUICEGATE_SIM_TIME_SCALE="100",
        SLUICEGATE_LAG_SOFT="2",
        SLUICEGATE_LAG_HARD="4",
    )
    with client_of(stack) as client:
        warm = wait_ended(client, create(client, tmp_path, [line_of("warm", "Hello.", 2)], "1h"))
        assert warm.status == "completed", warm  # the worker consumes: the clock is fair
        lines = [
            line_of("quick", "Say yes.", 1),  # two steps: ends well inside the window
            # More tokens than the whole KV cache holds: the engine refuses it.
            line_of("too-large", " ".join(f"word{i}" for i in range(3_000)), 4),
            # A 200-word prompt: the simulator's completion runs to max_tokens, 100 steps of
            # about 0.2 s. The first is cut off by the 8 s window while decoding, the others
            # expire held, never dispatched.
            *(line_of(f"slow-{i}", f"{i} {LONG_PROMPT}", 100) for i in range(4)),
        ]
        done = wait_ended(client, create(client, tmp_path, lines, "8s"))
        assert done.output_file_id is not None
        assert done.error_file_id is not None
        output = lines_of(client, done.output_file_id)
        errors = {line["custom_id"]: line for line in lines_of(client, done.error_file_id)}
    codes = {custom_id: line["error"]["code"] for custom_id, line in errors.items()}
    assert done.status == "expired", (done, codes)
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (6, 1), codes
    assert done.request_counts.failed == 5
    assert [line["custom_id"] for line in output] == ["quick"]
    # Issue 31: OpenAI's batch_expired (was Sluicegate's deadline_passed, still in the
    # message and in sluicegate.reason).
    assert codes == {
        "too-large": "request_too_large",
        **{f"slow-{i}": "batch_expired" for i in range(4)},
    }
    assert {errors[f"slow-{i}"]["sluicegate"]["reason"] for i in range(4)} == {"deadline_passed"}
    for line in errors.values():
        assert line["response"] is None
        assert line["id"].startswith("batch_req_")
        assert line["error"]["message"]
    decoded = [errors[f"slow-{i}"]["sluicegate"]["decoded_tokens"] for i in range(4)]
    assert decoded[0] > 0, decoded  # aborted mid-decode
    assert decoded[1:] == [None, None, None]  # never reached a worker


def create(client: OpenAI, tmp_path: Path, lines: list[dict[str, Any]], window: str) -> str:
    path = tmp_path / f"{lines[0]['custom_id']}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with path.open("rb") as f:
        file_id = client.files.create(file=f, purpose="batch").id
    batch = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/completions",
        completion_window=window,  # type: ignore[arg-type]  # OpenAI's is 24h only
    )
    return batch.id
