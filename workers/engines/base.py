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
    """What the engine can hold right now."""

    total_slots: int
    free_slots: int
    running: int
    waiting: int = 0
    total_blocks: int = 0
    free_blocks: int = 0
    block_size: int = 16
    preemptions: int = 0


class InferenceEngine(Protocol):
    name: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def count_tokens(self, text: str) -> int: ...

    def capacity(self) -> Capacity: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        """Stream the output, one decoded token's text per item."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a running request; its stream ends without further tokens."""
        ...
