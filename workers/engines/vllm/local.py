"""The in-process vLLM engine: an ``AsyncLLM`` (vLLM V1) in the worker's own process.

Written against vLLM 0.33 (the ``vllm`` extra). vLLM is imported only in ``start()`` and
``generate()``, so this module imports (and the worker can be built) without it.

- Prompts: ``summarize`` wraps the document in a plain-text instruction, the job's or the
  default one (``prompts.build_prompt``);
  ``complete`` sends the input as it is. The model's chat template is not applied, so the
  same prompt works for base and instruct models alike.
- Tokens: the prompt is tokenized here with the engine's tokenizer and submitted as token
  ids, so the size check below and the engine see the same prompt.
- Sampling: a job's ``temperature``, ``top_p``, ``stop`` and ``seed`` map to vLLM's
  ``SamplingParams`` of the same names (``sampling_kwargs``).
- Output: ``SamplingParams(output_kind=DELTA)``; each delta's text is yielded, followed by an
  empty string for every further token the delta carries (vLLM merges deltas when the
  consumer falls behind), so the stream has one item per generated token. The last output's
  ``CompletionOutput.finish_reason`` (``outputs.py`` ~93, set on the finished output only:
  ``v1/engine/output_processor.py`` ~525) is the stream's ``Generation.finish_reason``.
- Sizes: a prompt plus ``max_tokens`` beyond the model's context raises ``RequestTooLarge``
  before anything is submitted (vLLM itself would only cap the output). vLLM refuses at
  start-up a cache that cannot hold one full-context sequence, so fitting the context means
  fitting the cache.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from schemas.jobs import finish_reason_of
from workers.engines.base import Capacity, Finished, Generation, GenerationRequest, SamplingParams
from workers.engines.errors import (
    DuplicateRequest,
    EngineAborted,
    EngineError,
    EngineNotRunning,
    RequestTooLarge,
)
from workers.engines.prompts import build_prompt
from workers.engines.streaming import output_pieces
from workers.engines.vllm.stats import StatsSink


def sampling_kwargs(sampling: SamplingParams | None, temperature: float) -> dict[str, Any]:
    """vLLM ``SamplingParams`` arguments for a job's parameters: its temperature (else the
    engine's), and its ``top_p``, ``stop`` and ``seed`` where given (vLLM's defaults else)."""
    kwargs: dict[str, Any] = {"temperature": temperature}
    if sampling is None:
        return kwargs
    if sampling.temperature is not None:
        kwargs["temperature"] = sampling.temperature
    if sampling.top_p is not None:
        kwargs["top_p"] = sampling.top_p
    if sampling.stop:
        kwargs["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        kwargs["seed"] = sampling.seed
    return kwargs


def finished_output(output: Any, request_id: str) -> Finished:
    """Why a finished ``RequestOutput`` ended (its completion's ``finish_reason``, "stop" or
    "length": ``FINISH_REASON_STRINGS``, v1/engine/__init__.py ~37), or an error for one
    that is not a whole output: vLLM's ``AsyncLLM.generate`` ends the stream without raising
    when the engine aborted the request (a pause, a sleep, an abort from elsewhere:
    ``finish_reason`` "abort", v1/engine/output_processor.py ~636-648) or failed it
    ("error"). Our own aborts never get here: they end the loop first."""
    reasons = [completion.finish_reason for completion in output.outputs]
    if "abort" in reasons:
        raise EngineAborted(f"vLLM aborted request {request_id!r} before its output ended")
    ended = [finish_reason_of(reason) for reason in reasons]
    if not ended or None in ended:
        raise EngineError(f"vLLM ended request {request_id!r} with {reasons!r}")
    return Finished("length" if "length" in ended else "stop")


class VllmLocalEngine:
    """vLLM's ``AsyncLLM`` behind the ``InferenceEngine`` protocol.

    ``start()`` builds the engine (loading weights, profiling memory, sizing the KV cache,
    capturing CUDA graphs unless ``enforce_eager``); it runs on the event loop, as vLLM's
    own server does, and blocks it for that long: the worker starts its engine before it
    consumes anything.

    ``capacity()`` is as fresh as vLLM's stats: the engine core computes them at the end of
    every step that had work (a step that frees an aborted request included) and the
    ``AsyncLLM`` output handler records them when it processes that step's outputs. So the
    figures trail the engine by about one step (more if the event loop is backed up), a
    request just submitted appears in ``waiting`` only after the next step, and an idle
    engine keeps the figures of its last step, taken after that step freed its finished
    requests. ``total_blocks`` and ``block_size`` are the engine's after start-up, and
    ``preemptions`` counts since start.
    """

    name: str = "vllm_local"

    @property
    def served_model(self) -> str:
        return self.model

    def __init__(
        self,
        *,
        model: str,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        block_size: int | None = 16,
        max_num_seqs: int = 256,
        temperature: float = 0.0,
        enforce_eager: bool = False,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """``temperature`` 0 decodes greedily. ``engine_kwargs`` go to vLLM's
        ``AsyncEngineArgs`` as they are (e.g. ``dtype``, ``seed``, ``tensor_parallel_size``);
        ``max_model_len`` None lets vLLM take the model's own."""
        self.model = model
        self._engine_args: dict[str, Any] = {
            "model": model,
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_num_seqs": max_num_seqs,
            "enforce_eager": enforce_eager,
            **(engine_kwargs or {}),
        }
        if max_model_len is not None:
            self._engine_args["max_model_len"] = max_model_len
        if block_size is not None:
            self._engine_args["block_size"] = block_size
        self._temperature = temperature
        self._stats = StatsSink()
        self._llm: Any = None  # vllm.v1.engine.async_llm.AsyncLLM once started
        self._tokenizer: Any = None
        self._num_gpu_blocks = 0
        self._block_size = block_size or 16
        self._max_model_len = max_model_len or 0
        self._max_running: int | None = max_num_seqs
        self._engines = 1  # data-parallel engines, each with its own cache
        self._active: dict[str, object] = {}  # request id -> a token of its stream

    async def start(self) -> None:
        if self._llm is not None:
            return
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            **self._engine_args,
            # No periodic log lines (nothing calls AsyncLLM.do_log_stats here). Stats are
            # still collected: AsyncLLM turns them on when a custom stat logger is given.
            disable_log_stats=True,
            enable_log_requests=False,
        )
        self._stats = StatsSink()
        llm = AsyncLLM.from_engine_args(args, stat_loggers=[self._stats.factory])
        # Figures the engine core settled at start-up (synced back to the frontend config).
        config = llm.vllm_config
        self._num_gpu_blocks = int(config.cache_config.num_gpu_blocks or 0)
        self._block_size = int(config.cache_config.block_size)
        self._max_model_len = int(config.model_config.max_model_len)
        self._max_running = int(config.scheduler_config.max_num_seqs)
        self._engines = int(config.parallel_config.data_parallel_size)
        self._tokenizer = llm.get_tokenizer()
        self._llm = llm

    async def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is None:
            return
        open_ids = list(self._active)
        self._active.clear()  # open streams end at their next output, yielding nothing more
        try:
            if open_ids:
                await llm.abort(open_ids)  # each gets its final (aborted) output
        finally:
            llm.shutdown()

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` by the model's tokenizer, special tokens (BOS) included, as the
        engine counts a prompt."""
        if self._tokenizer is None:
            raise EngineNotRunning("the vLLM engine is not started (or already closed)")
        return len(self._tokenizer.encode(text))

    def context_tokens(self) -> int | None:
        return self._max_model_len or None

    async def prompt_tokens(self, request: GenerationRequest) -> int:
        return self.count_tokens(build_prompt(request.kind, request.input, request.instruction))

    def capacity(self) -> Capacity:
        """Blocks and queue as of the engine's last reported step (see the class docstring);
        zero blocks before ``start()``."""
        return self._stats.capacity(
            num_gpu_blocks=self._num_gpu_blocks,
            block_size=self._block_size,
            max_running=self._max_running,
            engines=self._engines,
        )

    async def abort(self, request_id: str) -> None:
        self._active.pop(request_id, None)
        llm = self._llm
        if llm is not None:
            # An external id: vLLM maps it to its internal ids and ignores unknown ones.
            await llm.abort(request_id)

    def generate(self, request: GenerationRequest) -> Generation:
        return Generation(self._generate(request))

    async def _generate(self, request: GenerationRequest) -> AsyncGenerator[str | Finished, None]:
        llm = self._llm
        if llm is None:
            raise EngineNotRunning("the vLLM engine is not started (or already closed)")
        request_id = request.request_id
        if request_id in self._active:
            raise DuplicateRequest(f"request {request_id!r} is already running")
        if request.max_tokens <= 0:
            yield Finished("length")  # nothing may be decoded: cut at once, as vLLM would
            return
        prompt = build_prompt(request.kind, request.input, request.instruction)
        prompt_ids: list[int] = self._tokenizer.encode(prompt)
        needed = len(prompt_ids) + request.max_tokens
        if needed > self._max_model_len:
            raise RequestTooLarge(
                f"{len(prompt_ids)} prompt tokens and {request.max_tokens} output tokens "
                f"exceed the model's context of {self._max_model_len} tokens"
            )

        from vllm import SamplingParams
        from vllm.exceptions import VLLMError
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=request.max_tokens,
            output_kind=RequestOutputKind.DELTA,
            **sampling_kwargs(request.sampling, self._temperature),
        )
        token = object()
        self._active[request_id] = token
        stream = llm.generate(tokens_input(prompt_ids), params, request_id)
        finished = False
        try:
            try:
                async for output in stream:
                    if self._active.get(request_id) is not token:
                        break  # aborted by id (or the engine closed): no further tokens
                    for completion in output.outputs:
                        for piece in output_pieces(completion.text, len(completion.token_ids)):
                            yield piece
                    finished = output.finished
                    if finished:
                        yield finished_output(output, request_id)
            except VLLMError as exc:
                raise EngineError(f"vLLM failed request {request_id!r}: {exc}") from exc
        finally:
            ours = self._active.get(request_id) is token
            if ours:
                del self._active[request_id]
            # Closing vLLM's stream early aborts the request there (vLLM does so on
            # GeneratorExit and CancelledError). Abort by id as well while the id is still
            # ours, for a request cancelled before vLLM handed back its stream.
            await stream.aclose()
            if ours and not finished and self._llm is not None:
                await self._llm.abort(request_id)
