"""The worker's presence: every ``worker_report_s`` it looks at what it serves and holds
(model, engine, capacity, running jobs, KV usage) and writes it to its row in ``workers``,
which the API's overview reads, when it changed or when the row was last written
``REFRESH_INTERVALS`` intervals ago (a row not written for ``STALE_INTERVALS`` is shown as
stale: an idle worker's row stays fresh at half the writes); at a clean stop it deletes
the row. A failed write is logged and tried again at the next interval: the report is for
people, never on the jobs' path."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from workers.engines.base import InferenceEngine
from workers.gate import PullGate
from workers.presence.repository import PresenceRepository, WorkerReport

log = logging.getLogger(__name__)

REFRESH_INTERVALS = 2  # an unchanged report is written again after this many intervals


def worker_id(static_id: str | None) -> str:
    """The static member id (``worker-N``) where it is set, else host:pid."""
    return static_id or f"{socket.gethostname()}:{os.getpid()}"


class Presence:
    def __init__(
        self,
        repo: PresenceRepository,
        *,
        worker: str,
        model: str,
        engine: InferenceEngine,
        gate: PullGate,
        interval_s: float,
    ) -> None:
        self._repo = repo
        self._id = worker
        self._model = model
        self._engine = engine
        self._gate = gate
        self._interval_s = interval_s

    def report(self) -> WorkerReport:
        """What the worker holds now. Capacity: the jobs it may run at once, its slots on
        an engine of slots (llama.cpp), else the lower of ``worker_max_running`` and the
        engine's cap on running sequences."""
        cap = self._engine.capacity()
        if cap.slot_context is not None:
            capacity = min(self._gate.max_running, cap.total_blocks)
        else:
            capacity = min(self._gate.max_running, cap.max_running or self._gate.max_running)
        return WorkerReport(
            id=self._id,
            model=self._model,
            engine=self._engine.name,
            capacity=capacity,
            running=self._gate.ledger.running,
            kv_usage=cap.usage if cap.total_blocks > 0 else None,
            context_tokens=self._engine.context_tokens(),
        )

    async def _write(self, report: WorkerReport) -> bool:
        try:
            await self._repo.report(report)
        except (OSError, DBAPIError, SQLAlchemyError) as exc:
            log.warning("worker %s: cannot write its presence: %s", self._id, exc)
            return False
        return True

    async def run(self, stop: asyncio.Event) -> None:
        last: WorkerReport | None = None
        unchanged = 0  # intervals since the row was last written
        try:
            while not stop.is_set():
                report = self.report()
                unchanged += 1
                if report != last or unchanged >= REFRESH_INTERVALS:
                    # A failed write is tried again at the next interval.
                    last = report if await self._write(report) else None
                    unchanged = 0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._interval_s)
        finally:
            with contextlib.suppress(OSError, DBAPIError, SQLAlchemyError):
                await asyncio.shield(self._repo.leave(self._id))
