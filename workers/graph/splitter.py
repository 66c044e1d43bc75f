"""Whether a summarize job fits its engine, and if not, its document cut into chunks that
do, measured by the engine's own tokenizer (llama.cpp's and vLLM's ``/tokenize``, the
simulator's count) with the job's instruction around each."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from datetime import datetime

from schemas.jobs import SAFETY, JobKind, fan_in, reduce_levels
from workers.engines.base import GenerationRequest, InferenceEngine
from workers.graph.plan import Plan, pack, units
from workers.repository import ClaimedJob

OVERLAP = 0.04  # of a chunk's budget, carried over from the chunk before
MAX_OVERLAP = 64  # tokens
MEASURING = 8  # chunks measured by the engine at once
MAX_ROUNDS = 6  # cuts of a chunk the engine measured over its budget
CLEARLY_FITS = 0.5  # an estimate under this share of the context is not measured


class CannotSplit(Exception):
    """The document cannot be summarized in parts: its summaries alone fill the context."""

    code = "request_too_large"


@dataclass(frozen=True, kw_only=True)
class Split:
    plan: Plan
    level_s: float  # seconds kept back for each level of reduces


def _request(job: ClaimedJob, text: str) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"{job.id}:measure",
        kind=job.kind,
        input=text,
        max_tokens=job.max_tokens,
        sampling=job.sampling,
    )


class Splitter:
    def __init__(self, engine: InferenceEngine) -> None:
        self._engine = engine

    async def _tokens(self, job: ClaimedJob, text: str) -> int:
        return await self._engine.prompt_tokens(_request(job, text))

    async def split(
        self, job: ClaimedJob, now: datetime, service_s: float | None = None
    ) -> Split | None:
        """None: the job fits its engine (or is not a document); else its graph's plan.
        ``service_s``: the measured time of one reduce, if known."""
        context = self._engine.context_tokens()
        if context is None or job.kind is not JobKind.SUMMARIZE or job.parent_id is not None:
            return None
        if job.prompt_tokens + job.max_tokens <= context * CLEARLY_FITS:
            return None
        whole = await self._tokens(job, job.input)
        if whole + job.max_tokens <= context:
            return None
        overhead = await self._tokens(job, "")
        budget = int((context - job.max_tokens - overhead) * SAFETY)
        most = fan_in(budget, job.max_tokens)
        if most == 0:
            raise CannotSplit(
                f"{whole} prompt tokens exceed the context of {context}, and max_tokens "
                f"{job.max_tokens} leaves no room to combine the summaries of its parts: "
                f"ask for at most {max(1, (context - overhead) // 3 - 2)} tokens"
            )
        per_char = max(whole - overhead, 1) / max(len(job.input), 1)

        def count(text: str) -> int:
            return math.ceil(len(text) * per_char * 1.05) + 1

        overlap = min(MAX_OVERLAP, int(budget * OVERLAP))
        chunks = pack(units(job.input, budget, count), budget, count, overlap=overlap)
        chunks = await self._fitted(job, chunks, budget, overhead, overlap)
        plan = Plan(chunks=chunks, budget_tokens=budget, fan_in=most)
        left_s = (job.deadline - now).total_seconds()
        levels = reduce_levels(len(chunks), most)
        share = left_s * 0.3 / max(levels, 1)  # a third of the time for every reduce level
        level_s = share if service_s is None else min(share, max(3 * service_s, 2.0))
        return Split(plan=plan, level_s=max(level_s, 0.0))

    async def _fitted(
        self, job: ClaimedJob, chunks: list[str], budget: int, overhead: int, overlap: int
    ) -> list[str]:
        """The chunks the engine measured over ``budget`` cut again, smaller, until each
        fits (the estimate per character is the document's average)."""
        gate = asyncio.Semaphore(MEASURING)

        async def measured(chunk: str) -> int:
            async with gate:
                return await self._tokens(job, chunk) - overhead

        for _ in range(MAX_ROUNDS):
            sizes = await asyncio.gather(*(measured(c) for c in chunks))
            over = [i for i, size in enumerate(sizes) if size > budget]
            if not over:
                return chunks
            out: list[str] = []
            for i, chunk in enumerate(chunks):
                if i not in over:
                    out.append(chunk)
                    continue
                per_char = sizes[i] / max(len(chunk), 1)

                def count(text: str, per_char: float = per_char) -> int:
                    return math.ceil(len(text) * per_char * 1.1) + 1

                out.extend(pack(units(chunk, budget, count), budget, count, overlap=0))
            chunks = out
        return chunks
