"""The seam between the worker and an inference engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from schemas.jobs import JobKind


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    request_id: str
    kind: JobKind
    input: str
    max_tokens: int


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

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def count_tokens(self, text: str) -> int:
        """Prompt tokens of ``text`` as this engine counts them (an estimate where the
        engine's tokenizer is remote)."""
        ...

    def capacity(self) -> Capacity: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        """Stream the output, one decoded token's text per item. Closing the stream early
        (or cancelling its consumer) aborts the request."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request, queued or running; its stream ends without further tokens and
        its KV blocks are freed. Unknown ids are ignored."""
        ...
