"""Run one dispatch record: claim the job, decode it on the engine, write its end."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from schemas.envelopes import DispatchEnvelope
from schemas.states import JobState
from workers.engines.base import GenerationRequest, InferenceEngine
from workers.metrics import JOB_SECONDS, JOBS_FINISHED, JOBS_STARTED, TOKENS_DECODED
from workers.repository import Claimed, WorkerRepository

log = logging.getLogger(__name__)

T = TypeVar("T")

_TRANSIENT = (OperationalError, InterfaceError, PoolTimeout, OSError)
MAX_BACKOFF_S = 5.0


class Progress(Protocol):
    """Told how a job's decoding goes (the pull gate's KV ledger listens)."""

    def prompt_counted(self, tokens: int) -> None: ...

    def decoded(self) -> None: ...

    def completed(self, output_tokens: int) -> None: ...


class Executor:
    def __init__(self, *, engine: InferenceEngine, repo: WorkerRepository) -> None:
        self._engine = engine
        self._repo = repo

    async def run(self, envelope: DispatchEnvelope, progress: Progress) -> None:
        """Run the job to a terminal state, or leave it for redelivery if stopped first."""
        job = await self._retrying(lambda: self._repo.claim(envelope.job_id))
        if job is None:
            log.info("job %s is not claimable (terminal, cancelled or unknown)", envelope.job_id)
            return
        if job.deadline <= datetime.now(UTC):
            await self._finish(
                job, JobState.EXPIRED, error={"code": "deadline_passed", "message": "expired"}
            )
            return
        state, result, error = await self._decode(job, progress)
        await self._finish(job, state, result=result, error=error)

    async def _decode(
        self, job: Claimed, progress: Progress
    ) -> tuple[JobState, dict[str, Any] | None, dict[str, Any] | None]:
        request = GenerationRequest(
            request_id=f"{job.id}:{job.attempt}",
            kind=job.kind,
            input=job.input,
            max_tokens=job.max_tokens,
        )
        prompt_tokens = self._engine.count_tokens(job.input)
        progress.prompt_counted(prompt_tokens)
        JOBS_STARTED.inc()
        pieces: list[str] = []
        try:
            async for piece in self._engine.generate(request):
                pieces.append(piece)
                progress.decoded()
                TOKENS_DECODED.inc()
        except asyncio.CancelledError:
            await asyncio.shield(self._engine.abort(request.request_id))
            raise
        except Exception as exc:
            log.exception("engine failed on job %s", job.id)
            code = getattr(exc, "code", "engine_error")
            return JobState.FAILED, None, {"code": code, "message": str(exc)[:500]}
        progress.completed(len(pieces))
        result = {
            "text": "".join(pieces),
            "engine": self._engine.name,
            "simulated": self._engine.name == "sim",
            "prompt_tokens": prompt_tokens,
            "output_tokens": len(pieces),
        }
        return JobState.SUCCEEDED, result, None

    async def _finish(
        self,
        job: Claimed,
        state: JobState,
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        # Shielded: a stop or revoke must not lose a result that was computed.
        written = await asyncio.shield(
            self._retrying(lambda: self._repo.finish(job, state, result=result, error=error))
        )
        if written:
            JOBS_FINISHED.labels(state=state.value).inc()
            JOB_SECONDS.observe((datetime.now(UTC) - job.created_at).total_seconds())
        else:
            log.info("job %s attempt %d was fenced off; result dropped", job.id, job.attempt)

    async def _retrying(self, op: Callable[[], Awaitable[T]]) -> T:
        """Retry a database operation through outages; the record stays uncommitted."""
        backoff = 0.1
        while True:
            try:
                return await op()
            except _TRANSIENT as exc:
                log.warning("database unavailable, retrying in %.1fs: %r", backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
