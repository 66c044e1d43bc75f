"""How a worker learns that a running job must stop, and stops it in the engine.

Three ways, none of them a query per token:
- a NOTIFY on the jobs channel: a cancel or a disconnect wrote the job's terminal state
  (a trigger sends one for every terminal write), heard within milliseconds;
- the job's deadline: a timer per running job;
- a sweep over the jobs running here, in one statement: it abandons the jobs whose
  heartbeat lease lapsed, and catches a change no notice tells (a newer attempt took a job
  over) or a notice missed while the LISTEN connection was down (it sweeps at once on every
  reconnect). Every ``control_sweep_s`` while a job running here has a heartbeat lease;
  otherwise every ``SLOW_SWEEPS`` times that, as nothing but a takeover can be missed.
The engine is told to abort as soon as the stop is known; the executor then writes the end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy.exc import SQLAlchemyError

from plumbing.notify import JobNotice, Listener
from plumbing.retry import count as count_retry
from plumbing.retry import wait_first
from schemas import constants, reasons
from schemas.states import JobState
from workers.engines.base import InferenceEngine
from workers.metrics import ABORT_SECONDS
from workers.repository import ClaimedJob, WorkerRepository

log = logging.getLogger(__name__)

SLOW_SWEEPS = 10  # with no heartbeat lease among the running jobs: a sweep every 10 intervals


@dataclass(eq=False)
class Running:
    """A job on the engine, and why it was stopped (if it was)."""

    job: ClaimedJob
    request_id: str
    decoded: int = 0
    reason: str | None = None
    # The terminal state somebody else already wrote; None with a reason means the worker
    # must write it (the deadline passed mid-decode).
    state: JobState | None = None
    decoded_when_stopped: int | None = None
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    timer: asyncio.TimerHandle | None = None


class Control:
    def __init__(
        self,
        *,
        engine: InferenceEngine,
        repo: WorkerRepository,
        database_url: str | None,
        sweep_s: float,
    ) -> None:
        self._engine = engine
        self._repo = repo
        self._database_url = database_url
        self._sweep_s = sweep_s
        self._running: dict[str, Running] = {}
        self._sweep_now = asyncio.Event()
        self._slow = 0  # intervals since the last slow sweep
        self._aborts: set[asyncio.Task[None]] = set()

    def track(self, job: ClaimedJob, request_id: str) -> Running:
        running = Running(job=job, request_id=request_id)
        delay = (job.deadline - datetime.now(UTC)).total_seconds()
        running.timer = asyncio.get_running_loop().call_later(
            max(delay, 0.0), self.stop, running, None, reasons.DEADLINE_PASSED, None
        )
        self._running[job.id] = running
        return running

    def untrack(self, running: Running) -> None:
        if running.timer is not None:
            running.timer.cancel()
        if self._running.get(running.job.id) is running:
            del self._running[running.job.id]

    def stop(
        self, running: Running, state: JobState | None, reason: str, written_at: float | None
    ) -> None:
        """Stop a running job now: the engine aborts it before its next step."""
        if running.reason is not None:
            return
        running.reason = reason
        running.state = state
        running.decoded_when_stopped = running.decoded
        running.stopped.set()
        if running.timer is not None:
            running.timer.cancel()
        task = asyncio.get_running_loop().create_task(
            self._abort(running, written_at), name=f"abort-{running.job.id}"
        )
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def _abort(self, running: Running, written_at: float | None) -> None:
        try:
            await self._engine.abort(running.request_id)
        except Exception:
            log.exception("engine abort of %s failed", running.request_id)
            return
        if written_at is not None:
            ABORT_SECONDS.observe(max(time.time() - written_at, 0.0))

    def notice(self, payload: str) -> None:
        notice = JobNotice.parse(payload)
        if notice is None:
            return
        running = self._running.get(notice.job_id)
        if running is None:
            return
        self.stop(running, JobState(notice.state), notice.reason, notice.at)

    async def run(self, stop: asyncio.Event) -> None:
        """Listen and sweep until ``stop``."""
        tasks = [asyncio.create_task(self._sweep_loop(stop), name="control-sweep")]
        if self._database_url is not None:
            listener = Listener(
                self._database_url,
                constants.JOBS_CHANNEL,
                on_notice=self.notice,
                on_connect=self._sweep_now.set,
            )
            tasks.append(asyncio.create_task(listener.run(stop), name="control-listen"))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _sweep_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_first(stop, self._sweep_now, limit_s=self._sweep_s)
            if self._sweep_now.is_set() or self._leased() or self._due():
                self._sweep_now.clear()
                await self.sweep()

    def _leased(self) -> bool:
        return any(r.job.abandon_after_s is not None for r in self._running.values())

    def _due(self) -> bool:
        self._slow = (self._slow + 1) % SLOW_SWEEPS
        return self._slow == 0

    async def sweep(self) -> None:
        running = {job_id: r.job.attempt for job_id, r in self._running.items() if not r.reason}
        documents = sorted(  # of the parts running here, the documents with a lease
            {
                r.job.parent_id
                for r in self._running.values()
                if r.job.parent_id and r.job.abandon_after_s is not None and not r.reason
            }
        )
        try:
            stopped = await self._repo.stopped(running, documents)
        except (SQLAlchemyError, OSError) as exc:
            count_retry("control_sweep", exc)
            log.warning("control sweep failed, retrying: %r", exc)
            return
        for found in stopped:
            r = self._running.get(found.job_id)
            if r is not None:
                self.stop(r, found.state, found.reason, None)
