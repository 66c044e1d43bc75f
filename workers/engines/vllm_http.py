"""The engine as a remote ``vllm serve`` (or ``sluicegate sim-server``) over HTTP.

Generation streams ``POST /v1/completions`` (server-sent events), one item per chunk, with
the request id in the ``X-Request-Id`` header. Aborting closes the request's connection:
vLLM aborts a request whose client disconnected and frees its KV blocks. Capacity comes
from vLLM's Prometheus ``/metrics``, scraped every ``metrics_interval_s``:

- ``vllm:cache_config_info`` (labels ``block_size``, ``num_gpu_blocks``, ``engine``): the
  usable blocks are ``num_gpu_blocks - 1``, since vLLM keeps one null block that no request
  holds and leaves it out of the usage fraction;
- ``vllm:kv_cache_usage_perc`` (a fraction, 0..1): used blocks = round(usage x blocks);
- ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:num_preemptions_total``, for this engine's ``model_name``, summed over engines.

Until a scrape succeeds (and again after one fails) the capacity is unknown: zero blocks,
so a KV-gated worker starts nothing blindly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator

import httpx
from prometheus_client.parser import text_string_to_metric_families

from schemas.jobs import estimate_tokens
from workers.engines.base import Capacity, GenerationRequest
from workers.engines.errors import (
    DuplicateRequest,
    EngineError,
    EngineNotRunning,
    EngineUnavailable,
    RequestTooLarge,
)

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
CONNECT_TIMEOUT_S = 5.0
UNKNOWN = Capacity(
    total_blocks=0, free_blocks=0, block_size=16, running=0, waiting=0, preemptions=0
)
"""Capacity before the first scrape (block size: vLLM's default until the server says)."""

_TOO_LONG = re.compile(r"maximum (context|model) length", re.IGNORECASE)


class _End:
    """Marks the end of a stream's items."""


_END = _End()
_Item = str | _End | EngineError


class _Stream:
    """One request in flight: the task reading its response, and what it read."""

    def __init__(self) -> None:
        self.items: asyncio.Queue[_Item] = asyncio.Queue()
        self.reader: asyncio.Task[None] | None = None
        self.stopped = False

    async def stop(self) -> None:
        """Drop what was read but not taken and close the connection (vLLM then aborts)."""
        self.stopped = True
        self.items.put_nowait(_END)
        if self.reader is not None:
            self.reader.cancel()
            await asyncio.wait([self.reader])


class VllmHttpEngine:
    """An engine that is a vLLM server's OpenAI-compatible HTTP API."""

    name: str = "vllm_http"

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
        self._streams: dict[str, _Stream] = {}

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

    async def close(self) -> None:
        for request_id in list(self._streams):
            await self.abort(request_id)
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.wait([self._poller])
            self._poller = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        self._capacity = UNKNOWN
        self._ready.clear()

    def count_tokens(self, text: str) -> int:
        """An estimate (about 4 bytes a token): the tokenizer is on the server, and its
        ``/tokenize`` is a round trip this synchronous call cannot make."""
        return estimate_tokens(text)

    def capacity(self) -> Capacity:
        return self._capacity

    async def abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            await stream.stop()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        client = self._client
        if client is None:
            raise EngineNotRunning("the vLLM HTTP engine is not started (or already closed)")
        if request.request_id in self._streams:
            raise DuplicateRequest(f"request {request.request_id!r} is already running")
        stream = _Stream()
        self._streams[request.request_id] = stream
        stream.reader = asyncio.create_task(
            self._read(client, request, stream.items), name=f"vllm-http-{request.request_id}"
        )
        try:
            while True:
                item = await stream.items.get()
                if stream.stopped or isinstance(item, _End):
                    return
                if isinstance(item, EngineError):
                    raise item
                yield item
        finally:
            if self._streams.get(request.request_id) is stream:
                del self._streams[request.request_id]
            await stream.stop()

    async def _read(
        self, client: httpx.AsyncClient, request: GenerationRequest, items: asyncio.Queue[_Item]
    ) -> None:
        body = {
            "model": self.model,
            "prompt": request.input,
            "max_tokens": request.max_tokens,
            "stream": True,
            "sluicegate_kind": request.kind.value,  # sim-server only; vLLM ignores it
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
                response = await client.get("/metrics", timeout=timeout)
                response.raise_for_status()
                capacity = capacity_from_metrics(response.text, self.model)
                if capacity is None:
                    raise ValueError(f"no KV cache metrics for model {self.model!r}")
            except Exception as exc:  # whatever went wrong, the capacity is unknown now
                if not failing:
                    log.warning("scraping %s/metrics failed: %r", self.base_url, exc)
                failing = True
                self._capacity = UNKNOWN
            else:
                if failing:
                    log.info("scraping %s/metrics works again", self.base_url)
                failing = False
                self._capacity = capacity
                self._ready.set()
            await asyncio.sleep(self.metrics_interval_s)


async def _relay(response: httpx.Response, items: asyncio.Queue[_Item]) -> _Item:
    """Queue the text of each event; returns what ends the stream: the end, or an error
    (an error event, or a stream cut before any finish_reason)."""
    finished = False
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            error = event["error"]
            return _refusal(int(error.get("code") or 500), str(error.get("message")))
        for choice in event.get("choices") or ():
            if choice.get("text"):
                items.put_nowait(choice["text"])
            finished = finished or choice.get("finish_reason") is not None
    if not finished:
        return EngineUnavailable("the stream ended before its output did")
    return _END


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
    """The capacity a vLLM ``/metrics`` page reports for ``model``; None when it lacks the
    cache config or the KV usage of that model."""
    blocks: dict[str, int] = {}  # usable blocks per engine
    usage: dict[str, float] = {}
    block_size = running = waiting = preemptions = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            engine = labels.get("engine", "")
            if sample.name == "vllm:cache_config_info":
                gpu_blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
                if gpu_blocks.isdigit() and size.isdigit():
                    blocks[engine] = max(int(gpu_blocks) - 1, 0)
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
    if not blocks or not usage:
        return None
    total = sum(blocks.values())
    used = sum(round(usage.get(engine, 0.0) * count) for engine, count in blocks.items())
    return Capacity(
        total_blocks=total,
        free_blocks=max(total - used, 0),
        block_size=block_size,
        running=running,
        waiting=waiting,
        preemptions=preemptions,
    )
