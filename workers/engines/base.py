"""The seam between the worker and an inference engine."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from schemas.jobs import FinishReason, JobKind
from schemas.sampling import instruction, options_of


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """A job's model and sampling parameters, as its request gave them (None: the engine's
    default), and a summary's instruction. ``model`` was checked at ingress against the
    served names (setting ``models``): each engine serves one model, so it is reported, not
    routed on. ``instruction`` is composed from the job's summary options
    (``schemas.sampling.instruction``); None: the default one."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    instruction: str | None = None

    @classmethod
    def from_stored(cls, params: Mapping[str, Any] | None) -> SamplingParams | None:
        """The parameters a job's ``params`` column holds (schemas/sampling.py); None when
        it holds none."""
        if not params:
            return None
        temperature, top_p, seed = (
            params.get("temperature"),
            params.get("top_p"),
            params.get("seed"),
        )
        summary = options_of(params)
        return cls(
            model=params.get("model"),
            temperature=float(temperature) if temperature is not None else None,
            top_p=float(top_p) if top_p is not None else None,
            stop=tuple(str(s) for s in params.get("stop") or ()),
            seed=int(seed) if seed is not None else None,
            instruction=instruction(summary) if summary is not None else None,
        )


def openai_sampling(sampling: SamplingParams | None) -> dict[str, Any]:
    """The fields of an OpenAI-compatible request body that apply ``sampling`` (those set);
    vLLM's and llama.cpp's servers both take ``temperature``, ``top_p``, ``stop``, ``seed``."""
    if sampling is None:
        return {}
    fields: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "stop": list(sampling.stop) or None,
        "seed": sampling.seed,
    }
    return {key: value for key, value in fields.items() if value is not None}


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    request_id: str
    kind: JobKind
    input: str
    max_tokens: int
    sampling: SamplingParams | None = None  # None: the engine's defaults throughout

    @property
    def instruction(self) -> str | None:
        """A summary's instruction (``prompts.build_prompt``); None: the default one."""
        return self.sampling.instruction if self.sampling is not None else None


@dataclass(frozen=True)
class Finished:
    """The last item of an engine's output source: why the engine ended the output, as it
    reported it (vLLM's and llama.cpp's ``finish_reason``)."""

    reason: FinishReason


class Generation:
    """One request's output, as ``InferenceEngine.generate`` streams it: one decoded token's
    text per item. Once the stream has ended on its own, ``finish_reason`` says why, as the
    engine reported it (``stop`` or ``length``); it stays None for an output that did not
    end so (aborted, closed early, failed).

    An engine makes it from an async generator of its pieces that yields a ``Finished`` last;
    a wrapper engine makes its own from an inner generation's ``items()``. Closing it
    (``aclose``) closes that generator, which aborts the request.
    """

    def __init__(self, source: AsyncGenerator[str | Finished, None]) -> None:
        self._source = source
        self.finish_reason: FinishReason | None = None

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> str:
        if self.finish_reason is not None:
            raise StopAsyncIteration
        item = await anext(self._source)
        if isinstance(item, Finished):
            self.finish_reason = item.reason
            await self._source.aclose()  # nothing follows the end
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        await self._source.aclose()

    async def items(self) -> AsyncGenerator[str | Finished, None]:
        """This output as another generation's source (a wrapper engine's): its pieces,
        then its ``Finished`` if it ended on its own. Closing it closes this one."""
        async with contextlib.aclosing(self):
            async for piece in self:
                yield piece
        if self.finish_reason is not None:
            yield Finished(self.finish_reason)


@dataclass(frozen=True, kw_only=True)
class Capacity:
    """What the engine holds right now, in vLLM's terms.

    ``max_running`` is the engine's cap on running sequences (vLLM's ``max_num_seqs``), or
    None where the engine does not report it.

    ``slot_context`` is set where each running sequence has a context of its own of that many
    tokens (llama.cpp's slots): the blocks are then slots (``block_size`` = ``slot_context``),
    and a job needs one free slot whose context holds its prompt and output. None for a paged
    cache whose blocks every sequence shares (vLLM, the simulator).
    """

    total_blocks: int
    free_blocks: int
    block_size: int
    running: int
    waiting: int
    preemptions: int
    max_running: int | None = None
    slot_context: int | None = None

    @property
    def usage(self) -> float:
        """Fraction of KV blocks in use (vLLM's ``kv_cache_usage_perc``, 0..1)."""
        if self.total_blocks <= 0:
            return 0.0
        return 1.0 - self.free_blocks / self.total_blocks


class InferenceEngine(Protocol):
    name: str

    @property
    def served_model(self) -> str:
        """The model this engine serves, named as the engine names it (llama.cpp's model
        alias, vLLM's served name, ``sim``): a result reports it as the model that made it."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def count_tokens(self, text: str) -> int:
        """Prompt tokens of ``text`` as this engine counts them (an estimate where the
        engine's tokenizer is remote)."""
        ...

    def context_tokens(self) -> int | None:
        """Tokens one request's prompt and output may hold together: llama.cpp's slot
        context, vLLM's ``max_model_len``. None: not known yet."""
        ...

    async def prompt_tokens(self, request: GenerationRequest) -> int:
        """The request's prompt tokens exactly as this engine builds and counts them (its
        instruction and chat template included): the tokenizer's, a round trip where it
        is remote. A summarize job longer than ``context_tokens`` is cut by this count."""
        ...

    def capacity(self) -> Capacity: ...

    def generate(self, request: GenerationRequest) -> Generation:
        """Stream the output, one decoded token's text per item, and why it ended
        (``Generation.finish_reason``). Closing the stream early (or cancelling its
        consumer) aborts the request."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request, queued or running; its stream ends without further tokens and
        its KV blocks are freed. Unknown ids are ignored."""
        ...
