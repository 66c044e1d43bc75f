"""The admission policy, pure: the thresholds of each priority (with hysteresis while
throttled), the deadline check, the test for a group that consumes nothing, the Retry-After
arithmetic, and the refusals they give (``REFUSALS``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from plumbing.settings.admission import AdmissionSettings
from producers.lag.rule import LagSnapshot
from schemas.errors import SluicegateError
from schemas.jobs import GraphShape, Priority

UNAVAILABLE = frozenset({"lag_unknown", "database_unavailable", "broker_unavailable"})
# Why a submit is refused: the yield's ``reason`` and its error code (429; 503 for the
# UNAVAILABLE ones). docs/api.md lists them (tools/apidoc.py).
REFUSALS = {
    "lag_soft": "`admission_mode=reject` and the lag is at the blocking threshold of the "
    "request's priority (`lag_soft`; `lag_soft * low_priority_factor` for `low`).",
    "lag_hard": "The lag is at the refusal threshold of the request's priority (`lag_hard`; "
    "`lag_soft` for `low`), or a batch's jobs on top of the lag would pass it.",
    "too_many_blocked": "`max_blocked` requests already wait for the lag to fall.",
    "block_timeout": "The lag did not fall below the blocking threshold within `max_block_ms`.",
    "deadline_unreachable": "The predicted queue wait plus service time passes the deadline.",
    "tenant_rpm": "The tenant is over its requests-per-minute limit (`tenant_rpm`).",
    "tenant_tpm": "The tenant is over its tokens-per-minute limit (`tenant_tpm`).",
    "lag_unknown": "The lag has not been read for `lag_stale_after_s`: unknown counts as full.",
    "database_unavailable": "The lag cannot be read: the database is unavailable.",
    "broker_unavailable": "The lag cannot be read: the broker is unavailable.",
}


class Refused(SluicegateError):
    """A typed refusal: 429 (or 503 while the lag is unknown) with a retry hint."""

    status = 429
    retriable = True

    def __init__(self, reason: str, message: str, *, retry_after_s: float, lag: int | None) -> None:
        super().__init__(message)
        self.code = reason
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.lag = lag
        if reason in UNAVAILABLE:
            self.status = 503


@dataclass(frozen=True, kw_only=True)
class Policy:
    """The admission settings, and the rules that read only them and what is passed in."""

    soft: int
    hard: int
    mode: Literal["block", "reject"]
    max_block_s: float
    max_blocked: int
    hysteresis: float
    low_factor: float
    deadline_aware: bool
    token_time_s: float
    # Use the measured seconds per output token once this many recent jobs were timed;
    # 0: always token_time_s.
    measured_after: int = 0
    retry_min_s: float
    retry_max_s: float
    lag_interval_s: float
    # A backlog nothing left for this long, with no job running, is said to have no worker.
    stall_s: float = 10.0

    @classmethod
    def of(cls, s: AdmissionSettings, *, speed_min_samples: int) -> Policy:
        """From the admission group; ``speed_min_samples`` (the workers' group) is how many
        timed jobs make the measured speed count."""
        return cls(
            soft=s.lag_soft,
            hard=s.lag_hard,
            mode=s.admission_mode,
            max_block_s=s.max_block_ms / 1000,
            max_blocked=s.max_blocked,
            hysteresis=s.admission_hysteresis,
            low_factor=s.low_priority_factor,
            deadline_aware=s.deadline_aware,
            token_time_s=s.expected_token_time_s,
            measured_after=speed_min_samples if s.deadline_speed == "measured" else 0,
            retry_min_s=s.retry_after_min_s,
            retry_max_s=s.retry_after_max_s,
            lag_interval_s=s.lag_interval_s,
            stall_s=s.no_worker_after_s,
        )

    def thresholds(self, priority: Priority) -> tuple[int, int]:
        """(block from, refuse from) for a priority."""
        if priority is Priority.HIGH:
            return self.hard, self.hard
        if priority is Priority.LOW:
            return math.floor(self.soft * self.low_factor), self.soft
        return self.soft, self.hard

    def thresholds_now(self, priority: Priority, *, throttled: bool) -> tuple[int, int]:
        """Thresholds with hysteresis: while throttled, resume only well below soft."""
        block_from, refuse_from = self.thresholds(priority)
        if throttled and priority is not Priority.HIGH:
            block_from = math.floor(block_from * (1 - self.hysteresis))
        return block_from, refuse_from

    def clamp(self, seconds: float) -> float:
        """``seconds`` within [retry_min_s, retry_max_s]."""
        return min(max(seconds, self.retry_min_s), self.retry_max_s)

    def consumes_nothing(self, lag: LagSnapshot, *, running: int) -> bool:
        """A backlog nothing has left for ``stall_s`` while no job runs: no worker consumes."""
        return lag.lag > 0 and running == 0 and lag.stalled_s >= self.stall_s

    def retry_after_s(
        self, lag: LagSnapshot, excess: int, max_tokens: int, *, running: int
    ) -> float:
        """Seconds until ``excess`` jobs have drained: at the measured drain rate μ; before
        μ is measured, at the rate the ``running`` jobs would end if each took
        ``max_tokens`` at the static speed (a prior); with nothing running and nothing
        measured, the most."""
        drain = lag.drain_time_s(excess)
        if drain is None and running > 0:
            per_job_s = max_tokens * self.token_time_s
            drain = excess * per_job_s / running
        return self.clamp(self.retry_max_s if drain is None else drain)

    def over(
        self, lag: LagSnapshot, reason: str, target: int, max_tokens: int, *, running: int
    ) -> Refused:
        """The refusal for a lag over its threshold, with the time until it is back at
        ``target``; a group that consumes nothing is told so, and to retry at the most."""
        if self.consumes_nothing(lag, running=running):
            return Refused(
                reason,
                f"the worker group is {lag.lag:,} jobs behind, and none has left the queue for "
                f"{lag.stalled_s:.0f} s with no job running: is any worker running? (start one "
                "with `sluicegate worker`, or `sluicegate up --workers N`)",
                retry_after_s=self.retry_max_s,
                lag=lag.lag,
            )
        return Refused(
            reason,
            f"the worker group is {lag.lag:,} jobs behind",
            retry_after_s=self.retry_after_s(
                lag, max(lag.lag - target, 1), max_tokens, running=running
            ),
            lag=lag.lag,
        )

    def unknown(self, lag: LagSnapshot) -> Refused:
        """The refusal while the lag is not known (a reading too old, or none)."""
        return Refused(
            lag.cause or "lag_unknown",
            "the worker group's lag cannot be read; refusing until it can",
            retry_after_s=self.clamp(2 * self.lag_interval_s),
            lag=None,
        )

    def deadline_refusal(
        self,
        lag: LagSnapshot,
        *,
        running: int,
        measured_token_time_s: float | None,
        max_tokens: int,
        deadline: datetime,
        now: datetime,
        graph: GraphShape | None = None,
    ) -> Refused | None:
        """The refusal of a job that would not end by ``deadline``: the predicted queue wait
        (the lag less the ``running`` jobs, at μ) and its service time. None when it can,
        or when there is nothing to predict with (no drain rate, or a speed to be measured
        and not measured yet). A ``graph`` waits behind its own chunks too, and its levels
        run one after another."""
        queued = max(0, lag.lag - running) + (graph.chunks - 1 if graph is not None else 0)
        levels = graph.levels if graph is not None else 1
        late = self._late(lag, queued, max_tokens * levels, measured_token_time_s, deadline - now)
        if late is None:
            return None
        wait_s, service_s, left_s = late
        what = (
            f"a document of {graph.chunks} chunks in {graph.levels} levels: "
            if graph is not None
            else ""
        )
        return Refused(
            "deadline_unreachable",
            f"{what}predicted queue wait {wait_s:.1f}s + service {service_s:.1f}s exceeds the "
            f"{left_s:.1f}s left to the deadline",
            retry_after_s=self.clamp(wait_s),
            lag=lag.lag,
        )

    def batch_refusal(
        self,
        lag: LagSnapshot,
        *,
        running: int,
        measured_token_time_s: float | None,
        jobs: int,
        ahead: int,
        max_tokens: int,
        deadline: datetime,
        now: datetime,
    ) -> Refused | None:
        """The refusal of a batch that can never end within its window at the measured
        speed: its last job waits for the lag (less the running jobs), the ``ahead`` held
        jobs that are released before it, and the batch's other jobs; None when it fits
        or when there is nothing to predict with."""
        queued = max(0, lag.lag - running) + ahead + jobs - 1
        late = self._late(lag, queued, max_tokens, measured_token_time_s, deadline - now)
        if late is None:
            return None
        wait_s, service_s, left_s = late
        return Refused(
            "deadline_unreachable",
            f"the batch's {jobs:,} jobs cannot end within its window: behind a lag of "
            f"{lag.lag:,} and {ahead:,} batch jobs held before them, its last job would reach "
            f"a worker in about {wait_s:,.1f} s at the measured {lag.drain_rate or 0:,.1f} "
            f"jobs/s and decode in {service_s:,.1f} s, but the window ends in {left_s:,.1f} s",
            retry_after_s=self.clamp(wait_s + service_s - left_s),
            lag=lag.lag,
        )

    def _late(
        self,
        lag: LagSnapshot,
        queued: int,
        max_tokens: int,
        measured_token_time_s: float | None,
        left: timedelta,
    ) -> tuple[float, float, float] | None:
        """(queue wait, service, time left) in seconds for a job behind ``queued`` jobs
        that would not end in the time ``left``; None when it would, when deadline-aware
        admission is off, or when there is nothing to predict with."""
        if not self.deadline_aware:
            return None
        if self.measured_after > 0 and measured_token_time_s is None:
            return None  # the speed is not measured yet: nothing is refused on this ground
        wait_s = lag.drain_time_s(queued)
        if wait_s is None:
            return None  # no drain measured yet: no prediction to refuse on
        token_time_s = self.token_time_s if measured_token_time_s is None else measured_token_time_s
        service_s = max_tokens * token_time_s
        left_s = left.total_seconds()
        return None if wait_s + service_s <= left_s else (wait_s, service_s, left_s)
