"""The engine as a remote ``vllm serve`` (or ``sluicegate sim-server``) over HTTP, written
against vLLM 0.33 (paths below are inside its ``vllm/`` package).

Generation streams ``POST /v1/completions`` (server-sent events) with the request id in the
``X-Request-Id`` header:

- the prompt is ``prompts.build_prompt``: a summary carries its instruction (the job's,
  else the default);
- the job's ``temperature``, ``top_p``, ``stop`` and ``seed`` go in the body as given (vLLM
  applies all four); ``model`` is the configured one (the job's was checked at ingress);
- ``return_token_ids`` and ``stream_options.include_usage`` are asked for, since one chunk can
  carry several tokens (``stream_interval``) or none with text (an EOS): each chunk gives its
  text and then one empty item per further token, and the stream is made up to the server's
  ``usage.completion_tokens`` (``entrypoints/openai/completion/serving.py`` ~383-470);
- only ``finish_reason`` "stop" or "length" is a complete output, and it is the stream's
  ``Generation.finish_reason``: vLLM puts the output's ``finish_reason`` (``outputs.py`` ~93,
  one of ``FINISH_REASON_STRINGS``, ``v1/engine/__init__.py`` ~37) on the stream's last
  choice (``entrypoints/openai/completion/serving.py`` ~349 and ~433). A request the server
  ended itself (``/pause``, ``/sleep``, ``/abort_requests``) ends with "abort"
  (``v1/engine/output_processor.py`` ~636-648): ``EngineAborted``, retriable; "error" and
  any other end ("repetition" comes only with ``repetition_detection``, never asked for) are
  an ``EngineError``;
- ``max_model_len`` comes from ``GET /v1/models`` (``entrypoints/openai/models/serving.py``
  ~64-76). vLLM caps ``max_tokens`` to what the context leaves
  (``entrypoints/serve/utils/api_utils.py`` ~234), so a prompt (estimated) plus
  ``max_tokens`` over it is refused here, ``RequestTooLarge``, before sending; so is vLLM's
  "max_tokens=N cannot be greater than max_model_len=M" (``renderers/params.py`` ~277).

Aborting closes the request's connection: vLLM aborts a request whose client disconnected and
frees its KV blocks. Extra request fields are allowed by vLLM (``OpenAIBaseModel``,
``extra="allow"``, ``entrypoints/serve/engine/protocol.py`` ~39), so the ``sluicegate_kind``
hint for sim-server is harmless there.

The metrics carry the FIRST ``--served-model-name`` as ``model_name``
(``config/model.py`` ~2323); ``/v1/models`` lists every served name. The engine takes the
first name of the server it talks to when its configured name is one of them (an alias), and
``start()`` fails with a clear ``EngineError`` when it is not served there at all.

Capacity comes from vLLM's Prometheus ``/metrics``, scraped every ``metrics_interval_s``:

- ``vllm:cache_config_info`` (labels ``block_size``, ``num_gpu_blocks``, ``engine``): with
  data parallelism the frontend sums ``num_gpu_blocks`` over its engines
  (``v1/engine/core_client.py`` ~874-877) and writes that total on every engine's row
  (``v1/metrics/loggers.py`` ~1133-1136), so each engine has total / engines blocks, less the
  one null block each keeps out of its usage fraction;
- ``vllm:kv_cache_usage_perc`` (a fraction, 0..1): used blocks = round(usage x blocks);
- ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:num_preemptions_total``, for this engine's ``model_name``, summed over engines.

Until a scrape succeeds (and again after one fails) the capacity is unknown: zero blocks,
so a KV-gated worker starts nothing blindly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncGenerator, Coroutine
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from schemas.jobs import estimate_tokens
from workers.engines.base import (
    Capacity,
    Finished,
    Generation,
    GenerationRequest,
    openai_sampling,
)
from workers.engines.errors import (
    EngineError,
    EngineNotRunning,
    EngineUnavailable,
    RequestTooLarge,
)
from workers.engines.prompts import build_prompt
from workers.engines.streaming import (
    InFlight,
    Item,
    end_of_output,
    output_pieces,
    sse_events,
)

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
CONNECT_TIMEOUT_S = 5.0
UNKNOWN = Capacity(
    total_blocks=0, free_blocks=0, block_size=16, running=0, waiting=0, preemptions=0
)
"""Capacity before the first scrape (block size: vLLM's default until the server says)."""

_TOO_LONG = re.compile(
    r"maximum (context|model) length|cannot be greater than max_model_len", re.IGNORECASE
)


class VllmHttpEngine:
    """An engine that is a vLLM server's OpenAI-compatible HTTP API."""

    name: str = "vllm_http"

    @property
    def served_model(self) -> str:
        """The name asked of the server (``vllm_model``), one of those it serves."""
        return self.model

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        metrics_interval_s: float = 0.1,
        request_timeout_s: float = 600.0,
        ready_timeout_s: float = 10.0,
    ) -> None:
        """``request_timeout_s`` bounds each wait on the server (connecting excepted): the
        longest a stream may stay silent. ``start()`` waits up to ``ready_timeout_s`` for
        the first scrape."""
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.metrics_interval_s = metrics_interval_s
        self.request_timeout_s = request_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self._client: httpx.AsyncClient | None = None
        self._poller: asyncio.Task[None] | None = None
        self._capacity = UNKNOWN
        self._ready = asyncio.Event()
        self._in_flight = InFlight()
        self.metrics_model: str | None = None  # the server's first served name, once read
        self.max_model_len: int | None = None
        self._misconfigured: EngineError | None = None

    async def start(self) -> None:
        """Open the client and start scraping; wait (bounded) for the first scrape. A server
        not up yet is not an error: capacity stays unknown until it answers."""
        if self._client is not None:
            return
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(self.request_timeout_s, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
        )
        self._poller = asyncio.create_task(self._poll(self._client), name="vllm-http-metrics")
        try:
            await self.wait_ready(self.ready_timeout_s)
        except EngineUnavailable as exc:
            log.warning("%s; starting anyway, with no capacity until it answers", exc)

    async def wait_ready(self, timeout_s: float) -> None:
        """Return once capacity is known; EngineUnavailable after ``timeout_s``."""
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except TimeoutError:
            raise EngineUnavailable(
                f"no metrics from {self.base_url} within {timeout_s:g} s"
            ) from None
        if self._misconfigured is not None:
            raise self._misconfigured

    async def refresh_models(self) -> None:
        """Read ``/v1/models``: the name the metrics carry and ``max_model_len``. A model the
        server does not serve is recorded as a configuration error (``start`` raises it)."""
        client = self._client
        if client is None:
            raise EngineNotRunning("the vLLM HTTP engine is not started (or already closed)")
        cards = (await client.get("/v1/models")).raise_for_status().json()["data"]
        names = [str(card["id"]) for card in cards]
        if self.model not in names:
            self._misconfigured = EngineError(
                f"the server at {self.base_url} does not serve {self.model!r}; it serves "
                f"{', '.join(names)}: set SLUICEGATE_VLLM_MODEL to one of them"
            )
            self._ready.set()
            return
        self._misconfigured = None
        self.metrics_model = names[0]  # vLLM labels its metrics with the first served name
        limit = cards[names.index(self.model)].get("max_model_len")
        self.max_model_len = int(limit) if limit else None

    async def close(self) -> None:
        await self._in_flight.abort_all()
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.wait([self._poller])
            self._poller = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        self._capacity = UNKNOWN
        self._ready.clear()
        self.metrics_model = None

    def count_tokens(self, text: str) -> int:
        """An estimate (about 4 bytes a token): the tokenizer is on the server, and its
        ``/tokenize`` is a round trip this synchronous call cannot make."""
        return estimate_tokens(text)

    def context_tokens(self) -> int | None:
        return self.max_model_len

    async def prompt_tokens(self, request: GenerationRequest) -> int:
        """vLLM's ``POST /tokenize`` of the prompt (``entrypoints/serve/tokenize``): its
        ``count``."""
        client = self._client
        if client is None:
            raise EngineNotRunning("the vLLM HTTP engine is not started (or already closed)")
        body = {
            "model": self.model,
            "prompt": build_prompt(request.kind, request.input, request.instruction),
        }
        try:
            answer = (await client.post("/tokenize", json=body)).raise_for_status().json()
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"{self.base_url}: {exc!r}") from exc
        return int(answer["count"])

    def capacity(self) -> Capacity:
        return self._capacity

    async def abort(self, request_id: str) -> None:
        await self._in_flight.abort(request_id)

    def generate(self, request: GenerationRequest) -> Generation:
        return Generation(self._generate(request))

    async def _generate(self, request: GenerationRequest) -> AsyncGenerator[str | Finished, None]:
        client = self._client
        if client is None:
            raise EngineNotRunning("the vLLM HTTP engine is not started (or already closed)")
        prompt = build_prompt(request.kind, request.input, request.instruction)
        self._check_length(prompt, request.max_tokens)

        def reader(items: asyncio.Queue[Item]) -> Coroutine[Any, Any, None]:
            return self._read(client, request, prompt, items)

        async with contextlib.aclosing(self._in_flight.items(request.request_id, reader)) as items:
            async for item in items:
                yield item

    def _check_length(self, prompt: str, max_tokens: int) -> None:
        """vLLM would cap the output silently: refuse what the context cannot hold."""
        if self.max_model_len is None:
            return
        prompt_tokens = self.count_tokens(prompt)
        if prompt_tokens + max_tokens > self.max_model_len:
            raise RequestTooLarge(
                f"about {prompt_tokens} prompt tokens and {max_tokens} output tokens exceed "
                f"the model's context of {self.max_model_len} tokens"
            )

    async def _read(
        self,
        client: httpx.AsyncClient,
        request: GenerationRequest,
        prompt: str,
        items: asyncio.Queue[Item],
    ) -> None:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": request.max_tokens,
            "stream": True,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
            "sluicegate_kind": request.kind.value,  # sim-server only; vLLM allows extras
            **openai_sampling(request.sampling),  # the server's defaults for those not given
        }
        headers = {REQUEST_ID_HEADER: request.request_id}
        try:
            async with client.stream(
                "POST", "/v1/completions", json=body, headers=headers
            ) as response:
                if response.status_code != httpx.codes.OK:
                    await response.aread()
                    items.put_nowait(_refusal(response.status_code, _message(response)))
                    return
                items.put_nowait(await _relay(response, items))
        except httpx.HTTPError as exc:
            items.put_nowait(EngineUnavailable(f"{self.base_url}: {exc!r}"))
        except Exception as exc:  # a malformed answer: fail the request rather than hang it
            items.put_nowait(EngineError(f"unreadable answer from {self.base_url}: {exc!r}"))

    async def _poll(self, client: httpx.AsyncClient) -> None:
        failing = False
        timeout = max(1.0, 10 * self.metrics_interval_s)
        while True:
            try:
                if self.metrics_model is None:
                    await self.refresh_models()
                if self.metrics_model is None:
                    raise ValueError(str(self._misconfigured))
                response = await client.get("/metrics", timeout=timeout)
                response.raise_for_status()
                capacity = capacity_from_metrics(response.text, self.metrics_model)
                if capacity is None:
                    raise ValueError(f"no KV cache metrics for model {self.metrics_model!r}")
            except Exception as exc:  # whatever went wrong, the capacity is unknown now
                if not failing:
                    log.warning("scraping %s/metrics failed: %r", self.base_url, exc)
                failing = True
                self._capacity = UNKNOWN
                self.metrics_model = None  # the server may have been replaced: read it again
            else:
                if failing:
                    log.info("scraping %s/metrics works again", self.base_url)
                failing = False
                self._capacity = capacity
                self._ready.set()
            await asyncio.sleep(self.metrics_interval_s)


async def _relay(response: httpx.Response, items: asyncio.Queue[Item]) -> Item:
    """Queue one item per generated token; returns what ends the stream: the end (made up
    to the server's token count), or an error."""
    finish: str | None = None
    usage: int | None = None
    yielded = 0
    async for event in sse_events(response):
        if "error" in event:
            error = event["error"]
            return _refusal(int(error.get("code") or 500), str(error.get("message")))
        for choice in event.get("choices") or ():
            text = choice.get("text") or ""
            token_ids = choice.get("token_ids")
            count = len(token_ids) if token_ids is not None else int(bool(text))
            for piece in output_pieces(text, count):
                items.put_nowait(piece)
                yielded += 1
            finish = choice.get("finish_reason") or finish
        if event.get("usage"):
            usage = int(event["usage"]["completion_tokens"])
    return end_of_output(finish, yielded, usage, items)


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500]


def _refusal(status: int, message: str) -> EngineError:
    if status >= 500:
        return EngineUnavailable(f"the server answered {status}: {message}")
    if _TOO_LONG.search(message):
        return RequestTooLarge(message)
    return EngineError(f"the server refused the request ({status}): {message}")


def capacity_from_metrics(text: str, model: str) -> Capacity | None:
    """The capacity a vLLM ``/metrics`` page reports for ``model`` (the server's first served
    name); None when it lacks the cache config or the KV usage of that model.

    Every engine's ``cache_config_info`` row carries the blocks of all engines together (the
    data-parallel total); each engine has an equal share, one of which is its null block.
    """
    rows: dict[str, int] = {}  # engine -> num_gpu_blocks on its row (the DP-wide total)
    usage: dict[str, float] = {}
    block_size = running = waiting = preemptions = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            engine = labels.get("engine", "")
            if sample.name == "vllm:cache_config_info":
                gpu_blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
                if gpu_blocks.isdigit() and size.isdigit():
                    rows[engine] = int(gpu_blocks)
                    block_size = int(size)
            elif labels.get("model_name") != model:
                continue
            elif sample.name == "vllm:kv_cache_usage_perc":
                usage[engine] = sample.value
            elif sample.name == "vllm:num_requests_running":
                running += int(sample.value)
            elif sample.name == "vllm:num_requests_waiting":
                waiting += int(sample.value)
            elif sample.name == "vllm:num_preemptions_total":
                preemptions += int(sample.value)
    if not rows or not usage:
        return None
    per_engine = max(max(rows.values()) // len(rows) - 1, 0)  # usable blocks of one engine
    total = per_engine * len(rows)
    used = sum(round(usage.get(engine, 0.0) * per_engine) for engine in rows)
    return Capacity(
        total_blocks=total,
        free_blocks=max(total - used, 0),
        block_size=block_size,
        running=running,
        waiting=waiting,
        preemptions=preemptions,
    )
