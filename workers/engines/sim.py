"""The simulator engine: CPU only, deterministic output, simulated prefill and decode time.

Three parts, kept apart so that each can grow on its own:

- the output model (``simulated_output``): what text a request produces — the extractive
  summary of the document for ``summarize``, a pseudo-completion built from the prompt's own
  words for ``complete``, cut to ``max_tokens`` tokens;
- the timing model (``SimTiming``): how long prefill and each decode step take;
- the engine (``SimEngine``): the slots, the running streams, pacing and abort.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from itertools import pairwise

from schemas.errors import SluicegateError
from schemas.jobs import JobKind
from workers.engines.base import Capacity, GenerationRequest
from workers.summarize import summarize
from workers.tokens import count_tokens, tokenize

MIN_SLEEP_S = 0.001
"""Pacing sleeps shorter than this are deferred and taken together with the next tokens'."""

COMPLETION_MARK = "[sim]"
"""The first piece of every simulated completion, so nobody mistakes it for a model's text."""


class EngineError(SluicegateError):
    code = "engine_error"


class EngineAtCapacity(EngineError):
    """More generations were started than the engine has slots; the caller must gate."""

    code = "engine_at_capacity"
    status = 503
    retriable = True


class EngineNotRunning(EngineError):
    """A generation was started before ``start()`` or after ``close()``."""

    code = "engine_not_running"
    status = 503
    retriable = True


class DuplicateRequest(EngineError):
    """A generation was started with the id of one that is still running."""

    code = "duplicate_request"
    status = 409


# -- output model -------------------------------------------------------------------------

_WORD = re.compile(r"\w+(?:['\u2019]\w+)*")
_FALLBACK_WORDS = ("simulated", "output", "for", "an", "empty", "prompt")
MIN_COMPLETION_WORDS = 12
MAX_EXTRA_COMPLETION_WORDS = 120


def simulated_output(request: GenerationRequest) -> list[str]:
    """The pieces the simulator decodes for ``request``, at most ``max_tokens`` of them."""
    if request.kind is JobKind.SUMMARIZE:
        text = summarize(request.input, max_tokens=request.max_tokens)
    else:
        text = pseudo_completion(request.input)
    return tokenize(text)[: max(0, request.max_tokens)]


def pseudo_completion(prompt: str) -> str:
    """A deterministic continuation of ``prompt`` made of the prompt's own words.

    A random walk over the prompt's word pairs, seeded by a hash of the prompt, cut into
    sentences. Its length depends on the prompt (its hash and its length); it always starts
    with ``COMPLETION_MARK``.
    """
    seed = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big")
    rng = random.Random(seed)
    words = _WORD.findall(prompt) or list(_FALLBACK_WORDS)
    following: dict[str, list[str]] = {}
    for current, after in pairwise(words):
        following.setdefault(current.lower(), []).append(after)
    length = MIN_COMPLETION_WORDS + min(MAX_EXTRA_COMPLETION_WORDS, seed % 48 + len(words) // 4)
    out: list[str] = [COMPLETION_MARK]
    word = rng.choice(words)
    while len(out) <= length:  # whole sentences until the length is reached
        sentence_words = rng.randint(6, 14)
        for position in range(sentence_words):
            out.append(word.capitalize() if position == 0 else word.lower())
            word = rng.choice(following.get(word.lower()) or words)
        out[-1] += "."
    return " ".join(out)


# -- timing model -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SimTiming:
    """Linear costs: a fixed time per prompt token (prefill) and per output token (decode)."""

    token_time_s: float
    prefill_token_time_s: float

    def __post_init__(self) -> None:
        if self.token_time_s < 0 or self.prefill_token_time_s < 0:
            raise ValueError("simulated token times must be >= 0")

    def prefill_s(self, prompt_tokens: int) -> float:
        return prompt_tokens * self.prefill_token_time_s

    def decode_step_s(self) -> float:
        return self.token_time_s


# -- engine -------------------------------------------------------------------------------


class _Run:
    """The engine's handle on one running stream."""

    __slots__ = ("aborted", "request_id")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.aborted = asyncio.Event()

    async def pause(self, seconds: float) -> None:
        """Sleep for ``seconds``, or less if the run is aborted meanwhile."""
        if seconds <= 0 or self.aborted.is_set():
            await asyncio.sleep(0)
            return
        try:
            async with asyncio.timeout(seconds):
                await self.aborted.wait()
        except TimeoutError:
            pass


class SimEngine:
    """A simulated inference engine with a fixed number of slots.

    ``generate`` takes a slot when its stream is first iterated and raises
    ``EngineAtCapacity`` if none is free: the worker gates on ``capacity()``, the engine never
    queues. The slot is given back when the stream ends for any reason — finished, aborted,
    closed by its consumer, or cancelled — and at once by ``abort``.
    """

    name: str = "sim"

    def __init__(self, *, token_time_s: float, prefill_token_time_s: float, slots: int) -> None:
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self._timing = SimTiming(
            token_time_s=token_time_s, prefill_token_time_s=prefill_token_time_s
        )
        self._slots = slots
        self._runs: dict[str, _Run] = {}
        self._running = False

    async def start(self) -> None:
        self._running = True

    async def close(self) -> None:
        """Stop accepting work and abort every running stream."""
        self._running = False
        for request_id in list(self._runs):
            await self.abort(request_id)

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)

    def capacity(self) -> Capacity:
        running = len(self._runs)
        return Capacity(total_slots=self._slots, free_slots=self._slots - running, running=running)

    async def abort(self, request_id: str) -> None:
        run = self._runs.pop(request_id, None)
        if run is not None:
            run.aborted.set()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        run = self._admit(request)
        try:
            pieces = simulated_output(request)
            loop = asyncio.get_running_loop()
            due = loop.time() + self._timing.prefill_s(self.count_tokens(request.input))
            await run.pause(due - loop.time())
            step = self._timing.decode_step_s()
            for piece in pieces:
                due += step
                delay = due - loop.time()
                # Sleep in groups: a delay under MIN_SLEEP_S is carried over to the next token.
                await run.pause(delay if delay >= MIN_SLEEP_S else 0.0)
                if run.aborted.is_set():
                    return
                yield piece
        finally:
            if self._runs.get(request.request_id) is run:
                del self._runs[request.request_id]

    def _admit(self, request: GenerationRequest) -> _Run:
        if not self._running:
            raise EngineNotRunning("the simulator engine is not started (or already closed)")
        if request.request_id in self._runs:
            raise DuplicateRequest(f"request {request.request_id!r} is already running")
        if len(self._runs) >= self._slots:
            raise EngineAtCapacity(
                f"all {self._slots} simulator slots are busy; gate on capacity() first"
            )
        run = _Run(request.request_id)
        self._runs[request.request_id] = run
        return run
