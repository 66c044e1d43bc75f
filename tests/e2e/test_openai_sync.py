"""OpenAI's own client against `sluicegate up` beyond batches: synchronous chat and text
completions served as pipeline jobs, the models list, streaming and unknown endpoints
refused with a code that says what to use, and a batch whose file has bad lines failing
with OpenAI's errors.data. One stack for the module's checks."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from tests.e2e.stack import RunningStack


def client_of(stack: RunningStack) -> OpenAI:
    key = stack.headers["Authorization"].removeprefix("Bearer ")
    return OpenAI(base_url=f"{stack.api_url}/v1", api_key=key, max_retries=0)


def test_the_openai_client_beyond_batches(
    stack_factory: Callable[..., RunningStack], tmp_path: Path
) -> None:
    stack = stack_factory(workers=1)
    with client_of(stack) as client:
        models(client)
        chat(client, stack)
        text(client)
        refusals(client)
        failed_batch(client, tmp_path)


def models(client: OpenAI) -> None:
    listed = [m.id for m in client.models.list()]
    assert "sim" in listed, listed
    assert client.models.retrieve("sim").id == "sim"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-nope")
    assert missing.value.code == "model_not_found"


def chat(client: OpenAI, stack: RunningStack) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="sim", messages=[{"role": "user", "content": "Summarize: gates hold."}], max_tokens=8
    )
    completion = raw.parse()
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert completion.usage.completion_tokens > 0
    job_id = raw.headers["X-Sluicegate-Job-Id"]
    assert completion.id == f"chatcmpl-{job_id}"
    job = httpx.get(f"{stack.api_url}/v1/jobs/{job_id}", headers=stack.headers).json()
    assert (job["state"], job["priority"], job["kind"]) == ("succeeded", "high", "complete"), job
    assert job["result"]["text"] == completion.choices[0].message.content


def text(client: OpenAI) -> None:
    completion = client.completions.create(model="sim", prompt="Say yes.", max_tokens=4)
    assert completion.object == "text_completion"
    assert completion.choices[0].text
    assert completion.usage is not None
    assert completion.usage.total_tokens > 0


def refusals(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as streamed:
        client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    assert streamed.value.code == "stream_unsupported"
    assert "batch" in streamed.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        client.embeddings.create(model="sim", input="hi")
    assert unknown.value.code == "unknown_endpoint"
    assert "/v1/chat/completions" in unknown.value.message
    with pytest.raises(openai.APIStatusError) as late:
        client.chat.completions.create(
            model="sim",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4000,
            extra_headers={"X-Sluicegate-Deadline-S": "0.05"},
        )
    # Past its deadline (or refused at admission as unreachable): a coded error either way.
    assert (late.value.status_code, late.value.code) in (
        (504, "deadline_exceeded"),
        (429, "deadline_unreachable"),
    ), late.value


def failed_batch(client: OpenAI, tmp_path: Path) -> None:
    good = {
        "custom_id": "ok",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "sim", "messages": [{"role": "user", "content": "hi"}]},
    }
    unknown = {**good, "custom_id": "who", "body": {**good["body"], "model": "gpt-nope"}}
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n{not json\n" + json.dumps(unknown) + "\n")
    with path.open("rb") as f:
        file_id = client.files.create(file=f, purpose="batch").id  # taken, as OpenAI does
    made = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert made.status == "validating"
    deadline = time.monotonic() + 30
    while (batch := client.batches.retrieve(made.id)).status == "validating":
        assert time.monotonic() < deadline, batch
        time.sleep(0.05)
    assert batch.status == "failed", batch
    assert batch.failed_at is not None
    assert batch.errors is not None
    assert batch.errors.data is not None
    assert [(e.line, e.code) for e in batch.errors.data] == [
        (2, "invalid_json_line"),
        (3, "model_not_found"),
    ]
    assert batch.errors.data[1].param == "body.model"
