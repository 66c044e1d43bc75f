"""The jobs-by-state gauge: every tenant's jobs not ended, by state and model, read by one
GROUP BY (``OverviewStore.unended``) at the lag monitor's cadence but at most every
``MIN_INTERVAL_S`` (a scrape is every 15 s or so), never per scrape. With an ``Activity``, a
read that found the same counts as the one before, with nothing heard in between, is followed
by a wait until something is heard (a job written or ended), or ``QUIET_S``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from prometheus_client import Gauge
from sqlalchemy.exc import DBAPIError

from plumbing.activity import QUIET_S, Activity
from plumbing.retry import wait_first
from plumbing.unit_of_work import UnitOfWork
from producers.metrics import JOBS_BY_STATE
from producers.overview.repository import UNENDED, OverviewStore

log = logging.getLogger(__name__)
MIN_INTERVAL_S = 5.0  # held batch jobs count as queued: the count may cover many rows


class JobsByState:
    """Sets the gauge from one reading. Every model seen so far keeps a series for each
    state not ended, so a pair whose jobs are gone reads 0, never its last count."""

    def __init__(self, gauge: Gauge = JOBS_BY_STATE) -> None:
        self._gauge = gauge
        self._models: set[str] = set()

    def apply(self, counts: Iterable[tuple[str, str, int]]) -> None:
        """``counts``: (model, state, count) of the jobs not ended."""
        now = {(model, state): count for model, state, count in counts}
        self._models |= {model for model, _ in now}
        for model in self._models:
            for state in UNENDED:
                self._gauge.labels(state=state, model=model).set(now.get((model, state), 0))


async def report_jobs_by_state(
    store: OverviewStore,
    stop: asyncio.Event,
    *,
    interval_s: float,
    activity: Activity | None = None,
    work: UnitOfWork | None = None,
) -> None:
    """Every ``interval_s`` until ``stop``: read the counts and set the gauge. A failed read
    is logged (once an outage), and the gauge keeps its last reading. ``work``: the reads
    join the next submits' transaction."""
    gauge = JobsByState()
    interval_s = max(interval_s, MIN_INTERVAL_S)
    failing = False
    last: tuple[int, list[tuple[str, str, int]]] | None = None  # (version, counts)
    while not stop.is_set():
        heard = activity.changed() if activity is not None else None
        version = activity.version if activity is not None else 0
        quiet = False
        try:
            counts = await store.unended(work)
        except (DBAPIError, OSError) as exc:
            if not failing:  # once, not at every interval of an outage
                log.warning("jobs-by-state gauge: cannot read the jobs: %r", exc)
            failing = True
            last = None
        else:
            gauge.apply(counts)
            failing = False
            quiet = _quiet(last, counts, activity)
            last = (version, counts)
        await wait_first(stop, limit_s=interval_s)
        if quiet and heard is not None:
            await wait_first(stop, heard, limit_s=max(QUIET_S - interval_s, 0.0))


def _quiet(
    last: tuple[int, list[tuple[str, str, int]]] | None,
    counts: list[tuple[str, str, int]],
    activity: Activity | None,
) -> bool:
    """The counts are those of the last read, and nothing was heard since it began."""
    if activity is None or last is None:
        return False
    return last[1] == counts and activity.quiet_since(last[0])
