"""The sim-server's state and its requests: the engines behind it, the requests in flight
(each an OpenAI ``/v1/completions`` answer, streamed or whole, with vLLM's per-request
metrics), and the refusals vLLM answers before a request reaches an engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry

from workers.engines.base import GenerationRequest
from workers.engines.errors import EngineError
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.metrics import EngineGauges, RequestMetrics
from workers.engines.sim.output import simulated_output
from workers.engines.sim.protocol import (
    EOS_ID,
    CompletionRequest,
    engine_status,
    error_body,
    error_response,
    sampling_refusal,
    sse,
    token_id,
    unknown_model,
    validation_response,
)


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """How the server answers, as ``vllm serve``'s flags say."""

    served_model_names: tuple[str, ...]
    max_model_len: int | None = None  # None: one engine's whole KV cache in tokens
    stream_interval: int = 1
    enable_request_id_headers: bool = False


class Server:
    """The engines, the requests in flight, and what the endpoints share."""

    def __init__(self, engines: Sequence[SimEngine], config: ServerConfig) -> None:
        self.engines = engines
        self.config = config
        self.model = config.served_model_names[0]
        first = engines[0]
        self.context = config.max_model_len or first.capacity().total_blocks * first.block_size
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EngineGauges(engines, self.model))
        self.metrics = RequestMetrics(self.registry)
        self.requests: dict[str, set[Completion]] = {}  # external id -> in flight

    def engine_for(self) -> tuple[int, SimEngine]:
        """The engine with the most free blocks (vLLM's DP load balancing, simplified)."""
        index = max(range(len(self.engines)), key=lambda i: self.engines[i].capacity().free_blocks)
        return index, self.engines[index]

    async def abort(self, request_ids: list[str] | None) -> None:
        """Abort in the server, as /abort_requests, /pause and /sleep do."""
        for external in request_ids if request_ids else list(self.requests):
            for completion in list(self.requests.get(external, ())):
                await completion.abort()

    def refusal(self, body: CompletionRequest, prompt_tokens: int) -> JSONResponse | None:
        if body.model is not None and body.model not in self.config.served_model_names:
            return unknown_model(body.model)
        if (bad := sampling_refusal(body)) is not None:
            return validation_response(*bad)
        if body.max_tokens > self.context:
            return error_response(
                HTTPStatus.BAD_REQUEST,
                f"max_tokens={body.max_tokens} cannot be greater than "
                f"max_model_len={self.context}. Please request fewer output tokens.",
                "BadRequestError",
            )
        if prompt_tokens >= self.context:
            return error_response(
                HTTPStatus.BAD_REQUEST,
                f"This model's maximum context length is {self.context} tokens. However, your "
                f"request has {prompt_tokens} input tokens. Please reduce the length of the "
                "input messages.",
                "BadRequestError",
            )
        return None


class Completion:
    """One /v1/completions request on an engine."""

    def __init__(
        self,
        server: Server,
        engine: SimEngine,
        request: GenerationRequest,
        *,
        external: str,
        engine_index: int,
        body: CompletionRequest,
        prompt_tokens: int,
    ) -> None:
        self.server = server
        self.engine = engine
        self.request = request
        self.external = external
        self.labels = (server.model, str(engine_index))
        self.prompt_tokens = prompt_tokens
        self.interval = max(body.stream_interval or 1, server.config.stream_interval)
        self.token_ids = body.return_token_ids
        self.usage_asked = body.stream_options is not None and bool(
            body.stream_options.include_usage
        )
        self.expected = len(simulated_output(request))
        # An output shorter than max_tokens ends with the EOS token, whose text is empty.
        self.eos = self.expected < request.max_tokens
        self.arrived = time.monotonic()
        self.token_times: list[float] = []
        self.head = {
            "id": f"cmpl-{external}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": server.model,
        }

    async def abort(self) -> None:
        await self.engine.abort(self.request.request_id)

    def chunk(self, pieces: list[str], finish_reason: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "text": "".join(pieces),
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        if self.token_ids:
            choice["token_ids"] = [token_id(piece) if piece else EOS_ID for piece in pieces]
        return {**self.head, "choices": [choice]}

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }

    def _finish(self, generated: int) -> str:
        """Why the output ended (fewer tokens than it would have: aborted in the engine, by
        /abort_requests or otherwise); records vLLM's per-request metrics."""
        reason = "abort" if generated < self.expected else "stop" if self.eos else "length"
        self.server.metrics.finished(
            self.labels,
            prompt_tokens=self.prompt_tokens,
            generated=generated,
            token_times=self.token_times,
            arrived=self.arrived,
            reason=reason,
        )
        return reason

    async def events(self) -> AsyncIterator[str]:
        """The SSE stream. Starlette cancels it when the client disconnects; closing the
        engine's stream then aborts the request there and frees its blocks."""
        in_flight = self.server.requests.setdefault(self.external, set())
        in_flight.add(self)
        held: list[str] = []  # decoded, not sent yet
        pending: list[str] = []  # a chunk ready, sent once it is known not to be the last
        count = 0
        try:
            async with contextlib.aclosing(self._pieces()) as pieces:
                async for piece in pieces:
                    count += 1
                    held.append(piece)
                    if count == 1 or len(held) >= self.interval:
                        if pending:
                            yield sse(self.chunk(pending, None))
                        pending, held = held, []
            if self.eos and count == self.expected:
                held.append("")  # the EOS token ends the output; it has no text
                count += 1
            reason = self._finish(count)
            if held or reason == "abort":  # vLLM's abort output carries no new token
                if pending:
                    yield sse(self.chunk(pending, None))
                pending = held
            yield sse(self.chunk(pending, reason))
            if self.usage_asked:
                yield sse({**self.head, "choices": [], "usage": self.usage(count)})
        except EngineError as exc:
            yield sse(error_body(engine_status(exc), str(exc)))
        finally:
            in_flight.discard(self)
            if not in_flight:
                self.server.requests.pop(self.external, None)
        yield "data: [DONE]\n\n"

    async def whole(self, raw: Request, headers: dict[str, str]) -> Response:
        """The non-streaming answer; a client that disconnects first aborts the request."""
        collect = asyncio.ensure_future(self._collect())
        gone = asyncio.ensure_future(_disconnected(raw))
        try:
            await asyncio.wait([collect, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            collect.cancel()  # no-op when done; else the generator closes: an abort
            await asyncio.wait([collect])
        if collect.cancelled():
            return Response(status_code=499)  # nobody is listening
        try:
            pieces = collect.result()
        except EngineError as exc:
            return error_response(engine_status(exc), str(exc))
        pieces += [""] if self.eos and len(pieces) == self.expected else []
        reason = self._finish(len(pieces))
        choice = self.chunk(pieces, reason)["choices"]
        body = {**self.head, "choices": choice, "usage": self.usage(len(pieces))}
        return JSONResponse(body, headers=headers)

    async def _pieces(self) -> AsyncGenerator[str, None]:
        # Closing the engine's generation aborts the request.
        async with contextlib.aclosing(self.engine.generate(self.request)) as pieces:
            async for piece in pieces:
                self.token_times.append(time.monotonic())
                yield piece

    async def _collect(self) -> list[str]:
        async with contextlib.aclosing(self._pieces()) as pieces:
            return [piece async for piece in pieces]


async def _disconnected(request: Request) -> None:
    """Return once the client has gone (the body was read already, as vLLM's
    ``with_cancellation`` also assumes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
