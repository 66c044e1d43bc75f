"""KV-true admission on the worker: start a job only when the free KV blocks, less the
growth still reserved for the jobs already running, cover its need; and the engine's
measured speed, from the jobs it finished (``SpeedMeter``): how long a job would take now.

The speed is two figures, each the median over a window of recent jobs: prefill seconds per
prompt token (time to the first output token over the prompt length) and seconds per output
token after the first. Both include whatever batching the engine did at the time, so the
prediction follows the load."""

from __future__ import annotations

import math
import statistics
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

    A new job starts when the blocks the running jobs will hold at once, at their peak,
    plus its own need fit in the cache beside the watermark (``committed``), and its need
    fits in what is free right now. The peak is not the sum of every job's final size:
    decoding jobs grow one token a step together (continuous batching decodes every running
    request each step) and give all their blocks back when they end, so the most they hold
    at once is the peak of that timeline. Jobs without a first token yet (queued in the
    engine or prefilling) count at their whole need until the end: how long they wait is
    not known. The model is kept in absolute blocks, so a job the engine already finished
    but the ledger not yet forgotten is never counted as freeing its blocks twice, and it
    allows one block a decoding job for the ledger trailing the engine by a few steps.
    """

    def __init__(self, *, block_size: int, watermark_blocks: int = 0) -> None:
        self.block_size = block_size
        self.watermark_blocks = watermark_blocks
        self._jobs: dict[str, _Reservation] = {}

    def need(self, prompt_tokens: int, expected_output_tokens: int) -> int:
        return kv_need(prompt_tokens, expected_output_tokens, self.block_size)

    def committed(self) -> int:
        """Most blocks the running jobs will hold at once, by the model above."""
        bs = self.block_size
        pending = 0
        live: list[tuple[int, int]] = []  # (steps left, tokens whose KV is written)
        for job in self._jobs.values():
            if job.decoded == 0:
                pending += kv_need(job.prompt_tokens, job.expected_output, bs)
            else:
                steps = max(job.expected_output - job.decoded, 0)
                live.append((steps, job.prompt_tokens + job.decoded - 1))
        live.sort()
        # At s steps from now a job with at least s steps left holds ceil((written + s)/bs)
        # blocks, at most (written + s + bs - 1)/bs, plus one for lag; the others have
        # ended. The sum only grows between two endings, so its peak is at one of them.
        peak = written_sum = 0
        for count, (steps, written) in enumerate(reversed(live), start=1):
            written_sum += written
            peak = max(peak, (written_sum + count * (steps + 2 * bs - 1)) // bs)
        return pending + peak

    def available(self, free_blocks: int, total_blocks: int) -> int:
        """Blocks a new job may take now."""
        return min(total_blocks - self.committed(), free_blocks) - self.watermark_blocks

    def can_start(self, need_blocks: int, free_blocks: int, total_blocks: int) -> bool:
        return self.available(free_blocks, total_blocks) >= need_blocks

    def reserved_growth(self, used_blocks: int) -> int:
        """Blocks set aside beyond those in use: what the running jobs may still take."""
        return max(self.committed() - used_blocks, 0)

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


class SpeedMeter:
    def __init__(self, *, window: int = 256, min_samples: int = 8) -> None:
        self._prefill: deque[float] = deque(maxlen=window)
        self._decode: deque[float] = deque(maxlen=window)
        self._min_samples = min_samples

    def record(
        self, *, prompt_tokens: int, first_token_s: float, output_tokens: int, total_s: float
    ) -> None:
        """One job that decoded to its end (an aborted one says nothing about speed)."""
        if prompt_tokens <= 0 or output_tokens <= 0:
            return
        self._prefill.append(max(first_token_s, 0.0) / prompt_tokens)
        if output_tokens > 1:
            self._decode.append(max(total_s - first_token_s, 0.0) / (output_tokens - 1))

    @property
    def samples(self) -> int:
        return len(self._decode)

    def service_s(self, *, prompt_tokens: int, output_tokens: int) -> float | None:
        """Predicted seconds from handing the job to the engine to its last token, or None
        until enough jobs were measured."""
        if len(self._decode) < self._min_samples:
            return None
        prefill = statistics.median(self._prefill) * prompt_tokens
        return prefill + statistics.median(self._decode) * max(output_tokens - 1, 0)
