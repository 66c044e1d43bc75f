"""The HTTP engine against answers shaped as vLLM 0.33 sends them (not as sim-server did).

Each answer below follows the vLLM source (paths inside its ``vllm/`` package):
- stream chunks: ``entrypoints/openai/completion/serving.py`` ~430-480 (``text`` may be empty,
  ``token_ids`` when ``return_token_ids``, several tokens a chunk with ``stream_interval``),
  then a usage chunk when ``stream_options.include_usage``, then ``[DONE]``;
- a request the server aborts (``/pause``, ``/sleep``, ``/abort_requests``) ends with a chunk
  whose ``finish_reason`` is "abort" (``v1/engine/output_processor.py`` ~636-648);
- ``max_tokens`` over ``max_model_len``: 400 with the message of ``renderers/params.py`` ~277;
- ``GET /v1/models``: one card per served name, each with ``max_model_len``
  (``entrypoints/openai/models/serving.py`` ~64-76); metrics carry the FIRST served name
  (``config/model.py`` ~2323).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from schemas.jobs import JobKind
from workers.engines.base import Generation, GenerationRequest, SamplingParams
from workers.engines.errors import EngineAborted, EngineError, RequestTooLarge
from workers.engines.prompts import build_prompt
from workers.engines.sim.server import running
from workers.engines.vllm.http import VllmHttpEngine

PRIMARY = "meta-llama/Llama-3.1-8B-Instruct"
ALIAS = "llama-8b"
METRICS = f"""\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{PRIMARY}"}} 0.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{PRIMARY}"}} 0.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",engine="0",num_gpu_blocks="101"}} 1.0
"""


@dataclass
class FakeVllm:
    """What the server answers; what it was asked."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    usage: int | None = None
    max_model_len: int = 4096
    bodies: list[dict[str, Any]] = field(default_factory=list)
    refusal: tuple[int, str] | None = None

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/metrics")
        async def metrics() -> PlainTextResponse:
            return PlainTextResponse(METRICS)

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            cards = [
                {
                    "id": name,
                    "object": "model",
                    "root": "/models/llama",
                    "max_model_len": self.max_model_len,
                }
                for name in (PRIMARY, ALIAS)
            ]
            return {"object": "list", "data": cards}

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await request.json()
            self.bodies.append(body)
            if self.refusal is not None:
                status, message = self.refusal
                error = {
                    "message": message,
                    "type": "BadRequestError",
                    "param": None,
                    "code": status,
                }
                return JSONResponse({"error": error}, status_code=status)
            return StreamingResponse(self._events(body), media_type="text/event-stream")

        return app

    async def _events(self, body: dict[str, Any]) -> AsyncIterator[str]:
        for chunk in self.chunks:
            choice = {"index": 0, "logprobs": None, "stop_reason": None, **chunk}
            if not body.get("return_token_ids"):
                choice.pop("token_ids", None)
            event = {"id": "cmpl-1", "object": "text_completion", "choices": [choice]}
            yield f"data: {json.dumps(event)}\n\n"
        if self.usage is not None and (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": 9,
                "completion_tokens": self.usage,
                "total_tokens": 9 + self.usage,
            }
            yield f"data: {json.dumps({'id': 'cmpl-1', 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"


def chunk(text: str, token_ids: list[int], finish: str | None = None) -> dict[str, Any]:
    return {"text": text, "token_ids": token_ids, "finish_reason": finish}


DOC = "The lock reopened on Monday after three weeks of repairs."


def summary(max_tokens: int = 50) -> GenerationRequest:
    return GenerationRequest(
        request_id="r1", kind=JobKind.SUMMARIZE, input=DOC, max_tokens=max_tokens
    )


@pytest.fixture
def fake() -> FakeVllm:
    return FakeVllm()


@pytest.fixture
async def engine(fake: FakeVllm) -> AsyncIterator[VllmHttpEngine]:
    async with running(fake.app()) as url:
        engine = VllmHttpEngine(base_url=url, model=PRIMARY, metrics_interval_s=0.01)
        await engine.start()
        try:
            yield engine
        finally:
            await engine.close()


async def collect(engine: VllmHttpEngine, request: GenerationRequest) -> list[str]:
    return [piece async for piece in engine.generate(request)]


async def test_a_summary_is_sent_with_its_instruction(
    engine: VllmHttpEngine, fake: FakeVllm
) -> None:
    fake.chunks = [chunk(" Reopened.", [11], "stop")]
    await collect(engine, summary())
    assert fake.bodies[0]["prompt"] == build_prompt(JobKind.SUMMARIZE, DOC)


async def test_a_summary_is_sent_with_its_own_instruction(
    engine: VllmHttpEngine, fake: FakeVllm
) -> None:
    fake.chunks = [chunk(" Reopened.", [11], "stop")]
    own = "List the key facts of the following document."
    asked = GenerationRequest(
        request_id="r2",
        kind=JobKind.SUMMARIZE,
        input=DOC,
        max_tokens=50,
        sampling=SamplingParams(instruction=own),
    )
    await collect(engine, asked)
    assert fake.bodies[0]["prompt"] == build_prompt(JobKind.SUMMARIZE, DOC, own)
    assert fake.bodies[0]["prompt"].startswith(own)


@pytest.mark.parametrize("reason", ["stop", "length"])
async def test_the_stream_ends_with_the_servers_finish_reason(
    engine: VllmHttpEngine, fake: FakeVllm, reason: str
) -> None:
    # The reason comes on the last choice, then the usage chunk, then [DONE].
    fake.chunks = [chunk(" The lock", [1, 2]), chunk(" reopened", [3], reason)]
    fake.usage = 3
    stream = engine.generate(summary())
    assert [piece async for piece in stream] == [" The lock", "", " reopened"]
    assert stream.finish_reason == reason


async def test_a_stream_cut_before_its_finish_reason_is_not_a_success(
    engine: VllmHttpEngine, fake: FakeVllm
) -> None:
    fake.chunks = [chunk(" The", [1])]  # no finish_reason: the server went away
    stream = engine.generate(summary())
    with pytest.raises(EngineError):
        await collect_from(stream)
    assert stream.finish_reason is None


async def collect_from(stream: Generation) -> list[str]:
    return [piece async for piece in stream]


async def test_a_server_side_abort_is_not_a_success(engine: VllmHttpEngine, fake: FakeVllm) -> None:
    fake.chunks = [chunk(" The", [1]), chunk(" lock", [2]), chunk("", [], "abort")]
    with pytest.raises(EngineAborted) as caught:
        await collect(engine, summary())
    assert caught.value.retriable


async def test_an_error_finish_is_an_engine_error(engine: VllmHttpEngine, fake: FakeVllm) -> None:
    fake.chunks = [chunk(" The", [1]), chunk("", [], "error")]
    with pytest.raises(EngineError):
        await collect(engine, summary())


async def test_multi_token_and_empty_chunks_count_every_token(
    engine: VllmHttpEngine, fake: FakeVllm
) -> None:
    # stream_interval=3: 7 tokens in 3 chunks, one of them an EOS with no text.
    fake.chunks = [
        chunk(" The lock re", [1, 2, 3]),
        chunk("opened today", [4, 5, 6]),
        chunk("", [7], "stop"),
    ]
    fake.usage = 7
    pieces = await collect(engine, summary())
    assert len(pieces) == 7
    assert "".join(pieces) == " The lock reopened today"
    assert fake.bodies[0]["return_token_ids"] is True
    assert fake.bodies[0]["stream_options"] == {"include_usage": True}


async def test_prompt_and_output_over_the_context_are_refused_before_sending(
    engine: VllmHttpEngine, fake: FakeVllm
) -> None:
    fake.max_model_len = 64
    await engine.refresh_models()
    with pytest.raises(RequestTooLarge):
        await collect(engine, summary(max_tokens=60))  # vLLM would cap it silently
    assert fake.bodies == []


async def test_vllms_max_tokens_message_is_a_length_error(
    engine: VllmHttpEngine, fake: FakeVllm
) -> None:
    fake.refusal = (
        400,
        "max_tokens=9000 cannot be greater than max_model_len=4096. "
        "Please request fewer output tokens.",
    )
    with pytest.raises(RequestTooLarge):
        await collect(engine, summary(max_tokens=50))


async def test_an_alias_finds_the_metrics_of_the_first_served_name(fake: FakeVllm) -> None:
    async with running(fake.app()) as url:
        engine = VllmHttpEngine(base_url=url, model=ALIAS, metrics_interval_s=0.01)
        await engine.start()
        try:
            assert engine.capacity().total_blocks == 100
        finally:
            await engine.close()


async def test_a_model_the_server_does_not_serve_is_a_clear_error(fake: FakeVllm) -> None:
    async with running(fake.app()) as url:
        engine = VllmHttpEngine(
            base_url=url, model="gpt-4", metrics_interval_s=0.01, ready_timeout_s=2
        )
        with pytest.raises(EngineError, match=r"gpt-4.*llama-8b"):
            await engine.start()
        await engine.close()
