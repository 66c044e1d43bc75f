"""``sluicegate sim-server``: the simulator engine behind an OpenAI-compatible HTTP server
that answers as ``vllm serve`` 0.33 does (paths below are inside vLLM's ``vllm/`` package), so
the worker's ``vllm_http`` engine can be tried, and tested, without a GPU.

- ``POST /v1/completions``: ``model``, ``prompt`` (a string), ``max_tokens`` (default 16),
  ``stream``, ``stream_options.include_usage`` (off unless asked:
  ``entrypoints/generate/base/protocol.py`` ~293), ``stream_interval``, ``return_token_ids``.
  Unknown fields are allowed, as vLLM allows them (``entrypoints/serve/engine/protocol.py``
  ~39). Streaming answers are server-sent events: the first token alone, then a chunk every
  ``stream_interval`` tokens (the larger of the request's and the server's, default 1:
  ``v1/engine/output_processor.py`` ~300-302 and ~379-400), each with its ``token_ids`` when
  asked; an output that ends by itself ends with the EOS token, whose text is empty; then a
  usage chunk when asked for, then ``data: [DONE]``.
- Sizes: ``max_tokens`` over ``max_model_len`` is a 400 with vLLM's message
  (``renderers/params.py`` ~277); a prompt plus ``max_tokens`` over the context is not an
  error: ``max_tokens`` is capped to what the context leaves
  (``entrypoints/serve/utils/api_utils.py`` ~234); a prompt larger than the context is a 400.
- Request ids: the ``X-Request-Id`` header names the request; duplicates are accepted (vLLM
  makes internal ids unique: ``v1/engine/async_llm.py`` ~630); the answer's id is
  ``cmpl-<id>``. The header is echoed only with ``enable_request_id_headers``
  (``entrypoints/serve/middleware/register.py`` ~38).
- A client that disconnects aborts its request and frees its KV blocks. ``POST
  /abort_requests`` (``{"request_ids": [...]}``, empty for all;
  ``entrypoints/rl/online/api_router.py`` ~97) aborts in the server: the stream ends with a
  chunk whose ``finish_reason`` is "abort", then ``[DONE]``
  (``v1/engine/output_processor.py`` ~636-648), as ``/pause`` and ``/sleep`` end requests.
- Models: the served names (the first is the metrics' ``model_name``:
  ``config/model.py`` ~2323), each a card in ``GET /v1/models`` with ``max_model_len``.
- Data parallelism: ``data_parallel_size`` engines of the same size, a request going to the
  one with the most free blocks; metrics per engine (``sim_metrics``).
- ``GET /metrics``, ``GET /health``, ``POST /tokenize``.

Extension: ``sluicegate_kind`` (``complete``, the default, or ``summarize``) picks the
simulated output (a summary is an extract of the document inside the prompt); a real vLLM
allows and ignores the field.

Errors are OpenAI-style ``{"error": {"message", "type", "param", "code"}}``: 400 for bad
input, 404 for an unknown model. An error after the stream began is sent as a
``data: {"error": ...}`` event before ``[DONE]``, as vLLM does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from schemas.jobs import JobKind
from workers.engines.base import GenerationRequest
from workers.engines.errors import EngineError
from workers.engines.output import simulated_output
from workers.engines.prompts import document_of
from workers.engines.sim import SimEngine
from workers.engines.sim_metrics import EngineGauges, RequestMetrics
from workers.tokens import count_tokens, tokenize

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
GRACEFUL_SHUTDOWN_S = 10
"""On shutdown, streams still open after this long are cut (their requests aborted)."""
STARTUP_S = 30.0
_VOCAB = 128_256  # token ids /tokenize reports are made-up hashes below this
EOS_ID = 128_009  # the id of the token that ends an output by itself (Llama 3's <|eot_id|>)


class StreamOptions(BaseModel):
    include_usage: bool | None = False


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # as vLLM's OpenAIBaseModel

    model: str | None = None
    prompt: str
    max_tokens: int = Field(default=16, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stream_interval: int | None = Field(default=None, ge=1)
    return_token_ids: bool = False
    sluicegate_kind: JobKind = JobKind.COMPLETE


class TokenizeRequest(BaseModel):
    model: str | None = None
    prompt: str


class AbortRequest(BaseModel):
    request_ids: list[str] | None = None


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """How the server answers, as ``vllm serve``'s flags say."""

    served_model_names: tuple[str, ...]
    max_model_len: int | None = None  # None: one engine's whole KV cache in tokens
    stream_interval: int = 1
    enable_request_id_headers: bool = False


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


def _token_id(piece: str) -> int:
    return zlib.crc32(piece.encode()) % _VOCAB


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
        self.requests: dict[str, set[_Completion]] = {}  # external id -> in flight

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


def unknown_model(name: str) -> JSONResponse:
    return error_response(
        HTTPStatus.NOT_FOUND, f"The model `{name}` does not exist.", "NotFoundError"
    )


def create_app(
    engine: SimEngine,
    *,
    model: str,
    max_model_len: int | None = None,
    aliases: Sequence[str] = (),
    stream_interval: int = 1,
    enable_request_id_headers: bool = False,
    data_parallel: Sequence[SimEngine] = (),
) -> FastAPI:
    """The server app; its lifespan starts and closes the engines. ``model`` is the first
    served name, ``aliases`` the others; ``data_parallel`` are engines 1.. beside
    ``engine``."""
    config = ServerConfig(
        served_model_names=(model, *aliases),
        max_model_len=max_model_len,
        stream_interval=stream_interval,
        enable_request_id_headers=enable_request_id_headers,
    )
    server = Server([engine, *data_parallel], config)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for each in server.engines:
                await each.start()
                stack.push_async_callback(each.close)
            yield

    app = FastAPI(title="sluicegate sim-server", lifespan=lifespan)
    app.state.server = server
    _routes(app, server)
    return app


def _routes(app: FastAPI, server: Server) -> None:
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
        return Response(generate_latest(server.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        cards: list[dict[str, Any]] = [
            {
                "id": name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": server.model,
                "parent": None,
                "max_model_len": server.context,
                "permission": [],
            }
            for name in server.config.served_model_names
        ]
        return {"object": "list", "data": cards}

    @app.post("/tokenize", response_model=None)
    async def tokenize_prompt(body: TokenizeRequest) -> dict[str, Any] | JSONResponse:
        if body.model is not None and body.model not in server.config.served_model_names:
            return unknown_model(body.model)
        ids = [_token_id(piece) for piece in tokenize(body.prompt)]
        return {"count": len(ids), "max_model_len": server.context, "tokens": ids}

    @app.post("/abort_requests")
    async def abort_requests(body: AbortRequest) -> dict[str, str]:
        await server.abort(body.request_ids)
        return {"status": "ok"}

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        prompt_tokens = max(1, count_tokens(body.prompt))
        if (refused := server.refusal(body, prompt_tokens)) is not None:
            return refused
        external = raw.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        index, engine = server.engine_for()
        request = GenerationRequest(
            request_id=f"{external}-{uuid.uuid4().hex[:8]}",  # unique inside, as vLLM's
            kind=body.sluicegate_kind,
            input=document_of(body.prompt)
            if body.sluicegate_kind is JobKind.SUMMARIZE
            else body.prompt,
            max_tokens=min(body.max_tokens, server.context - prompt_tokens),  # vLLM caps
        )
        completion = _Completion(
            server, engine, request, external=external, engine_index=index, body=body,
            prompt_tokens=prompt_tokens,
        )  # fmt: skip
        headers = {REQUEST_ID_HEADER: external} if server.config.enable_request_id_headers else {}
        if body.stream:
            return StreamingResponse(
                completion.events(), media_type="text/event-stream", headers=headers
            )
        return await completion.whole(raw, headers)


class _Completion:
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
            choice["token_ids"] = [_token_id(piece) if piece else EOS_ID for piece in pieces]
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
                            yield _sse(self.chunk(pending, None))
                        pending, held = held, []
            if self.eos and count == self.expected:
                held.append("")  # the EOS token ends the output; it has no text
                count += 1
            reason = self._finish(count)
            if held or reason == "abort":  # vLLM's abort output carries no new token
                if pending:
                    yield _sse(self.chunk(pending, None))
                pending = held
            yield _sse(self.chunk(pending, reason))
            if self.usage_asked:
                yield _sse({**self.head, "choices": [], "usage": self.usage(count)})
        except EngineError as exc:
            yield _sse(_error_body(_status(exc), str(exc)))
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
            return error_response(_status(exc), str(exc))
        pieces += [""] if self.eos and len(pieces) == self.expected else []
        reason = self._finish(len(pieces))
        choice = self.chunk(pieces, reason)["choices"]
        body = {**self.head, "choices": choice, "usage": self.usage(len(pieces))}
        return JSONResponse(body, headers=headers)

    async def _pieces(self) -> AsyncGenerator[str, None]:
        # SimEngine.generate is an async generator: closing it aborts the request.
        source = cast(AsyncGenerator[str, None], self.engine.generate(self.request))
        async with contextlib.aclosing(source) as pieces:
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


async def serve(app: FastAPI, *, host: str, port: int, stop: asyncio.Event) -> None:
    """Run a sim-server app until ``stop`` is set (SIGTERM or SIGINT under
    ``run_until_signal``)."""
    server: Server = app.state.server
    async with running(app, host=host, port=port) as url:
        cap = server.engines[0].capacity()
        log.info(
            "sim-server: %s at %s, %d engine(s) of %d KV blocks of %d tokens",
            ", ".join(server.config.served_model_names),
            url,
            len(server.engines),
            cap.total_blocks,
            cap.block_size,
        )
        await stop.wait()
    log.info("sim-server stopped")
