"""The sim-server speaks vLLM's HTTP: completions (whole and streamed), errors, metrics.
What every engine does, over this server too, is in test_engine_contract.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.jobs import JobKind
from workers.engines.base import GenerationRequest
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.output import simulated_output
from workers.engines.sim.protocol import EOS_ID
from workers.engines.sim.server import create_app, running
from workers.engines.sim.tokens import count_tokens

MODEL = "sim-8b"
BLOCKS = 64
DOC = " ".join(f"Sentence number {i} tells the simulator something new." for i in range(20))
PROMPT = "Write a short note about the harbour reopening and the winter fishing fleet."


@pytest.fixture
async def sim() -> AsyncIterator[SimEngine]:
    engine = SimEngine(num_blocks=BLOCKS, time_scale=0.02)
    await engine.start()
    yield engine
    await engine.close()


@pytest.fixture
async def client(sim: SimEngine) -> AsyncIterator[httpx.AsyncClient]:
    """The app in-process (its lifespan does not run: ``sim`` is started here)."""
    transport = httpx.ASGITransport(app=create_app(sim, model=MODEL))
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as http:
        yield http


@pytest.fixture
async def slow_server() -> AsyncIterator[tuple[SimEngine, str]]:
    """A real server over a slow simulator (a long output takes seconds)."""
    engine = SimEngine(num_blocks=BLOCKS, time_scale=2.0)
    async with running(create_app(engine, model=MODEL)) as url:
        yield engine, url


def summary(max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": DOC, "max_tokens": max_tokens, "sluicegate_kind": "summarize"}


def events(body: str) -> list[str]:
    return [line.removeprefix("data: ") for line in body.splitlines() if line]


async def test_an_unknown_model_is_404_as_in_vllm(client: httpx.AsyncClient) -> None:
    answer = await client.post("/v1/completions", json={"model": "other", "prompt": "hi"})
    assert answer.status_code == 404
    assert answer.json() == {
        "error": {
            "message": "The model `other` does not exist.",
            "type": "NotFoundError",
            "param": None,
            "code": 404,
        }
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": MODEL}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "sluicegate_kind": "translate"}, "sluicegate_kind"),
    ],
)
async def test_bad_input_is_a_400_openai_error(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    answer = await client.post("/v1/completions", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["type"]) == (400, "Bad Request")
    assert field in error["message"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        # vLLM 0.33, vllm/sampling_params.py 656-679 (SamplingParams._verify_args).
        ("temperature", -1.0, "temperature must be non-negative, got -1.0."),
        ("temperature", 3.0, "temperature must be in [0, 2], got 3.0."),
        ("top_p", 0.0, "top_p must be in (0, 1], got 0.0."),
        ("top_p", 1.5, "top_p must be in (0, 1], got 1.5."),
    ],
)
async def test_a_sampling_value_out_of_range_is_vllms_400(
    client: httpx.AsyncClient, field: str, value: float, message: str
) -> None:
    answer = await client.post("/v1/completions", json={"prompt": "hi", field: value})
    assert answer.status_code == 400
    error = answer.json()["error"]
    # vllm/entrypoints/serve/exception_handling/error_response.py 43-46: BadRequestError,
    # param set; vllm/exceptions.py 49-56: the message ends with the parameter and value.
    assert error == {
        "message": f"{message} (parameter={field}, value={value})",
        "type": "BadRequestError",
        "param": field,
        "code": 400,
    }
    fine = await client.post("/v1/completions", json={"prompt": "hi", field: 1.0})
    assert fine.status_code == 200, fine.text


async def test_malformed_json_is_a_400(client: httpx.AsyncClient) -> None:
    answer = await client.post(
        "/v1/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == 400


async def test_max_tokens_over_the_context_is_vllms_400(client: httpx.AsyncClient) -> None:
    answer = await client.post("/v1/completions", json=summary(BLOCKS * 16 + 1))
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == (
        "max_tokens=1025 cannot be greater than max_model_len=1024. "
        "Please request fewer output tokens."
    )


async def test_a_prompt_and_output_over_the_context_are_capped_not_refused(
    client: httpx.AsyncClient,
) -> None:
    # vLLM caps max_tokens to what the context leaves (entrypoints/serve/utils/api_utils.py).
    long_prompt = " ".join(["lock"] * 1000)
    body = {"prompt": long_prompt, "max_tokens": 500}
    answer = await client.post("/v1/completions", json=body)
    assert answer.status_code == 200
    usage = answer.json()["usage"]
    assert usage["prompt_tokens"] == count_tokens(long_prompt)
    assert usage["completion_tokens"] <= BLOCKS * 16 - usage["prompt_tokens"] < 500


async def test_a_whole_completion_has_the_text_the_id_and_the_usage(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.post(
        "/v1/completions", json=summary(9), headers={"X-Request-Id": "job-7"}
    )
    assert answer.status_code == 200
    body = answer.json()
    expected = simulated_output(
        GenerationRequest(request_id="x", kind=JobKind.SUMMARIZE, input=DOC, max_tokens=9)
    )
    assert len(expected) == 9
    assert (body["id"], body["object"], body["model"]) == ("cmpl-job-7", "text_completion", MODEL)
    [choice] = body["choices"]
    assert (choice["text"], choice["finish_reason"]) == ("".join(expected), "length")
    prompt = count_tokens(DOC)
    assert body["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 9,
        "total_tokens": prompt + 9,
    }


async def test_an_output_that_ends_before_max_tokens_stops(client: httpx.AsyncClient) -> None:
    answer = await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 500})
    [choice] = answer.json()["choices"]
    expected = simulated_output(
        GenerationRequest(request_id="x", kind=JobKind.COMPLETE, input=PROMPT, max_tokens=500)
    )
    assert len(expected) < 500
    assert (choice["text"], choice["finish_reason"]) == ("".join(expected), "stop")
    # The EOS token that ended it counts as generated, as in vLLM; its text is empty.
    assert answer.json()["usage"]["completion_tokens"] == len(expected) + 1


async def test_a_stream_is_one_event_per_token_then_usage_then_done(
    client: httpx.AsyncClient,
) -> None:
    body = {**summary(9), "stream": True, "stream_options": {"include_usage": True}}
    answer = await client.post("/v1/completions", json=body)
    assert answer.headers["content-type"].startswith("text/event-stream")
    *chunks, usage, done = events(answer.text)
    assert done == "[DONE]"
    parsed = [json.loads(chunk) for chunk in chunks]
    assert [c["choices"][0]["text"] for c in parsed] == simulated_output(
        GenerationRequest(request_id="x", kind=JobKind.SUMMARIZE, input=DOC, max_tokens=9)
    )
    assert [c["choices"][0]["finish_reason"] for c in parsed] == [None] * 8 + ["length"]
    assert json.loads(usage)["choices"] == []
    assert json.loads(usage)["usage"]["completion_tokens"] == 9


async def test_a_stream_without_stream_options_has_no_usage(client: httpx.AsyncClient) -> None:
    answer = await client.post("/v1/completions", json={**summary(3), "stream": True})
    *chunks, done = events(answer.text)
    assert done == "[DONE]"
    assert all("usage" not in json.loads(chunk) for chunk in chunks)
    assert len(chunks) == 3


async def test_metrics_carry_vllms_names_labels_and_units(
    client: httpx.AsyncClient, sim: SimEngine
) -> None:
    stream = sim.generate(
        GenerationRequest(request_id="a", kind=JobKind.SUMMARIZE, input=DOC, max_tokens=50)
    )
    await anext(stream)  # prefilled: the prompt's blocks are held
    held = BLOCKS - sim.capacity().free_blocks
    text = (await client.get("/metrics")).text
    await stream.aclose()

    samples = {
        sample.name: sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    labels = {"model_name": MODEL, "engine": "0"}
    assert samples["vllm:num_requests_running"].labels == labels
    assert samples["vllm:num_requests_running"].value == 1
    assert samples["vllm:num_requests_waiting"].value == 0
    assert samples["vllm:kv_cache_usage_perc"].value == pytest.approx(held / BLOCKS)
    assert 0 < held < BLOCKS
    assert "\nvllm:num_preemptions_total{" in text  # a counter, named as vLLM's exposition has it
    assert samples["vllm:num_preemptions_total"].labels == labels
    info = samples["vllm:cache_config_info"]
    assert info.value == 1.0
    assert info.labels["block_size"] == "16"
    assert info.labels["num_gpu_blocks"] == str(BLOCKS + 1)  # with vLLM's null block
    assert info.labels["engine"] == "0"


async def test_health_models_and_tokenize(client: httpx.AsyncClient) -> None:
    assert (await client.get("/health")).status_code == 200
    models = (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == BLOCKS * 16
    tokens = (await client.post("/tokenize", json={"prompt": PROMPT})).json()
    assert tokens["count"] == len(tokens["tokens"]) == count_tokens(PROMPT)


async def test_a_client_disconnect_aborts_the_request(
    slow_server: tuple[SimEngine, str],
) -> None:
    sim, url = slow_server
    async with (
        httpx.AsyncClient(base_url=url) as http,
        http.stream("POST", "/v1/completions", json={**summary(200), "stream": True}) as answer,
    ):
        await anext(answer.aiter_lines())
        assert sim.capacity().running == 1
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 0.5  # far less than the rest of the output would take
    while sim.capacity().free_blocks < BLOCKS:
        assert loop.time() < deadline
        await asyncio.sleep(0.005)
    assert sim.capacity().running == 0


async def test_duplicate_ids_are_accepted_and_a_server_abort_ends_with_abort(
    slow_server: tuple[SimEngine, str],
) -> None:
    sim, url = slow_server
    body = {**summary(200), "stream": True, "stream_options": {"include_usage": True}}
    headers = {"X-Request-Id": "job-9"}
    async with (
        httpx.AsyncClient(base_url=url) as http,
        http.stream("POST", "/v1/completions", json=body, headers=headers) as first,
        http.stream("POST", "/v1/completions", json=body, headers=headers) as second,
    ):
        assert first.status_code == second.status_code == 200  # vLLM makes ids unique inside
        assert "x-request-id" not in first.headers  # echoed only behind the flag
        lines = [first.aiter_lines(), second.aiter_lines()]
        for stream in lines:
            assert json.loads((await anext(stream)).removeprefix("data: "))["id"] == "cmpl-job-9"
        aborted = await http.post("/abort_requests", json={"request_ids": ["job-9"]})
        assert aborted.status_code == 200
        for stream in lines:
            rest = [
                json.loads(line.removeprefix("data: "))
                async for line in stream
                if line and "[DONE]" not in line
            ]
            *_, last, usage = rest
            assert last["choices"][0]["finish_reason"] == "abort"
            assert usage["usage"]["completion_tokens"] < 200
    assert sim.capacity().running == 0


async def test_the_request_id_header_is_echoed_behind_the_flag(sim: SimEngine) -> None:
    app = create_app(sim, model=MODEL, enable_request_id_headers=True)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://s"
    ) as http:
        answer = await http.post("/v1/completions", json=summary(3), headers={"X-Request-Id": "j1"})
    assert answer.headers["x-request-id"] == "j1"


async def test_stream_interval_and_token_ids_as_vllm_sends_them(sim: SimEngine) -> None:
    app = create_app(sim, model=MODEL, stream_interval=2)
    body = {"prompt": PROMPT, "max_tokens": 500, "stream": True, "return_token_ids": True,
            "stream_interval": 3, "stream_options": {"include_usage": True}}  # fmt: skip
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://s"
    ) as http:
        answer = await http.post("/v1/completions", json=body)
    *chunks, usage, done = events(answer.text)
    assert done == "[DONE]"
    chunks, usage = [json.loads(c) for c in chunks], json.loads(usage)
    choices = [chunk["choices"][0] for chunk in chunks]
    counts = [len(choice["token_ids"]) for choice in choices]
    # The first token alone, then every max(3, 2) tokens, the rest with the finish.
    assert counts[0] == 1
    assert set(counts[1:-1]) == {3}
    assert 1 <= counts[-1] <= 3
    assert choices[-1]["finish_reason"] == "stop"
    assert choices[-1]["token_ids"][-1] == EOS_ID  # the EOS that ended it, with no text
    expected = simulated_output(
        GenerationRequest(request_id="x", kind=JobKind.COMPLETE, input=PROMPT, max_tokens=500)
    )
    assert "".join(choice["text"] for choice in choices) == "".join(expected)
    assert sum(counts) == usage["usage"]["completion_tokens"] == len(expected) + 1


async def test_aliases_and_data_parallel_engines_as_vllm_reports_them() -> None:
    engines = [SimEngine(num_blocks=BLOCKS, time_scale=0.0) for _ in range(2)]
    app = create_app(engines[0], model=MODEL, aliases=["alias"], data_parallel=engines[1:])
    async with running(app) as url, httpx.AsyncClient(base_url=url) as http:
        names = [card["id"] for card in (await http.get("/v1/models")).json()["data"]]
        assert names == [MODEL, "alias"]
        done = await http.post("/v1/completions", json={**summary(5), "model": "alias"})
        assert done.status_code == 200
        text = (await http.get("/metrics")).text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    rows = [s.labels for s in samples if s.name == "vllm:cache_config_info"]
    # The DP-wide total on every engine's row, as vLLM's frontend writes it.
    assert sorted(r["engine"] for r in rows) == ["0", "1"]
    assert {r["num_gpu_blocks"] for r in rows} == {str(2 * (BLOCKS + 1))}
    usage = {s.labels["engine"] for s in samples if s.name == "vllm:kv_cache_usage_perc"}
    assert usage == {"0", "1"}
    assert all(s.labels["model_name"] == MODEL for s in samples if "model_name" in s.labels)


async def test_request_counters_and_histograms_fill_vllms_dashboard(
    client: httpx.AsyncClient,
) -> None:
    await client.post("/v1/completions", json=summary(9))
    text = (await client.get("/metrics")).text
    samples = {
        (s.name, s.labels.get("finished_reason"), s.labels.get("le")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("vllm:generation_tokens_total", None, None)] == 9
    assert samples[("vllm:prompt_tokens_total", None, None)] == count_tokens(DOC)
    assert samples[("vllm:request_success_total", "length", None)] == 1
    for name in (
        "vllm:e2e_request_latency_seconds",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
    ):
        assert samples[(f"{name}_count", None, None)] >= 1
    assert samples[("vllm:inter_token_latency_seconds_count", None, None)] == 8
    assert ("vllm:e2e_request_latency_seconds_bucket", None, "7680.0") in samples
