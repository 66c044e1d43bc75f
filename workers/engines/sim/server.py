"""``sluicegate sim-server``: the simulator engine behind an OpenAI-compatible HTTP server
that answers as ``vllm serve`` 0.33 does (paths below are inside vLLM's ``vllm/`` package), so
the worker's ``vllm_http`` engine can be tried, and tested, without a GPU.

- ``POST /v1/completions``: ``model``, ``prompt`` (a string), ``max_tokens`` (default 16),
  ``stream``, ``stream_options.include_usage`` (off unless asked:
  ``entrypoints/generate/base/protocol.py`` ~293), ``stream_interval``, ``return_token_ids``,
  and the sampling fields ``temperature`` (0 to 2, finite), ``top_p`` (over 0 up to 1),
  ``stop`` and ``seed``, applied as the simulator engine applies them (``sim/output.py``);
  a value out of range is vLLM's 400 ``BadRequestError`` with its ``param``
  (``sim/protocol.py`` ``sampling_refusal``).
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

This module holds the app, its routes and uvicorn; the wire format (request bodies, error
bodies, events) is ``sim_protocol.py``, the server's state and its requests
``sim_requests.py``, the vLLM-style metrics ``sim_metrics.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from http import HTTPStatus
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from schemas.jobs import JobKind
from workers.engines.base import GenerationRequest
from workers.engines.prompts import split_prompt
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.protocol import (
    AbortRequest,
    CompletionRequest,
    TokenizeRequest,
    error_response,
    token_id,
    unknown_model,
)
from workers.engines.sim.requests import Completion, Server, ServerConfig
from workers.engines.sim.tokens import count_tokens, tokenize

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
GRACEFUL_SHUTDOWN_S = 10
"""On shutdown, streams still open after this long are cut (their requests aborted)."""
STARTUP_S = 30.0


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
        ids = [token_id(piece) for piece in tokenize(body.prompt)]
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
        # A summary's prompt is its instruction and its document: the simulator extracts
        # from the document, and counts the whole prompt as vLLM does.
        parts = split_prompt(body.prompt) if body.sluicegate_kind is JobKind.SUMMARIZE else None
        instruction, text = parts if parts is not None else (None, body.prompt)
        request = GenerationRequest(
            request_id=f"{external}-{uuid.uuid4().hex[:8]}",  # unique inside, as vLLM's
            kind=body.sluicegate_kind,
            input=text,
            max_tokens=min(body.max_tokens, server.context - prompt_tokens),  # vLLM caps
            sampling=replace(body.sampling(), instruction=instruction),
        )
        completion = Completion(
            server, engine, request, external=external, engine_index=index, body=body,
            prompt_tokens=prompt_tokens,
        )  # fmt: skip
        headers = {REQUEST_ID_HEADER: external} if server.config.enable_request_id_headers else {}
        if body.stream:
            return StreamingResponse(
                completion.events(), media_type="text/event-stream", headers=headers
            )
        return await completion.whole(raw, headers)


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
