"""The meter: a batch is accepted whole and its jobs are held in PostgreSQL; the meter
releases them into the dispatch topic (through the outbox) only as fast as the lag allows.

Each round it releases as many held jobs as keep the backlog under ``lag_soft`` and the
batches' own released jobs under ``lag_soft * batch_fill``: the rest of the room under
``lag_soft`` is the single submits', so a single submit is admitted at once beside a
running batch and queues behind at most that many batch jobs. Tenants take turns (each
its earliest deadline first), so one tenant's 50,000 lines do not hold up another's 10.
A held job whose deadline passes ends ``expired`` without being dispatched (looked for
once every ``EXPIRE_EVERY_S``).

A round runs when a batch is created, when a job ends (the jobs channel's NOTIFY), and
every ``interval_s``; rounds are at least ``MIN_GAP_S`` apart. Every API process runs a
meter; an advisory lock lets one of them work at a time, and the backlog is counted in
PostgreSQL in the same transaction, so replicas never release more than the room. A round
that finds no job held is one statement (the backlog's count), and with an ``Activity`` the
next waits up to ``QUIET_S`` unless the process hears something first: the API gives it
what it hears of batch jobs (a notice of one that ended, a reconnect), since only a batch
holds jobs, and a batch made in this process wakes the meter itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from plumbing.activity import Activity
from plumbing.retry import in_rounds
from producers.admission.controller import AdmissionController
from producers.batches.meter_repository import Backlog, MeterRound, MeterStore
from producers.metrics import METERED
from schemas.constants import DEFAULT_MODEL

log = logging.getLogger(__name__)

MIN_GAP_S = 0.05
EXPIRE_EVERY_S = 1.0  # how often a round looks for held jobs past their deadline


def room(backlog: Backlog, *, lag: int, soft: int, fill: int) -> int:
    """How many held jobs to release: the backlog (the larger of PostgreSQL's count and
    the lag reading) stays under ``soft``, the batches' part of it under ``fill``."""
    total = max(backlog.jobs, lag)
    return max(0, min(soft - total, fill - backlog.batch_jobs))


def held_ahead(held: Mapping[str, int], tenant: str, jobs: int) -> int:
    """How many held jobs are released before the last of a new batch of ``jobs`` of
    ``tenant``: all that tenant holds already (taken earliest deadline first: the batches
    before it), and as many of every other tenant's as the batch's own, at most (turns)."""
    return held.get(tenant, 0) + sum(min(n, jobs) for t, n in held.items() if t != tenant)


class Meter:
    def __init__(
        self,
        store: MeterStore,
        admission: AdmissionController,
        *,
        soft: int,
        fill: float,
        interval_s: float,
        counts_backlog: bool = True,
        model: str = DEFAULT_MODEL,
        activity: Activity | None = None,
    ) -> None:
        """Each round reads the lag admission sees (``admission.current_lag()``: none while
        it is unknown, and then nothing is released) and reports into its estimate the jobs
        it released and, with ``counts_backlog`` (the open lag), the backlog it counted:
        then that count is the lag, fresher than the last reading, and the reading only says
        whether the lag is known. Without it (``lag_measure=consumer``) the larger of the
        reading and the count is room's limit."""
        self._store = store
        self._model = model  # its pool's, the label of its metrics
        self._admission = admission
        self._estimate = admission.estimate
        self._counts_backlog = counts_backlog
        self._soft = soft
        self._fill = max(1, int(soft * fill))
        self._interval_s = interval_s
        self._activity = activity
        self._wake = asyncio.Event()
        self._expired_at = -EXPIRE_EVERY_S
        # Whether held jobs may wait for room: the last round filled all the room it had
        # (or had none). Until then a job's end does not wake the meter.
        self._waiting = True

    def wake(self) -> None:
        """A batch was created: a round now."""
        self._wake.set()

    def job_ended(self) -> None:
        """A job ended: a round now, if held jobs may be waiting for the room it left."""
        if self._waiting:
            self._wake.set()

    def _lag(self) -> int | None:
        found = self._admission.current_lag()
        return None if found is None else 0 if self._counts_backlog else found

    async def step(self, now: datetime | None = None) -> MeterRound:
        lag = self._lag()
        expire = time.monotonic() - self._expired_at >= EXPIRE_EVERY_S
        tally = self._estimate.tally()
        done = await self._store.round(
            lambda backlog: (
                0 if lag is None else room(backlog, lag=lag, soft=self._soft, fill=self._fill)
            ),
            now or datetime.now(UTC),
            expire=expire,
        )
        if done.backlog is not None:
            if self._counts_backlog:
                self._estimate.record_count(done.backlog.jobs, tally)
            self._waiting = done.wanted == 0 or done.released == done.wanted
            if expire:
                self._expired_at = time.monotonic()
        if done.released:
            self._estimate.record_release(done.released)
            METERED.labels(outcome="released", model=self._model).inc(done.released)
        if done.expired:
            METERED.labels(outcome="expired", model=self._model).inc(done.expired)
        return done

    async def run(self, stop: asyncio.Event) -> None:
        await in_rounds(
            "meter_round",
            self.step,
            stop,
            self._wake,
            interval_s=self._interval_s,
            min_gap_s=MIN_GAP_S,
            logger=log,
            name="meter",
            quiet=lambda done: not done.held,
            activity=self._activity,
        )
