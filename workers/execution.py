"""Run a claimed job on the engine and write its end: succeeded, failed, or stopped
mid-decode (cancelled, abandoned, or past its deadline) with its decoded tokens wasted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from plumbing.logs import Tally
from plumbing.retry import Stopped, retrying
from schemas import reasons
from schemas.jobs import FinishReason
from schemas.states import JobState
from workers.control import Control, Running
from workers.end_repository import EndRepository
from workers.engines.base import GenerationRequest, InferenceEngine
from workers.engines.errors import EngineAborted, EngineError
from workers.gate import Drop, PreDecodeGate, too_long
from workers.graph.splitter import CannotSplit, Splitter
from workers.metrics import (
    ABORTED,
    CHUNKS,
    GRAPHS,
    JOB_SECONDS,
    JOBS_FINISHED,
    JOBS_STARTED,
    TOKENS_DECODED,
    WASTED_TOKENS,
)
from workers.repository import ClaimedJob, WorkerRepository

log = logging.getLogger(__name__)

T = TypeVar("T")


class Progress(Protocol):
    """Told how a job's decoding goes (the pull gate's KV ledger listens)."""

    def prompt_counted(self, tokens: int) -> None: ...

    def decoded(self) -> None: ...

    def completed(self, output_tokens: int) -> None: ...

    def ended(self) -> None: ...


@dataclass
class Decoded:
    pieces: list[str] = field(default_factory=list)
    first_s: float = 0.0  # to the first output token
    total_s: float = 0.0  # to the end of the stream
    failure: dict[str, Any] | None = None
    finish_reason: FinishReason | None = None  # as the engine reported it


class Executor:
    def __init__(
        self,
        *,
        engine: InferenceEngine,
        repo: WorkerRepository,
        ends: EndRepository,
        control: Control,
        predecode: PreDecodeGate,
        takeover_grace_s: float = 20.0,
    ) -> None:
        self._engine = engine
        self._repo = repo
        self._ends = ends
        self.control = control
        self._predecode = predecode
        self._takeover_grace_s = takeover_grace_s
        self._splitter = Splitter(engine)
        # A batch cancel fences off every attempt of its running jobs at once: the first,
        # then one line counting the rest.
        self.fenced = Tally(
            log,
            "{count} more job attempts were fenced off in {seconds:.1f}s (their jobs were "
            "cancelled, expired or taken over elsewhere); their results were dropped",
        )

    async def claim(
        self, job_ids: list[str], stop: asyncio.Event | None = None
    ) -> dict[str, ClaimedJob | Drop | None] | None:
        """Judge and claim a batch through the pre-decode gate; None if ``stop`` came while
        the database was unavailable (the records stay uncommitted)."""
        try:
            return await self._retrying(
                lambda: self._repo.claim_batch(
                    job_ids,
                    lambda job: self._predecode.verdict(
                        job,
                        datetime.now(UTC),
                        whole=not too_long(
                            self._engine, job.kind, job.prompt_tokens, job.max_tokens
                        ),
                    ),
                    self._engine.count_tokens,
                ),
                stop,
            )
        except Stopped:
            return None

    async def set_aside(self, subject: str, reason: str, payload: bytes) -> None:
        """Dead-letter a record that cannot be run (through database outages)."""
        await self._retrying(
            lambda: self._repo.set_aside(subject=subject, reason=reason, payload=payload)
        )

    async def run(self, job: ClaimedJob, progress: Progress) -> None:
        """Decode a claimed job to a terminal state, or leave it for redelivery if the
        task is cancelled first (a revoke or a stop past the drain timeout).

        Returning means the job is terminal, so its record may be committed. When another
        attempt took the job over and it is not terminal, it is claimed back after
        ``takeover_grace_s`` unless it has ended by then: the other attempt can be a
        zombie's (a worker expelled from the group that still read a record of this
        partition), whose revoke drops or cancels its attempt and leaves the job running
        for no one.
        """
        current: ClaimedJob | None = job
        while current is not None:
            if await self._attempt(current, progress):
                return
            current = await self._take_back(current)

    async def _attempt(self, job: ClaimedJob, progress: Progress) -> bool:
        """One attempt; whether the job is terminal after it (ended here or elsewhere)."""
        graphed = await self._as_graph(job, progress)
        if graphed is not None:
            return graphed
        running = self.control.track(job, f"{job.id}:{job.attempt}")
        try:
            decoded = await self._decode(running, progress)
            progress.ended()  # its KV is free before its end is written
            if running.reason is not None:
                ended = await self._stopped(running)
            elif decoded.failure is not None:
                WASTED_TOKENS.labels(reason="failed").inc(len(decoded.pieces))
                ended = await self._finish(
                    job, JobState.FAILED, error=decoded.failure, decoded_tokens=len(decoded.pieces)
                )
            else:
                ended = await self._succeeded(job, decoded, progress)
        finally:
            self.control.untrack(running)
        return ended or await self._retrying(lambda: self._repo.is_terminal(job.id))

    async def _as_graph(self, job: ClaimedJob, progress: Progress) -> bool | None:
        """A document too long for the engine, cut into a graph of jobs in place of its
        run: whether it is done here (graphed, or ended elsewhere); None: it runs whole."""
        try:
            split = await self._splitter.split(
                job,
                datetime.now(UTC),
                self._predecode.speed.service_s(prompt_tokens=0, output_tokens=job.max_tokens),
            )
        except CannotSplit as exc:
            progress.ended()
            error = {"code": exc.code, "message": str(exc)}
            return await self._finish(job, JobState.FAILED, error=error, decoded_tokens=0)
        except EngineError:
            return None  # the engine cannot measure it now: its run fails or waits as any
        if split is None:
            return None
        progress.ended()  # it holds no KV: it is never decoded whole
        plan = split.plan
        written = await asyncio.shield(
            self._retrying(lambda: self._repo.graphs.make(job.id, job.attempt, plan, split.level_s))
        )
        if written:
            GRAPHS.inc()
            CHUNKS.inc(len(plan.chunks))
            log.info(
                "job %s: longer than the engine's context of %d tokens (about %d prompt "
                "tokens); cut into %d chunks of at most %d, %d levels planned",
                job.id,
                self._engine.context_tokens() or 0,
                job.prompt_tokens,
                len(plan.chunks),
                plan.budget_tokens,
                plan.levels,
            )
            return True
        return await self._retrying(lambda: self._repo.is_terminal(job.id))

    async def _take_back(self, job: ClaimedJob) -> ClaimedJob | None:
        """Claim a job back from the attempt that took it over, once that attempt had
        ``takeover_grace_s`` to end it; None if it ended (or the pre-decode gate dropped
        it)."""
        log.warning(
            "job %s attempt %d was taken over but has not ended; claiming it back in %.1fs",
            job.id,
            job.attempt,
            self._takeover_grace_s,
        )
        await asyncio.sleep(self._takeover_grace_s)
        outcomes = await self.claim([job.id])
        outcome = outcomes.get(job.id) if outcomes is not None else None
        return outcome if isinstance(outcome, ClaimedJob) else None

    async def _decode(self, running: Running, progress: Progress) -> Decoded:
        job = running.job
        request = GenerationRequest(
            request_id=running.request_id,
            kind=job.kind,
            input=job.input,
            max_tokens=job.max_tokens,
            sampling=job.sampling,
        )
        progress.prompt_counted(job.prompt_tokens)
        out = Decoded()
        if running.reason is not None:
            return out  # stopped between the claim and this line
        JOBS_STARTED.inc()
        started = time.monotonic()
        stream = self._engine.generate(request)
        try:
            async for piece in stream:
                if running.reason is not None:
                    break  # stopped: not one more token is taken
                if not out.pieces:
                    out.first_s = time.monotonic() - started
                out.pieces.append(piece)
                running.decoded += 1
                progress.decoded()
                TOKENS_DECODED.inc()
        except asyncio.CancelledError:
            await asyncio.shield(self._engine.abort(request.request_id))
            raise
        except Exception as exc:
            log.exception("engine failed on job %s", job.id)
            code = getattr(exc, "code", "engine_error")
            out.failure = {"code": code, "message": str(exc)[:500]}
        finally:
            with contextlib.suppress(Exception):
                await _close(stream)
        out.total_s = time.monotonic() - started
        out.finish_reason = stream.finish_reason
        if out.finish_reason is None and out.failure is None and running.reason is None:
            # The engine ended the output without saying why: it was aborted there (a
            # close, an abort from elsewhere), not finished; its text is not a whole one.
            out.failure = {
                "code": EngineAborted.code,
                "message": "the engine ended the output before it finished (no finish_reason)",
            }
        return out

    async def _succeeded(self, job: ClaimedJob, decoded: Decoded, progress: Progress) -> bool:
        ended = datetime.now(UTC)
        pieces = decoded.pieces
        progress.completed(len(pieces))
        self._predecode.speed.record(
            prompt_tokens=job.prompt_tokens,
            first_token_s=decoded.first_s,
            output_tokens=len(pieces),
            total_s=decoded.total_s,
        )
        if ended > job.deadline:
            # The last token came after the deadline, before its timer fired: late is
            # expired, whatever the margin.
            WASTED_TOKENS.labels(reason=reasons.DEADLINE_PASSED).inc(len(pieces))
            drop = Drop(state=JobState.EXPIRED, reason=reasons.DEADLINE_PASSED)
            if await self._finish(
                job, drop.state, error=drop.error("decode"), decoded_tokens=len(pieces), at=ended
            ):
                return True
            await self._retrying(lambda: self._repo.record_decoded(job, len(pieces)))
            return False
        result = {
            "text": "".join(pieces),
            "engine": self._engine.name,
            "simulated": self._engine.name == "sim",
            "prompt_tokens": job.prompt_tokens,
            "output_tokens": len(pieces),
            "finish_reason": decoded.finish_reason,  # stop or length, as the engine said
        }
        if job.sampling is not None and job.sampling.model is not None:
            result["model"] = job.sampling.model  # the name asked for
        result["served_model"] = self._engine.served_model  # the model that made it
        written = await self._finish(
            job, JobState.SUCCEEDED, result=result, decoded_tokens=len(pieces), at=ended
        )
        if not written:  # cancelled, abandoned or taken over after its last token
            WASTED_TOKENS.labels(reason="superseded").inc(len(pieces))
            await self._retrying(lambda: self._repo.record_decoded(job, len(pieces)))
        return written

    async def _stopped(self, running: Running) -> bool:
        """The job was stopped mid-decode: make sure the engine let go of it, count what
        it decoded as wasted, and write or annotate its end. Whether it is known to have
        ended (not when another attempt took it over)."""
        job, reason, decoded = running.job, running.reason or "stopped", running.decoded
        await asyncio.shield(self._engine.abort(running.request_id))
        ABORTED.labels(reason=reason).inc()
        WASTED_TOKENS.labels(reason=reason).inc(decoded)
        if running.state is None:  # the deadline passed: this worker writes the end
            drop = Drop(state=JobState.EXPIRED, reason=reason)
            if await self._finish(
                job, drop.state, error=drop.error("decode"), decoded_tokens=decoded
            ):
                return True
        if running.state is not None and not running.state.terminal:
            self.fenced.add(
                "job %s attempt %d was fenced off mid-decode: taken over elsewhere",
                job.id,
                job.attempt,
            )
        await self._retrying(lambda: self._repo.record_decoded(job, decoded))
        return running.state is not None and running.state.terminal

    async def _finish(
        self,
        job: ClaimedJob,
        state: JobState,
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        decoded_tokens: int | None = None,
        at: datetime | None = None,
    ) -> bool:
        # Shielded: a stop or revoke must not lose a result that was computed.
        written = await asyncio.shield(
            self._retrying(
                lambda: self._ends.finish(
                    job, state, result=result, error=error, decoded_tokens=decoded_tokens, at=at
                )
            )
        )
        if written:
            JOBS_FINISHED.labels(state=state.value).inc()
            JOB_SECONDS.observe((datetime.now(UTC) - job.created_at).total_seconds())
        else:
            self.fenced.add("job %s attempt %d was fenced off; result dropped", job.id, job.attempt)
        return written

    async def _retrying(
        self, op: Callable[[], Awaitable[T]], stop: asyncio.Event | None = None
    ) -> T:
        """A database operation, run again after a transient error (a deadlock, a
        serialization failure, an outage: ``plumbing.retry.transient_error``) until it
        succeeds or ``stop`` is set (``Stopped``); the record stays uncommitted meanwhile.
        Any other error is raised."""
        return await retrying("worker", op, stop=stop)


async def _close(stream: object) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()
