"""The admission controller: every submit is accepted, made to wait, or refused with a
computed Retry-After before anything is written.

Rules, in order: the lag must be known (unknown is treated as saturated); per-tenant RPM and
TPM limits; a job that would expire in the queue is refused at once (deadline-aware); then
the lag thresholds by priority: below the soft threshold accept, between soft and hard wait
(bounded in time and in the number of waiters) for the lag to fall, at or above hard refuse.
High priority is admitted up to the hard threshold without waiting; low priority waits from
half the soft threshold and is refused at it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from producers.admission.ratelimit import TenantLimits
from producers.jobs.repository import Flow
from producers.lag.monitor import LagMonitor, LagSnapshot
from producers.metrics import ADMISSIONS, BLOCKED
from schemas.batches import BatchTooLarge
from schemas.errors import SluicegateError
from schemas.jobs import Priority
from sluicegate.settings import Settings

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
    def of(cls, s: Settings) -> Policy:
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
            measured_after=s.speed_min_samples if s.deadline_speed == "measured" else 0,
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


@dataclass(frozen=True, kw_only=True)
class Admitted:
    blocked_s: float


class AdmissionController:
    def __init__(
        self,
        policy: Policy,
        monitor: LagMonitor,
        limits: TenantLimits,
    ) -> None:
        self._policy = policy
        self._monitor = monitor
        self._limits = limits
        self._blocked = 0
        self._running = 0
        self._token_time_s: float | None = None  # measured; None: not (yet) used
        self._throttled = False
        # Admissions so far, and those whose job is committed. A lag reading includes the
        # jobs committed before it began (its mark) and none admitted after; the rest are
        # counted here, so that a burst inside one interval is seen at once.
        self._admitted = 0
        self._settled = 0
        monitor.marker = lambda: self._settled

    @property
    def blocked(self) -> int:
        return self._blocked

    def settled(self, jobs: int = 1) -> None:
        """The admitted jobs are committed: lag readings from now on include them."""
        self._settled += jobs

    def withdrawn(self, jobs: int = 1) -> None:
        """The admitted request stored no new job (it failed, or was an idempotent replay)."""
        self._admitted -= jobs

    async def admit(
        self,
        *,
        tenant: str,
        priority: Priority,
        prompt_tokens: int,
        max_tokens: int,
        deadline: datetime,
        now: datetime,
    ) -> Admitted:
        try:
            admitted = await self._admit(tenant, priority, prompt_tokens, max_tokens, deadline, now)
        except Refused as refused:
            ADMISSIONS.labels(outcome="rejected", reason=refused.reason).inc()
            raise
        self._admitted += 1
        outcome = "blocked_then_accepted" if admitted.blocked_s > 0 else "accepted"
        ADMISSIONS.labels(outcome=outcome, reason="ok").inc()
        return admitted

    def admit_batch(
        self,
        *,
        tenant: str,
        priority: Priority,
        jobs: int,
        tokens: int,
        max_tokens: int,
        deadline: datetime,
        now: datetime,
    ) -> None:
        """Admit a batch whole or refuse it whole; it never waits. Its jobs must fit under
        the refusal threshold of its priority on top of the lag (so the lag stays bounded
        whatever the batch), its last job must be able to end by the deadline at the
        measured drain rate, and the tenant's limits must take it in one go (one request,
        all its tokens)."""
        try:
            self._admit_batch(tenant, priority, jobs, tokens, max_tokens, deadline, now)
        except Refused as refused:
            ADMISSIONS.labels(outcome="rejected", reason=refused.reason).inc()
            raise
        self._admitted += jobs
        ADMISSIONS.labels(outcome="accepted", reason="ok").inc()

    def _admit_batch(
        self,
        tenant: str,
        priority: Priority,
        jobs: int,
        tokens: int,
        max_tokens: int,
        deadline: datetime,
        now: datetime,
    ) -> None:
        refuse_from = self._policy.thresholds(priority)[1]
        if jobs > refuse_from:
            raise BatchTooLarge(
                f"a {priority.value} batch holds at most {refuse_from} jobs (the lag at which "
                f"its priority is refused), not {jobs}: split it"
            )
        lag = self._known()
        if not self._limits.fits(tokens):
            raise BatchTooLarge(f"the batch's {tokens} tokens are over the tenant's TPM limit")
        self._take(tenant, tokens, lag)
        try:
            self._check_deadline(lag, max_tokens, deadline, now, ahead=jobs - 1)
            if lag.lag + jobs > refuse_from:
                if self.consumes_nothing(lag):
                    raise self._over(lag, "lag_hard", refuse_from - jobs, max_tokens)
                raise Refused(
                    "lag_hard",
                    f"the batch's {jobs} jobs on top of a lag of {lag.lag} would pass "
                    f"{refuse_from}",
                    retry_after_s=self.retry_after_s(lag, lag.lag + jobs - refuse_from, max_tokens),
                    lag=lag.lag,
                )
        except Refused:
            self._limits.give_back(tenant, tokens)
            raise

    async def _admit(
        self,
        tenant: str,
        priority: Priority,
        prompt_tokens: int,
        max_tokens: int,
        deadline: datetime,
        now: datetime,
    ) -> Admitted:
        lag = self._known()
        tokens = prompt_tokens + max_tokens
        self._take(tenant, tokens, lag)
        try:
            self._check_deadline(lag, max_tokens, deadline, now)
            return await self._check_lag(lag, priority, max_tokens)
        except Refused:
            self._limits.give_back(tenant, tokens)
            raise

    def _take(self, tenant: str, tokens: int, lag: LagSnapshot) -> None:
        """Take one request and ``tokens`` from the tenant's limits, or refuse with the
        time until they refill."""
        refused = self._limits.try_take(tenant, tokens, time.monotonic())
        if refused is not None:
            reason, wait_s = refused
            raise Refused(
                reason,
                f"tenant {tenant} is over its {reason.removeprefix('tenant_').upper()} limit",
                retry_after_s=self._clamp(wait_s),
                lag=lag.lag,
            )

    def _known(self) -> LagSnapshot:
        """The last reading plus what this process admitted since it began (a burst inside
        one interval is seen at once, not one interval late)."""
        lag = self._monitor.snapshot()
        if not lag.known:
            raise Refused(
                lag.cause or "lag_unknown",
                "the worker group's lag cannot be read; refusing until it can",
                retry_after_s=self._clamp(2 * self._policy.lag_interval_s),
                lag=None,
            )
        unseen = self._admitted - self._monitor.mark
        return replace(lag, lag=lag.lag + unseen) if unseen > 0 else lag

    def running_jobs(self, count: int) -> None:
        """How many jobs workers are running now. Their records count in the lag (offsets
        commit when a job ends), but a new job does not wait behind them in the queue."""
        self._running = count

    def observe(self, flow: Flow) -> None:
        """The flow read every few seconds: the running jobs, and the seconds per output
        token recent jobs took (used once ``measured_after`` of them were timed)."""
        self.running_jobs(flow.running)
        after = self._policy.measured_after
        enough = after > 0 and flow.timed_jobs >= after and flow.token_time_s is not None
        self._token_time_s = flow.token_time_s if enough else None

    @property
    def token_time_s(self) -> float:
        """Seconds per output token that the deadline check predicts a job's service with."""
        measured = self._token_time_s
        return self._policy.token_time_s if measured is None else measured

    def _check_deadline(
        self,
        lag: LagSnapshot,
        max_tokens: int,
        deadline: datetime,
        now: datetime,
        *,
        ahead: int = 0,
    ) -> None:
        """``ahead``: jobs of the same request queued before the last one (a batch)."""
        if not self._policy.deadline_aware:
            return
        if self._policy.measured_after > 0 and self._token_time_s is None:
            return  # the speed is not measured yet: nothing is refused on this ground
        wait_s = lag.drain_time_s(max(0, lag.lag - self._running) + ahead)
        if wait_s is None:
            return  # no drain measured yet: no prediction to refuse on
        service_s = max_tokens * self.token_time_s
        left_s = (deadline - now).total_seconds()
        if wait_s + service_s > left_s:
            raise Refused(
                "deadline_unreachable",
                f"predicted queue wait {wait_s:.1f}s + service {service_s:.1f}s exceeds the "
                f"{left_s:.1f}s left to the deadline",
                retry_after_s=self._clamp(wait_s),
                lag=lag.lag,
            )

    async def _check_lag(self, lag: LagSnapshot, priority: Priority, max_tokens: int) -> Admitted:
        p = self._policy
        block_from, refuse_from = self.thresholds_now(priority)
        if lag.lag < block_from:
            if priority is not Priority.HIGH:
                self._throttled = False
            return Admitted(blocked_s=0.0)
        if priority is not Priority.HIGH:
            self._throttled = True  # leave only once lag is below the hysteresis band
        if lag.lag >= refuse_from:
            raise self._over(lag, "lag_hard", block_from, max_tokens)
        if p.mode == "reject":
            raise self._over(lag, "lag_soft", block_from, max_tokens)
        if self._blocked >= p.max_blocked:
            raise self._over(lag, "too_many_blocked", block_from, max_tokens)
        return await self._block(priority, max_tokens)

    def thresholds_now(self, priority: Priority) -> tuple[int, int]:
        """Thresholds with hysteresis: while throttled, resume only well below soft."""
        block_from, refuse_from = self._policy.thresholds(priority)
        if self._throttled and priority is not Priority.HIGH:
            block_from = math.floor(block_from * (1 - self._policy.hysteresis))
        return block_from, refuse_from

    async def _block(self, priority: Priority, max_tokens: int) -> Admitted:
        self._blocked += 1
        BLOCKED.set(self._blocked)
        started = time.monotonic()
        deadline = started + self._policy.max_block_s
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    lag = self._known()
                    target = self.thresholds_now(priority)[0]
                    raise self._over(lag, "block_timeout", target, max_tokens)
                await self._monitor.next_update(limit_s=left)
                lag = self._known()
                block_from, refuse_from = self.thresholds_now(priority)
                if lag.lag >= refuse_from:
                    raise self._over(lag, "lag_hard", block_from, max_tokens)
                if lag.lag < block_from:
                    self._throttled = False
                    return Admitted(blocked_s=time.monotonic() - started)
        finally:
            self._blocked -= 1
            BLOCKED.set(self._blocked)

    def _over(self, lag: LagSnapshot, reason: str, target: int, max_tokens: int) -> Refused:
        if self.consumes_nothing(lag):
            return Refused(
                reason,
                f"the worker group is {lag.lag:,} jobs behind, and none has left the queue for "
                f"{lag.stalled_s:.0f} s with no job running: is any worker running? (start one "
                "with `sluicegate worker`, or `sluicegate up --workers N`)",
                retry_after_s=self._policy.retry_max_s,
                lag=lag.lag,
            )
        return Refused(
            reason,
            f"the worker group is {lag.lag:,} jobs behind",
            retry_after_s=self.retry_after_s(lag, max(lag.lag - target, 1), max_tokens),
            lag=lag.lag,
        )

    def consumes_nothing(self, lag: LagSnapshot) -> bool:
        """A backlog nothing has left for ``stall_s`` while no job runs: no worker consumes."""
        return lag.lag > 0 and self._running == 0 and lag.stalled_s >= self._policy.stall_s

    def retry_after_s(self, lag: LagSnapshot, excess: int, max_tokens: int) -> float:
        """Seconds until ``excess`` jobs have drained: at the measured drain rate μ; before
        μ is measured, at the rate the running jobs would end if each took ``max_tokens`` at
        the static speed (a prior); with nothing running and nothing measured, the most."""
        drain = lag.drain_time_s(excess)
        if drain is None and self._running > 0:
            per_job_s = max_tokens * self._policy.token_time_s
            drain = excess * per_job_s / self._running
        return self._clamp(self._policy.retry_max_s if drain is None else drain)

    def _clamp(self, seconds: float) -> float:
        return min(max(seconds, self._policy.retry_min_s), self._policy.retry_max_s)
