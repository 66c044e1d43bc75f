"""The llama.cpp engine against answers shaped as llama.cpp's server sends them, without the
model: what it is asked (a summary's instruction as the system message) and how a stream
ends (the last chunk's ``finish_reason``, then the usage chunk, then ``[DONE]``).
tests/contract/test_llamacpp_contract.py checks the same on the real server and model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from schemas.jobs import JobKind
from workers.engines.base import GenerationRequest, SamplingParams
from workers.engines.errors import EngineError, EngineUnavailable
from workers.engines.llamacpp.engine import LlamaCppEngine
from workers.engines.prompts import chat_messages
from workers.engines.sim.server import running

DOC = "The lock reopened on Monday after three weeks of repairs."
SLOT_CONTEXT = 512


@dataclass
class FakeLlama:
    """What the server answers; the chat bodies it was sent."""

    deltas: list[str] = field(default_factory=list)
    finish: str | None = "stop"
    usage: int | None = None
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/props")
        async def props() -> dict[str, Any]:
            return {
                "total_slots": 2,
                "default_generation_settings": {"n_ctx": SLOT_CONTEXT},
                "model_path": "/models/small.gguf",
                "model_alias": "small",
            }

        @app.get("/slots")
        async def slots() -> list[dict[str, Any]]:
            return [{"id": 0, "is_processing": False}, {"id": 1, "is_processing": False}]

        @app.get("/metrics")
        async def metrics() -> PlainTextResponse:
            return PlainTextResponse("llamacpp:requests_deferred 0\n")

        @app.post("/apply-template")
        async def apply_template(request: Request) -> dict[str, str]:
            messages = (await request.json())["messages"]
            return {"prompt": "\n".join(m["content"] for m in messages)}

        @app.post("/tokenize")
        async def tokenize(request: Request) -> dict[str, list[int]]:
            return {"tokens": list(range(len((await request.json())["content"].split())))}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> StreamingResponse:
            body = await request.json()
            self.bodies.append(body)
            return StreamingResponse(self._events(body), media_type="text/event-stream")

        return app

    async def _events(self, body: dict[str, Any]) -> AsyncIterator[str]:
        def event(choices: list[dict[str, Any]], **extra: Any) -> str:
            chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": choices}
            return f"data: {json.dumps({**chunk, **extra})}\n\n"

        for text in self.deltas:
            yield event([{"index": 0, "finish_reason": None, "delta": {"content": text}}])
        if self.finish is not None:
            yield event([{"index": 0, "finish_reason": self.finish, "delta": {}}])
        if self.usage is not None and (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 9, "completion_tokens": self.usage}
            yield event([], usage={**usage, "total_tokens": 9 + self.usage})
        yield "data: [DONE]\n\n"


@pytest.fixture
def fake() -> FakeLlama:
    return FakeLlama()


@pytest.fixture
async def engine(fake: FakeLlama) -> AsyncIterator[LlamaCppEngine]:
    async with running(fake.app()) as url:
        engine = LlamaCppEngine(base_url=url, poll_interval_s=0.01)
        await engine.start()
        try:
            yield engine
        finally:
            await engine.close()


def summary(instruction: str | None = None, max_tokens: int = 40) -> GenerationRequest:
    sampling = SamplingParams(instruction=instruction) if instruction else None
    return GenerationRequest(
        request_id="r1", kind=JobKind.SUMMARIZE, input=DOC, max_tokens=max_tokens, sampling=sampling
    )


@pytest.mark.parametrize("reason", ["stop", "length"])
async def test_the_stream_ends_with_the_servers_finish_reason(
    engine: LlamaCppEngine, fake: FakeLlama, reason: str
) -> None:
    fake.deltas, fake.finish, fake.usage = [" The lock", " reopened."], reason, 4
    stream = engine.generate(summary())
    # One item a chunk, then empty ones up to the server's count of tokens.
    assert [piece async for piece in stream] == [" The lock", " reopened.", "", ""]
    assert stream.finish_reason == reason


async def test_a_summary_asks_with_its_own_instruction(
    engine: LlamaCppEngine, fake: FakeLlama
) -> None:
    own = "List the key facts, one a line. Write your answer in French."
    await anext(engine.generate(summary(own)), None)
    await anext(engine.generate(summary()), None)
    assert fake.bodies[0]["messages"] == chat_messages(JobKind.SUMMARIZE, DOC, own)
    assert fake.bodies[0]["messages"][0] == {"role": "system", "content": own}
    assert fake.bodies[1]["messages"] == chat_messages(JobKind.SUMMARIZE, DOC)


async def test_an_output_without_a_whole_end_is_no_success(
    engine: LlamaCppEngine, fake: FakeLlama
) -> None:
    fake.deltas, fake.finish = [" The"], None  # the stream ended before a finish_reason
    cut = engine.generate(summary())
    with pytest.raises(EngineUnavailable):
        _ = [piece async for piece in cut]
    assert cut.finish_reason is None
    fake.finish = "abort"
    other = engine.generate(summary())
    with pytest.raises(EngineError):
        _ = [piece async for piece in other]
    assert other.finish_reason is None
