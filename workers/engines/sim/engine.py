"""The simulator engine, the CPU stand-in for a vLLM engine: continuous batching over a paged
KV block allocator sized from a model and a GPU profile, stepped in simulated roofline time.

One step loop drives the scheduler; each step lasts its roofline time (times
``time_scale``) by the wall clock and then hands every request that decoded in it one output
piece. Requests
queue inside the engine when blocks run short, exactly as in vLLM: it is the worker's job to
start only what the KV cache can hold (``capacity()`` reports the blocks).

A request's prompt is counted as the real engines see it (``prompts.build_prompt``: a
summary's instruction included), and its output ends as vLLM reports it: ``length`` when it
took all of ``max_tokens``, ``stop`` when its text ended first (``output.finish_reason``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from workers.engines.base import Capacity, Finished, Generation, GenerationRequest
from workers.engines.errors import DuplicateRequest, EngineNotRunning, RequestTooLarge
from workers.engines.prompts import build_prompt
from workers.engines.sim.batching import BatchScheduler, SimRequest
from workers.engines.sim.blocks import BlockAllocator
from workers.engines.sim.output import finish_reason, simulated_output
from workers.engines.sim.profiles import GPU_80GB, LLAMA_8B, GpuProfile, ModelProfile, Roofline
from workers.engines.sim.profiles import num_gpu_blocks as profile_blocks
from workers.engines.sim.tokens import count_tokens


@dataclass
class _Stream:
    pieces: list[str]
    ready: int = 0  # pieces decoded so far
    ended: bool = False
    aborted: bool = False  # no further pieces, even ones already decoded
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def notify(self) -> None:
        self.changed.set()


class SimEngine:
    """An in-process engine that behaves like vLLM where the worker can see it: requests
    queue when blocks run short, the newest is preempted when a decode needs a block, and
    ``capacity()`` reports blocks, queue and preemptions as vLLM's metrics do.

    ``time_scale`` multiplies every step's roofline time (0: as fast as the CPU allows).
    """

    name: str = "sim"
    served_model: str = "sim"

    def __init__(
        self,
        *,
        model: ModelProfile = LLAMA_8B,
        gpu: GpuProfile = GPU_80GB,
        block_size: int = 16,
        num_blocks: int | None = None,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 256,
        time_scale: float = 1.0,
        max_model_len: int | None = None,
    ) -> None:
        if time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        blocks = num_blocks or profile_blocks(model, gpu, block_size)
        self.block_size = block_size
        self._roofline = Roofline(model=model, gpu=gpu)
        self._scheduler = BatchScheduler(
            BlockAllocator(blocks, block_size),
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
        )
        self._time_scale = time_scale
        # vLLM's max_model_len: a request's prompt and output together (None: the cache's).
        self.max_model_len = max_model_len or blocks * block_size
        self._streams: dict[str, _Stream] = {}
        self._work = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self.tokens_decoded = 0
        self.simulated_s = 0.0  # GPU time of every step so far (before time_scale)

    async def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.create_task(self._run(), name="sim-step-loop")

    async def close(self) -> None:
        for request_id in list(self._streams):
            await self.abort(request_id)
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)

    def context_tokens(self) -> int | None:
        return self.max_model_len

    async def prompt_tokens(self, request: GenerationRequest) -> int:
        return sim_prompt_tokens(request)

    def capacity(self) -> Capacity:
        s = self._scheduler
        return Capacity(
            max_running=s.max_num_seqs,
            running=len(s.running),
            waiting=len(s.waiting),
            total_blocks=s.allocator.num_blocks,
            free_blocks=s.allocator.free_blocks,
            block_size=self.block_size,
            preemptions=s.preemptions,
        )

    async def abort(self, request_id: str) -> None:
        if self._scheduler.abort(request_id):
            self._work.set()
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.ended = True
            stream.aborted = True
            stream.notify()

    def generate(self, request: GenerationRequest) -> Generation:
        return Generation(self._generate(request))

    async def _generate(self, request: GenerationRequest) -> AsyncGenerator[str | Finished, None]:
        if self._loop is None:
            raise EngineNotRunning("the simulator engine is not started (or already closed)")
        if request.request_id in self._streams:
            raise DuplicateRequest(f"request {request.request_id!r} is already running")
        pieces = simulated_output(request)
        stream = _Stream(pieces=pieces)
        if not pieces:
            yield Finished(finish_reason(pieces, request.max_tokens))
            return
        prompt_tokens = sim_prompt_tokens(request)
        if prompt_tokens + request.max_tokens > self.max_model_len:
            raise RequestTooLarge(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {prompt_tokens + request.max_tokens} tokens "
                f"({prompt_tokens} in the messages, {request.max_tokens} in the completion)."
            )
        allocator = self._scheduler.allocator
        if allocator.blocks_for(prompt_tokens + len(pieces)) > allocator.num_blocks:
            raise RequestTooLarge(
                f"{prompt_tokens + len(pieces)} tokens do not fit in the whole KV cache"
            )
        self._streams[request.request_id] = stream
        self._scheduler.add(
            SimRequest(
                id=request.request_id,
                prompt_tokens=prompt_tokens,
                output_tokens=len(pieces),
            )
        )
        self._work.set()
        given = 0
        try:
            while given < len(pieces):
                while stream.ready <= given and not stream.ended:
                    stream.changed.clear()
                    await stream.changed.wait()
                if stream.aborted or stream.ready <= given:
                    return
                yield pieces[given]
                given += 1
            yield Finished(finish_reason(pieces, request.max_tokens))
        finally:
            if self._streams.get(request.request_id) is stream:
                await self.abort(request.request_id)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        # When the current step ends, by the wall clock. Steps are timed from one end to the
        # next, so the simulator's own bookkeeping (and whatever else the process runs) is
        # inside a step's time, not added to it, as long as the CPU keeps up.
        ends = loop.time()
        while True:
            if not self._scheduler.running and not self._scheduler.waiting:
                self._work.clear()
                await self._work.wait()
                ends = loop.time()
            step = self._scheduler.step()
            if step.idle:
                self._work.clear()
                await self._work.wait()  # nothing could run: wait for an add or an abort
                ends = loop.time()
                continue
            seconds = self._roofline.step_s(
                prefill_tokens=step.prefill_tokens,
                decode_requests=step.decode_requests,
                kv_tokens=step.kv_tokens,
            )
            self.simulated_s += seconds
            lasts = seconds * self._time_scale
            ends = max(ends + lasts, loop.time() - lasts)  # a debt of one step at most
            await asyncio.sleep(max(0.0, ends - loop.time()))
            for request_id in step.emitted:
                stream = self._streams.get(request_id)
                if stream is not None:
                    stream.ready += 1
                    self.tokens_decoded += 1
                    stream.notify()
            for request_id in step.finished:
                stream = self._streams.get(request_id)
                if stream is not None:
                    stream.ended = True
                    stream.notify()


def sim_prompt_tokens(request: GenerationRequest) -> int:
    """The prompt as the simulator counts it: the request's text with a summary's
    instruction (``prompts.build_prompt``), as vLLM's tokenizer would see its prompt."""
    return max(1, count_tokens(build_prompt(request.kind, request.input, request.instruction)))
