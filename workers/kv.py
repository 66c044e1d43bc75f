"""KV-true admission on the worker: start a job only when the free KV blocks, less the
growth still reserved for the jobs already running, cover its need."""

from __future__ import annotations

import math
from dataclasses import dataclass


def kv_need(prompt_tokens: int, expected_output_tokens: int, block_size: int) -> int:
    """Blocks a job needs at its end: ceil((prompt + expected output) / block size)."""
    return math.ceil((prompt_tokens + expected_output_tokens) / block_size)


@dataclass
class _Reservation:
    prompt_tokens: int
    need_blocks: int
    decoded: int = 0


class KvLedger:
    """What the running jobs will still take from the engine's free blocks.

    The engine reports free blocks now; a running job holds blocks for what it has prefilled
    and decoded so far and will take more as it decodes, up to its need. That future growth
    is reserved, so a new job starts only if it fits beside it.
    """

    def __init__(self, *, block_size: int, watermark_blocks: int = 0) -> None:
        self.block_size = block_size
        self.watermark_blocks = watermark_blocks
        self._jobs: dict[str, _Reservation] = {}

    def need(self, prompt_tokens: int, expected_output_tokens: int) -> int:
        return kv_need(prompt_tokens, expected_output_tokens, self.block_size)

    def reserved_growth(self) -> int:
        growth = 0
        for job in self._jobs.values():
            held = math.ceil((job.prompt_tokens + job.decoded) / self.block_size)
            growth += max(job.need_blocks - held, 0)
        return growth

    def can_start(self, need_blocks: int, free_blocks: int) -> bool:
        return free_blocks - self.reserved_growth() - self.watermark_blocks >= need_blocks

    def started(self, job_id: str, *, prompt_tokens: int, need_blocks: int) -> None:
        self._jobs[job_id] = _Reservation(prompt_tokens=prompt_tokens, need_blocks=need_blocks)

    def decoded(self, job_id: str, tokens: int = 1) -> None:
        job = self._jobs.get(job_id)
        if job is not None:
            job.decoded += tokens

    def finished(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    @property
    def running(self) -> int:
        return len(self._jobs)
