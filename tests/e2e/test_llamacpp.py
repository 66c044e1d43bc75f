"""`sluicegate up --engine llamacpp` end to end with the real model (SmolLM2-135M on llama.cpp).

The model comes from `sluicegate model pull` (the README's commands and .ci/run run it first);
nothing here downloads. Model text is never compared to an expected string: it changes with
the thread count. What is checked is what the pipeline promises around it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from client.samples import sample_documents
from tests.e2e.stack import RunningStack, wait_terminal
from tests.support.llamacpp import bundled_model

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

DOC_CHARS = 900  # about 220 prompt tokens: a dozen prefills take seconds on 2 cores
SLOT_CONTEXT = 1024


def engine_url(stack: RunningStack) -> str:
    match = re.search(r"llama\.cpp\s+(http://\S+)", stack.log_text())
    assert match, f"no llama.cpp server in the banner:\n{stack.log_text()}"
    return match.group(1)


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in {url}/metrics")


def slots(url: str) -> list[dict[str, Any]]:
    answer: list[dict[str, Any]] = httpx.get(f"{url}/slots", timeout=5).json()
    return answer


def busy_slots(url: str) -> int:
    return sum(1 for slot in slots(url) if slot["is_processing"])


def decoding(url: str) -> bool:
    """Whether a slot is past its prefill, decoding tokens."""
    return any(
        slot["is_processing"] and slot.get("next_token", [{}])[0].get("n_decoded", 0) > 0
        for slot in slots(url)
    )


def documents(count: int) -> list[str]:
    samples = [text for _, text in sample_documents()]
    return [samples[i % len(samples)][: DOC_CHARS + 97 * (i // len(samples))] for i in range(count)]


def submit(client: httpx.Client, text: str, max_tokens: int) -> str:
    response = client.post(
        "/v1/jobs", json={"kind": "summarize", "input": text, "max_tokens": max_tokens}
    )
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


def wait_for(check: Callable[[], bool], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {within_s} s"
        time.sleep(0.05)


def test_real_model_summaries_cancel_and_a_job_too_large(stack_factory) -> None:
    stack = stack_factory(
        workers=1,
        args=["--engine", "llamacpp"],
        SLUICEGATE_LLAMACPP_MODEL_PATH=str(bundled_model()),
        SLUICEGATE_LLAMACPP_SLOT_CONTEXT=str(SLOT_CONTEXT),
    )
    url = engine_url(stack)
    predicted_before = metric(url, "llamacpp:tokens_predicted_total")
    texts = documents(12)
    with httpx.Client(base_url=stack.api_url, headers=stack.headers, timeout=10) as client:
        ids = [submit(client, text, max_tokens=48) for text in texts]
        views = wait_terminal(stack, ids, timeout_s=300)

        states = {view["state"] for view in views.values()}
        assert states == {"succeeded"}, [v["error"] for v in views.values()]
        output_tokens = 0
        for job_id, text in zip(ids, texts, strict=True):
            result = views[job_id]["result"]
            assert result["engine"] == "llamacpp"
            assert result["simulated"] is False
            assert result["served_model"] == bundled_model().stem  # as llama.cpp names it
            summary = result["text"].strip()
            assert summary, f"empty output for {job_id}"
            assert summary not in text, f"{job_id} copied its input: {summary!r}"
            assert 1 <= result["output_tokens"] <= 48
            output_tokens += result["output_tokens"]
        # A model this stack does not serve is refused, never answered by llama.cpp.
        refused = client.post(
            "/v1/jobs", json={"kind": "summarize", "input": texts[0], "model": "sim"}
        )
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"]["code"] == "model_not_found"
        # Token counts are the server's: what the jobs recorded is what llama.cpp decoded.
        predicted = metric(url, "llamacpp:tokens_predicted_total") - predicted_before
        assert output_tokens == predicted
        # Under the slot gate no request ever waited inside the server.
        assert metric(url, "llamacpp:requests_deferred") == 0

        # Cancelled mid-decode: the slot is free again at once.
        long_job = submit(client, "Write a very long story about a lighthouse.", 900)
        wait_for(lambda: decoding(url), 60, "the long job is not decoding")
        assert client.delete(f"/v1/jobs/{long_job}").status_code == 200
        cancelled_at = time.monotonic()
        wait_for(lambda: busy_slots(url) == 0, 5, "the cancelled job's slot was not freed")
        freed_s = time.monotonic() - cancelled_at
        print(f"slot free {freed_s * 1000:.0f} ms after the cancel")
        assert wait_terminal(stack, [long_job])[long_job]["state"] == "cancelled"

        # A job whose prompt and output cannot fit a slot ends with a stable error code.
        too_large = submit(client, texts[0], max_tokens=SLOT_CONTEXT)
        view = wait_terminal(stack, [too_large])[too_large]
        assert view["state"] == "failed"
        assert view["error"]["code"] == "request_too_large"
        assert busy_slots(url) == 0

    assert stack.stop() == 0
    assert not [p for p in stack.descendants if p.is_running() and p.status() != "zombie"]
