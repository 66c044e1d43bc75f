"""The engine as a llama.cpp server (``sluicegate llama-server``, or any ``llama-server``).

llama.cpp keeps the KV of each sequence in a slot of its own: ``n_ctx`` is split evenly over
``total_slots`` slots, and a request waits in the server ("deferred") while every slot is
busy. So capacity here is slots, not blocks of a shared pool: ``Capacity.slot_context`` is a
slot's context, ``total_blocks`` the slots and ``free_blocks`` the idle ones (from ``/slots``,
read every ``poll_interval_s``), ``waiting`` the server's ``llamacpp:requests_deferred``. The
pull gate starts a job only when a slot is free and the job fits one, so nothing waits inside
the server.

- Prompts: ``/v1/chat/completions`` with a summary's instruction (the job's, else the
  default) as the system message (``prompts.chat_messages``); the server applies the model's
  own chat template.
- Sampling: a job's ``temperature``, ``top_p``, ``stop`` and ``seed`` go in the body (the
  job's temperature over ``temperature``); a seed outside 0..2**32-2, which llama.cpp would
  wrap or take as "random", is refused (``UnsupportedParameter``).
- Sizes: before sending, the templated prompt is counted by the server (``/apply-template``,
  then ``/tokenize``); prompt + ``max_tokens`` beyond a slot's context is ``RequestTooLarge``
  (llama.cpp itself would refuse only a prompt larger than the slot, and cut the output short
  at the slot's end).
- Tokens: one item per chunk of text, then empty items up to the server's
  ``usage.completion_tokens`` (asked with ``stream_options.include_usage``), so the count is
  the server's. Only ``finish_reason`` ``stop`` or ``length`` is a complete output; the
  stream's ``Generation.finish_reason`` is the one of the server's last chunk (llama.cpp's
  OpenAI-compatible chunks carry it as vLLM's do).
- Abort: the reader task is cancelled and the connection closed; llama.cpp notices at its
  next write and frees the slot, a few decode steps later (docs/workers.md).
- ``count_tokens`` is an estimate (about 4 bytes a token): the tokenizer is in the server;
  the exact check happens in ``generate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Coroutine, Mapping
from pathlib import PurePath
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from schemas.jobs import estimate_tokens
from workers.engines.base import (
    Capacity,
    Finished,
    Generation,
    GenerationRequest,
    SamplingParams,
    openai_sampling,
)
from workers.engines.errors import (
    EngineError,
    EngineNotRunning,
    EngineUnavailable,
    RequestTooLarge,
    UnsupportedParameter,
)
from workers.engines.prompts import chat_messages
from workers.engines.streaming import InFlight, Item, end_of_output, sse_events

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
METRICS_EVERY = 10  # polls of /slots per read of /metrics (requests deferred)
UNKNOWN = Capacity(total_blocks=0, free_blocks=0, block_size=1, running=0, waiting=0, preemptions=0)
MAX_SEED = 2**32 - 2  # llama.cpp's seed is a uint32, and 2**32 - 1 means a random one


class LlamaCppEngine:
    """An engine that is a llama.cpp server's HTTP API."""

    name: str = "llamacpp"
    served_model: str = "llamacpp"
    """Once started: the model the server names in its answers (its alias, ``/props``)."""

    def __init__(
        self,
        *,
        base_url: str,
        temperature: float = 0.2,
        repeat_penalty: float = 1.2,
        poll_interval_s: float = 0.05,
        request_timeout_s: float = 300.0,
        ready_timeout_s: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.temperature = temperature
        self.repeat_penalty = repeat_penalty
        self.poll_interval_s = poll_interval_s
        self.request_timeout_s = request_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self._client: httpx.AsyncClient | None = None
        self._poller: asyncio.Task[None] | None = None
        self._slots = 0
        self._slot_context = 0
        self._capacity = UNKNOWN
        self._in_flight = InFlight()

    async def start(self) -> None:
        """Wait (up to ``ready_timeout_s``) for the server, read its slots, start polling."""
        if self._client is not None:
            return
        client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(self.request_timeout_s, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
        )
        try:
            props = await self._props(client)
            self._slots = int(props["total_slots"])
            self._slot_context = int(props["default_generation_settings"]["n_ctx"])
            self.served_model = served_name(props)
            await self._read_capacity(client, with_metrics=True)
        except BaseException:
            await client.aclose()
            raise
        self._client = client
        self._poller = asyncio.create_task(self._poll(client), name="llamacpp-slots")

    async def _props(self, client: httpx.AsyncClient) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout_s
        while True:
            try:
                if (await client.get("/health")).status_code == httpx.codes.OK:
                    props: dict[str, Any] = (await client.get("/props")).raise_for_status().json()
                    return props
            except httpx.HTTPError as exc:
                if loop.time() >= deadline:
                    raise EngineUnavailable(f"{self.base_url} did not answer: {exc!r}") from exc
            if loop.time() >= deadline:
                raise EngineUnavailable(f"{self.base_url} not ready in {self.ready_timeout_s} s")
            await asyncio.sleep(0.1)

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

    def count_tokens(self, text: str) -> int:
        return estimate_tokens(text)

    def context_tokens(self) -> int | None:
        return self._slot_context or None

    async def prompt_tokens(self, request: GenerationRequest) -> int:
        client = self._client
        if client is None:
            raise EngineNotRunning("the llama.cpp engine is not started (or already closed)")
        try:
            return await self.prompt_tokens_of(
                client, chat_messages(request.kind, request.input, request.instruction)
            )
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"{self.base_url}: {exc!r}") from exc

    def capacity(self) -> Capacity:
        return self._capacity

    async def abort(self, request_id: str) -> None:
        await self._in_flight.abort(request_id)

    def generate(self, request: GenerationRequest) -> Generation:
        return Generation(self._generate(request))

    async def _generate(self, request: GenerationRequest) -> AsyncGenerator[str | Finished, None]:
        client = self._client
        if client is None:
            raise EngineNotRunning("the llama.cpp engine is not started (or already closed)")
        check_sampling(request.sampling)

        def reader(items: asyncio.Queue[Item]) -> Coroutine[Any, Any, None]:
            return self._read(client, request, items)

        async with contextlib.aclosing(self._in_flight.items(request.request_id, reader)) as items:
            async for item in items:
                yield item

    async def _read(
        self, client: httpx.AsyncClient, request: GenerationRequest, items: asyncio.Queue[Item]
    ) -> None:
        messages = chat_messages(request.kind, request.input, request.instruction)
        body = {
            "messages": messages,
            "max_tokens": request.max_tokens,
            "temperature": self.temperature,
            "repeat_penalty": self.repeat_penalty,
            "stream": True,
            "stream_options": {"include_usage": True},
            **openai_sampling(request.sampling),  # a job's temperature over the engine's
        }
        try:
            prompt_tokens = await self.prompt_tokens_of(client, messages)
            if prompt_tokens + request.max_tokens > self._slot_context:
                items.put_nowait(
                    RequestTooLarge(
                        f"{prompt_tokens} prompt tokens and {request.max_tokens} output tokens "
                        f"exceed a slot's context of {self._slot_context} tokens"
                    )
                )
                return
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                if response.status_code != httpx.codes.OK:
                    await response.aread()
                    items.put_nowait(_refusal(response))
                    return
                items.put_nowait(await _relay(response, items))
        except httpx.HTTPError as exc:
            items.put_nowait(EngineUnavailable(f"{self.base_url}: {exc!r}"))
        except Exception as exc:  # a malformed answer: fail the request rather than hang it
            items.put_nowait(EngineError(f"unreadable answer from {self.base_url}: {exc!r}"))

    async def prompt_tokens_of(
        self, client: httpx.AsyncClient, messages: list[dict[str, str]]
    ) -> int:
        """Tokens of the prompt as the server builds it (chat template, special tokens)."""
        templated = await client.post("/apply-template", json={"messages": messages})
        prompt = templated.raise_for_status().json()["prompt"]
        tokens = await client.post("/tokenize", json={"content": prompt, "add_special": True})
        return len(tokens.raise_for_status().json()["tokens"])

    async def _poll(self, client: httpx.AsyncClient) -> None:
        failing = False
        polls = 0
        while True:
            await asyncio.sleep(self.poll_interval_s)
            polls += 1
            try:
                await self._read_capacity(client, with_metrics=polls % METRICS_EVERY == 0)
            except Exception as exc:  # whatever went wrong, the capacity is unknown now
                if not failing:
                    log.warning("reading %s/slots failed: %r", self.base_url, exc)
                failing = True
                self._capacity = UNKNOWN
            else:
                if failing:
                    log.info("reading %s/slots works again", self.base_url)
                failing = False

    async def _read_capacity(self, client: httpx.AsyncClient, *, with_metrics: bool) -> None:
        slots = (await client.get("/slots")).raise_for_status().json()
        busy = sum(1 for slot in slots if slot.get("is_processing"))
        deferred = self._capacity.waiting
        if with_metrics:
            deferred = deferred_requests((await client.get("/metrics")).raise_for_status().text)
        self._capacity = Capacity(
            total_blocks=self._slots,
            free_blocks=max(self._slots - busy, 0),
            block_size=self._slot_context,
            running=busy,
            waiting=deferred,
            preemptions=0,
            max_running=self._slots,
            slot_context=self._slot_context,
        )


def check_sampling(sampling: SamplingParams | None) -> None:
    """UnsupportedParameter for a seed llama.cpp would not apply as given (it takes a
    uint32, and 2**32 - 1 means a random seed)."""
    if sampling is not None and sampling.seed is not None and not 0 <= sampling.seed <= MAX_SEED:
        raise UnsupportedParameter(
            f"llama.cpp takes a seed from 0 to {MAX_SEED}, not {sampling.seed}"
        )


def served_name(props: Mapping[str, Any]) -> str:
    """The model a llama.cpp server names in its answers, from its ``/props``: its alias
    (``sluicegate llama-server`` sets the file's stem), else its file's name."""
    path = str(props.get("model_path") or "")
    alias = props.get("model_alias")
    if isinstance(alias, list | tuple):
        alias = alias[0] if alias else None
    if alias and str(alias) != path:
        return str(alias)
    return PurePath(path).name or "llamacpp"  # no alias: llama.cpp answers with the path


def deferred_requests(metrics: str) -> int:
    """``llamacpp:requests_deferred`` from a ``/metrics`` page (0 if absent)."""
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "llamacpp:requests_deferred":
                return int(sample.value)
    return 0


async def _relay(response: httpx.Response, items: asyncio.Queue[Item]) -> Item:
    """Queue the text of each chunk; returns what ends the stream: the end (after padding
    to the server's token count), or an error."""
    finish: str | None = None
    usage: int | None = None
    yielded = 0
    async for event in sse_events(response):
        if "error" in event:
            return EngineError(f"the server failed the request: {event['error']}")
        for choice in event.get("choices") or ():
            if text := (choice.get("delta") or {}).get("content"):
                items.put_nowait(text)
                yielded += 1
            finish = choice.get("finish_reason") or finish
        if event.get("usage"):
            usage = int(event["usage"]["completion_tokens"])
    return end_of_output(finish, yielded, usage, items)


def _refusal(response: httpx.Response) -> EngineError:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        error = {"message": response.text[:500]}
    message = f"the server answered {response.status_code}: {error.get('message')}"
    if error.get("type") == "exceed_context_size_error":
        return RequestTooLarge(message)
    if response.status_code >= 500:
        return EngineUnavailable(message)
    return EngineError(message)
