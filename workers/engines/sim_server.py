"""``sluicegate sim-server``: the simulator engine behind an OpenAI-compatible HTTP server
shaped like ``vllm serve``, so the worker's ``vllm_http`` engine can be tried without a GPU.

What it serves, as vLLM does:

- ``POST /v1/completions``: ``model``, ``prompt`` (a string), ``max_tokens`` (default 16),
  ``stream``, ``stream_options.include_usage``. Streaming answers are server-sent events,
  ``data: {json}`` per decoded token with ``choices[0].text`` and, on the last token,
  ``finish_reason`` (``length`` when ``max_tokens`` cut the output, else ``stop``), then a
  usage chunk when asked for, then ``data: [DONE]``. The ``X-Request-Id`` header names the
  request in the engine (vLLM takes it the same way; the answer's id is ``cmpl-<id>``).
  A client that disconnects aborts its request and frees its KV blocks, as in vLLM.
  Extension: ``sluicegate_kind`` (``complete``, the default, or ``summarize``) picks the
  simulated output (a summary is an extract of the document inside the prompt); a real vLLM
  allows and ignores the field.
- ``GET /metrics``: vLLM's names and labels (``model_name``, ``engine``):
  ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
  (a fraction, 0..1), the counter ``vllm:num_preemptions`` (``vllm:num_preemptions_total``
  in the text), and ``vllm:cache_config_info`` (a gauge of 1 whose labels are the cache
  config: ``block_size``, ``num_gpu_blocks``, ...). vLLM counts in ``num_gpu_blocks`` one
  null block that no request ever holds and leaves it out of the usage fraction; the server
  does the same, so a client derives the same usable blocks from either.
- ``GET /health``, ``GET /v1/models``, ``POST /tokenize``.

Errors are OpenAI-style ``{"error": {"message", "type", "param", "code"}}``: 400 for bad
input and for a prompt plus ``max_tokens`` beyond the context (the whole KV cache here),
404 for an unknown model. An error after the stream began (the engine aborted the request,
or the server is shutting down) is sent as a ``data: {"error": ...}`` event before
``[DONE]``, as vLLM does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any, cast

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, Field

from schemas.jobs import JobKind
from workers.engines.base import GenerationRequest
from workers.engines.errors import EngineError, EngineNotRunning
from workers.engines.output import simulated_output
from workers.engines.prompts import document_of
from workers.engines.sim import SimEngine
from workers.tokens import count_tokens, tokenize

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
GRACEFUL_SHUTDOWN_S = 10
"""On shutdown, streams still open after this long are cut (their requests aborted)."""
STARTUP_S = 30.0
_VOCAB = 128_256  # token ids /tokenize reports are made-up hashes below this


class StreamOptions(BaseModel):
    include_usage: bool = True


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: str
    max_tokens: int = Field(default=16, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    sluicegate_kind: JobKind = JobKind.COMPLETE


class TokenizeRequest(BaseModel):
    model: str | None = None
    prompt: str


def error_response(status: HTTPStatus, message: str, kind: str | None = None) -> JSONResponse:
    return JSONResponse(_error_body(status, message, kind), status_code=status)


def _error_body(status: HTTPStatus, message: str, kind: str | None = None) -> dict[str, Any]:
    error = {"message": message, "type": kind or status.phrase, "param": None, "code": status}
    return {"error": error}


def _status(exc: EngineError) -> HTTPStatus:
    """vLLM answers 400 to a request it refuses, 503 when the engine cannot serve it."""
    return HTTPStatus.SERVICE_UNAVAILABLE if exc.retriable else HTTPStatus.BAD_REQUEST


def _sse(payload: object) -> str:
    return f"data: {json.dumps(payload)}\n\n"


class _VllmMetrics(Collector):
    """vLLM's scheduler and cache metrics, read from the engine at each scrape."""

    def __init__(self, engine: SimEngine, model: str) -> None:
        self._engine = engine
        self._labels = {"model_name": model, "engine": "0"}
        self._created = time.time()

    def collect(self) -> Iterator[Metric]:
        cap = self._engine.capacity()
        names, values = list(self._labels), list(self._labels.values())
        for name, doc, value in (
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                cap.running,
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                cap.waiting,
            ),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", cap.usage),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=names)
            gauge.add_metric(values, value)
            yield gauge
        preemptions = CounterMetricFamily(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            labels=names,
        )
        preemptions.add_metric(values, cap.preemptions, created=self._created)
        yield preemptions
        config = {
            "block_size": str(cap.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": "False",
            "engine": "0",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(cap.total_blocks + 1),  # + vLLM's null block
            "num_gpu_blocks_override": "None",
        }
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=list(config),
        )
        info.add_metric(list(config.values()), 1.0)
        yield info


def create_app(engine: SimEngine, *, model: str, max_model_len: int | None = None) -> FastAPI:
    """The server app; its lifespan starts and closes ``engine``. ``max_model_len``
    defaults to the whole KV cache in tokens."""
    context = max_model_len or engine.capacity().total_blocks * engine.block_size
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_VllmMetrics(engine, model))
    active: set[str] = set()  # request ids streaming or decoding now

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.close()

    app = FastAPI(title="sluicegate sim-server", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # vLLM turns FastAPI's 422 into a 400 too.
        problems = [
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors()
        ]
        return error_response(HTTPStatus.BAD_REQUEST, "; ".join(problems))

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=HTTPStatus.OK)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": model,
            "parent": None,
            "max_model_len": context,
            "permission": [],
        }
        return {"object": "list", "data": [card]}

    @app.post("/tokenize", response_model=None)
    async def tokenize_prompt(body: TokenizeRequest) -> dict[str, Any] | JSONResponse:
        if body.model is not None and body.model != model:
            return _unknown_model(body.model)
        ids = [zlib.crc32(piece.encode()) % _VOCAB for piece in tokenize(body.prompt)]
        return {"count": len(ids), "max_model_len": context, "tokens": ids}

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        if body.model is not None and body.model != model:
            return _unknown_model(body.model)
        request_id = raw.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        prompt_tokens = max(1, count_tokens(body.prompt))
        if prompt_tokens + body.max_tokens > context:
            return error_response(
                HTTPStatus.BAD_REQUEST,
                f"This model's maximum context length is {context} tokens. However, you "
                f"requested {prompt_tokens + body.max_tokens} tokens ({prompt_tokens} in the "
                f"prompt, {body.max_tokens} in the completion).",
                "BadRequestError",
            )
        if request_id in active:
            return error_response(
                HTTPStatus.BAD_REQUEST,
                f"Request id {request_id} already running.",
                "BadRequestError",
            )
        request = GenerationRequest(
            request_id=request_id,
            kind=body.sluicegate_kind,
            input=document_of(body.prompt)
            if body.sluicegate_kind is JobKind.SUMMARIZE
            else body.prompt,
            max_tokens=body.max_tokens,
        )
        completion = _Completion(engine, request, model=model, prompt_tokens=prompt_tokens)
        headers = {REQUEST_ID_HEADER: request_id}
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(
                completion.events(active, usage=usage),
                media_type="text/event-stream",
                headers=headers,
            )
        return await completion.whole(active, raw, headers)

    def _unknown_model(name: str) -> JSONResponse:
        return error_response(
            HTTPStatus.NOT_FOUND, f"The model `{name}` does not exist.", "NotFoundError"
        )

    return app


class _Completion:
    """One /v1/completions request on the engine."""

    def __init__(
        self, engine: SimEngine, request: GenerationRequest, *, model: str, prompt_tokens: int
    ) -> None:
        self.engine = engine
        self.request = request
        self.prompt_tokens = prompt_tokens
        self.expected = len(simulated_output(request))
        self.finish_reason = "length" if self.expected >= request.max_tokens else "stop"
        self.head = {
            "id": f"cmpl-{request.request_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
        }

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        return {**self.head, "choices": [choice]}

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }

    async def events(self, active: set[str], *, usage: bool) -> AsyncIterator[str]:
        """The SSE stream. Starlette cancels it when the client disconnects; closing the
        engine's stream then aborts the request there and frees its blocks."""
        active.add(self.request.request_id)
        sent = 0
        try:
            async with contextlib.aclosing(self._pieces()) as pieces:
                async for piece in pieces:
                    sent += 1
                    last = sent == self.expected
                    yield _sse(self.chunk(piece, self.finish_reason if last else None))
            if sent < self.expected:
                raise EngineNotRunning("the request was aborted in the engine")
            if self.expected == 0:
                yield _sse(self.chunk("", "stop"))
            if usage:
                yield _sse({**self.head, "choices": [], "usage": self.usage(sent)})
        except EngineError as exc:
            yield _sse(_error_body(_status(exc), str(exc)))
        finally:
            active.discard(self.request.request_id)
        yield "data: [DONE]\n\n"

    async def whole(self, active: set[str], raw: Request, headers: dict[str, str]) -> Response:
        """The non-streaming answer; a client that disconnects first aborts the request."""
        active.add(self.request.request_id)
        collect = asyncio.ensure_future(self._collect())
        gone = asyncio.ensure_future(_disconnected(raw))
        try:
            await asyncio.wait([collect, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            collect.cancel()  # no-op when done; else the generator closes: an abort
            await asyncio.wait([collect])
            active.discard(self.request.request_id)
        if collect.cancelled():
            return Response(status_code=499)  # nobody is listening
        try:
            pieces = collect.result()
        except EngineError as exc:
            return error_response(_status(exc), str(exc))
        if len(pieces) < self.expected:
            return error_response(
                HTTPStatus.SERVICE_UNAVAILABLE, "the request was aborted in the engine"
            )
        choice = self.chunk("".join(pieces), self.finish_reason)["choices"]
        body = {**self.head, "choices": choice, "usage": self.usage(len(pieces))}
        return JSONResponse(body, headers=headers)

    def _pieces(self) -> AsyncGenerator[str, None]:
        # SimEngine.generate is an async generator: closing it aborts the request.
        return cast(AsyncGenerator[str, None], self.engine.generate(self.request))

    async def _collect(self) -> list[str]:
        async with contextlib.aclosing(self._pieces()) as pieces:
            return [piece async for piece in pieces]


async def _disconnected(request: Request) -> None:
    """Return once the client has gone (the body was read already, as vLLM's
    ``with_cancellation`` also assumes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@asynccontextmanager
async def running(app: FastAPI, *, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn inside this block; yields its base URL (``port=0``: a
    free port). Leaving the block shuts the server down: new connections are refused, open
    streams get ``GRACEFUL_SHUTDOWN_S`` to finish, then the app's lifespan ends."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        ws="none",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(), name=f"sim-server-{host}:{port}")
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STARTUP_S
        # uvicorn offers a flag, no event, for "listening": a short poll with a deadline
        while not server.started and not task.done() and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if not server.started:
            raise RuntimeError(f"the sim-server did not start on {host}:{port}")
        bound = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        await task


async def serve(
    engine: SimEngine, *, host: str, port: int, model: str, stop: asyncio.Event
) -> None:
    """Run the sim-server until ``stop`` is set (SIGTERM or SIGINT under
    ``run_until_signal``)."""
    async with running(create_app(engine, model=model), host=host, port=port) as url:
        cap = engine.capacity()
        log.info(
            "sim-server: %s at %s, %d KV blocks of %d tokens",
            model,
            url,
            cap.total_blocks,
            cap.block_size,
        )
        await stop.wait()
    log.info("sim-server stopped")
