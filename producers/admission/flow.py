"""Little's law on one panel: λ·W beside the measured number of jobs in flight.

Read every ``FLOW_INTERVAL_S``; with an ``Activity``, once no job is in flight the next read
waits until the process hears something (a job written or ended), or ``QUIET_S``: with none
in flight, only a new job changes the counts (the recent ones' figures age meanwhile, and are
read again at least every ``QUIET_S``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError

from plumbing.activity import QUIET_S, Activity
from plumbing.retry import wait_first
from plumbing.unit_of_work import UnitOfWork
from producers.jobs.repository import Flow, JobRepository
from producers.lag.monitor import LagMonitor
from producers.metrics import IN_FLIGHT, LATENCY_W, LITTLE_L

log = logging.getLogger(__name__)

FLOW_INTERVAL_S = 2.0


async def report_flow(
    repo: JobRepository,
    monitor: LagMonitor,
    stop: asyncio.Event,
    on_flow: Callable[[Flow], None] | None = None,
    pool: tuple[str, bool] | None = None,
    activity: Activity | None = None,
    work: UnitOfWork | None = None,
) -> None:
    """Every FLOW_INTERVAL_S: in-flight jobs and W as metrics, and the reading to
    ``on_flow`` (the admission controller's queue and service estimates); of one pool's
    jobs, with ``pool`` (its dispatch topic, and whether it is the first pool), labelled
    with its monitor's model. ``work``: the reads join the next submits' transaction."""
    model = monitor.model
    while not stop.is_set():
        heard = activity.changed() if activity is not None else None
        flow: Flow | None = None
        try:
            flow = await (repo.flow(*pool, work=work) if pool is not None else repo.flow(work=work))
        except (DBAPIError, OSError) as exc:
            log.warning("flow metrics unavailable: %r", exc)
        else:
            IN_FLIGHT.labels(model=model).set(flow.in_flight)
            if on_flow is not None:
                on_flow(flow)
            if flow.mean_latency_s is not None:
                LATENCY_W.labels(model=model).set(flow.mean_latency_s)
                LITTLE_L.labels(model=model).set(
                    (monitor.snapshot().arrival_rate or 0.0) * flow.mean_latency_s
                )
        await wait_first(stop, limit_s=FLOW_INTERVAL_S)
        quiet = flow is not None and flow.in_flight == 0
        if quiet and heard is not None and activity is not None and activity.listening:
            await wait_first(stop, heard, limit_s=max(QUIET_S - FLOW_INTERVAL_S, 0.0))
