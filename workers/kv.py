"""KV-true admission on the worker: start a job only when the free KV blocks, less the
growth still reserved for the jobs already running, cover its need."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from schemas.jobs import JobKind


def kv_need(prompt_tokens: int, expected_output_tokens: int, block_size: int) -> int:
    """Blocks a job needs at its end: ceil((prompt + expected output) / block size)."""
    return math.ceil((prompt_tokens + expected_output_tokens) / block_size)


@dataclass
class _Reservation:
    prompt_tokens: int
    expected_output: int
    decoded: int = 0


class KvLedger:
    """What the running jobs will still take from the engine's free blocks.

    The engine reports free blocks now. A job the engine has not prefilled yet holds none of
    its need; once its first token is out it holds blocks for its prompt and every decoded
    token but the last (whose KV is written by the next step, as in vLLM), and it takes more
    as it decodes, up to its need. Before the first token a job is counted as holding
    nothing, so blocks the engine already gave its prompt are counted twice: the error is on
    the safe side and lasts one prefill.

    The growth to reserve is not the sum of every job's remaining growth: decoding jobs
    grow one token a step together (continuous batching decodes every running request each
    step) and give all their blocks back when they end, so the most they need at once is the
    peak of that timeline (``reserved_growth``). Jobs without a first token yet (queued in
    the engine or prefilling) are reserved at their whole need until the end: how long they
    wait is not known.
    """

    def __init__(self, *, block_size: int, watermark_blocks: int = 0) -> None:
        self.block_size = block_size
        self.watermark_blocks = watermark_blocks
        self._jobs: dict[str, _Reservation] = {}

    def need(self, prompt_tokens: int, expected_output_tokens: int) -> int:
        return kv_need(prompt_tokens, expected_output_tokens, self.block_size)

    def reserved_growth(self) -> int:
        """Most blocks, beyond those held now, that the running jobs will need at once."""
        bs = self.block_size
        pending = held_total = 0
        live: list[tuple[int, int]] = []  # (steps left, tokens whose KV is written)
        for job in self._jobs.values():
            if job.decoded == 0:
                pending += kv_need(job.prompt_tokens, job.expected_output, bs)
                continue
            written = job.prompt_tokens + job.decoded - 1
            held_total += math.ceil(written / bs)
            live.append((max(job.expected_output - job.decoded, 0), written))
        live.sort()
        # At s steps from now the jobs with at least s steps left hold
        # ceil((written + s) / bs) <= (written + s + bs - 1) / bs blocks each; the rest
        # have ended. The sum only grows between two endings, so its peak is at one.
        peak = suffix_written = 0
        for count, (steps, written) in enumerate(reversed(live), start=1):
            suffix_written += written
            peak = max(peak, (suffix_written + count * (steps + bs - 1)) // bs)
        peak = min(peak - held_total, self._sum_of_growth())
        return pending + max(peak, 0)

    def _sum_of_growth(self) -> int:
        """The decoding jobs' remaining growth added up: the peak never exceeds it."""
        return sum(self._growth(job) for job in self._jobs.values() if job.decoded > 0)

    def reserved(self, job_id: str) -> int:
        """Blocks still reserved for one job's growth (0 for an unknown job)."""
        job = self._jobs.get(job_id)
        return self._growth(job) if job is not None else 0

    def _growth(self, job: _Reservation) -> int:
        need = kv_need(job.prompt_tokens, job.expected_output, self.block_size)
        held = 0
        if job.decoded > 0:
            held = math.ceil((job.prompt_tokens + job.decoded - 1) / self.block_size)
        return max(need - held, 0)

    def available(self, free_blocks: int) -> int:
        """Blocks a new job may take: free, less reserved growth, less the watermark."""
        return free_blocks - self.reserved_growth() - self.watermark_blocks

    def can_start(self, need_blocks: int, free_blocks: int) -> bool:
        return self.available(free_blocks) >= need_blocks

    def started(self, job_id: str, *, prompt_tokens: int, expected_output: int) -> None:
        self._jobs[job_id] = _Reservation(prompt_tokens, expected_output)

    def prompt_counted(self, job_id: str, prompt_tokens: int) -> None:
        """The engine's own count of the prompt replaces the producer's estimate."""
        if (job := self._jobs.get(job_id)) is not None:
            job.prompt_tokens = prompt_tokens

    def decoded(self, job_id: str, tokens: int = 1) -> None:
        if (job := self._jobs.get(job_id)) is not None:
            job.decoded += tokens

    def finished(self, job_id: str) -> tuple[int, int] | None:
        """Forget the job; returns (expected, decoded) output tokens for the record."""
        job = self._jobs.pop(job_id, None)
        return (job.expected_output, job.decoded) if job is not None else None

    @property
    def running(self) -> int:
        return len(self._jobs)


class ExpectedOutput:
    """Output tokens to reserve for a job.

    By default its ``max_tokens``, which never under-reserves. With ``observed``, once
    ``min_samples`` jobs of the same kind finished, the ``quantile`` of their recent output
    lengths (capped by ``max_tokens``): tighter packing, at the price of jobs that outgrow
    their reservation (counted by the caller, eaten from the watermark, and in the worst
    case preempted by the engine).
    """

    def __init__(
        self,
        *,
        observed: bool = False,
        quantile: float = 0.95,
        min_samples: int = 50,
        window: int = 1000,
    ) -> None:
        self._observed = observed
        self._quantile = quantile
        self._min_samples = min_samples
        self._samples: dict[JobKind, deque[int]] = {}
        self._window = window

    def tokens(self, kind: JobKind, max_tokens: int) -> int:
        samples = self._samples.get(kind)
        if not self._observed or samples is None or len(samples) < self._min_samples:
            return max_tokens
        ordered = sorted(samples)
        index = min(len(ordered) - 1, math.ceil(self._quantile * len(ordered)) - 1)
        return min(max_tokens, ordered[max(index, 0)])

    def record(self, kind: JobKind, output_tokens: int) -> None:
        self._samples.setdefault(kind, deque(maxlen=self._window)).append(output_tokens)
