"""The admission controller: every submit is accepted, made to wait, or refused with a
computed Retry-After before anything is written.

Rules, in order: the lag must be known (unknown is treated as saturated); per-tenant RPM and
TPM limits; a job that would expire in the queue is refused at once (deadline-aware); then
the lag thresholds by priority: below the soft threshold accept, between soft and hard wait
(bounded in time and in the number of waiters) for the lag to fall, at or above hard refuse.
High priority is admitted up to the hard threshold without waiting; low priority waits from
half the soft threshold and is refused at it.

The rules themselves are pure (``producers.admission.policy``); the controller keeps what
they need between submits (the waiters, the running jobs, whether it throttles, what it
admitted since the last lag reading) and makes a submit wait for the lag to fall.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from producers.admission.policy import Policy, Refused
from producers.admission.ratelimit import TenantLimits
from producers.jobs.repository import Flow
from producers.lag.estimate import LagEstimate
from producers.lag.monitor import LagMonitor
from producers.lag.rule import LagSnapshot
from producers.metrics import ADMISSIONS, BLOCKED
from schemas.constants import DEFAULT_MODEL
from schemas.jobs import GraphShape, Priority


@dataclass(frozen=True, kw_only=True)
class Admitted:
    blocked_s: float


AdmissionState = Literal["open", "throttling", "refusing", "unknown"]
# The max_tokens a status's Retry-After hint is computed for (the submit's default).
HINT_MAX_TOKENS = 256


@dataclass(frozen=True, kw_only=True)
class AdmissionStatus:
    """Admission as a normal-priority submit meets it now: ``open`` (accepted at once),
    ``throttling`` (the lag is at the blocking threshold: it waits, or with
    ``admission_mode=reject`` is refused), ``refusing`` (at the refusal threshold: 429) or
    ``unknown`` (the lag cannot be read: 503). ``retry_after_s``: the hint a refused
    submit of ``HINT_MAX_TOKENS`` would get; None while open."""

    state: AdmissionState
    lag: int | None
    lag_soft: int
    lag_hard: int
    reading_age_s: float | None
    retry_after_s: float | None


class AdmissionController:
    def __init__(
        self,
        policy: Policy,
        monitor: LagMonitor,
        limits: TenantLimits,
        estimate: LagEstimate,
        *,
        model: str = DEFAULT_MODEL,
    ) -> None:
        """One pool's admission (``model``: its model, the label of its metrics): its lag
        and drain rate (``monitor``); ``limits`` are the tenants', shared by every pool."""
        self.model = model
        self._policy = policy
        self._monitor = monitor
        self._limits = limits
        self._blocked = 0
        self._running = 0
        self._token_time_s: float | None = None  # measured; None: not (yet) used
        self._throttled = False
        # What was admitted since the last reading began; the monitor and the meter report
        # into it, and the lag admission sees is the reading plus it (``_known``).
        self.estimate = estimate

    @property
    def blocked(self) -> int:
        return self._blocked

    def record_commit(self, jobs: int = 1) -> None:
        """The admitted jobs are committed: lag readings from now on include them."""
        self.estimate.record_commit(jobs)

    def record_withdrawal(self, jobs: int = 1) -> None:
        """The admitted request stored no new job (it failed, or was an idempotent replay)."""
        self.estimate.record_withdrawal(jobs)

    async def admit(
        self,
        *,
        tenant: str,
        priority: Priority,
        prompt_tokens: int,
        max_tokens: int,
        deadline: datetime,
        now: datetime,
        graph: GraphShape | None = None,
    ) -> Admitted:
        """``graph``: a document too long for the pool's engine, judged as the whole graph
        it becomes (all its jobs' tokens; its levels one after another)."""
        try:
            admitted = await self._admit(
                tenant, priority, prompt_tokens, max_tokens, deadline, now, graph
            )
        except Refused as refused:
            ADMISSIONS.labels(outcome="rejected", reason=refused.reason, model=self.model).inc()
            raise
        self.estimate.record_admission()
        outcome = "blocked_then_accepted" if admitted.blocked_s > 0 else "accepted"
        ADMISSIONS.labels(outcome=outcome, reason="ok", model=self.model).inc()
        return admitted

    def admit_batch(
        self,
        *,
        tenant: str,
        jobs: int,
        ahead: int,
        max_tokens: int,
        deadline: datetime,
        now: datetime,
    ) -> None:
        """Admit a batch whole or refuse it whole; it never waits. Its jobs are held and
        metered into the queue (``producers.batches.meter``), so the lag does not bound its
        size: it is refused only when its last job could not end by the deadline at the
        measured speed, behind the lag and the ``ahead`` held jobs released before it, or
        when the tenant is over its request rate (a batch is one request)."""
        try:
            lag = self._known()
            self._take(tenant, 0, lag)
            refused = self._policy.batch_refusal(
                lag,
                running=self._running,
                measured_token_time_s=self._token_time_s,
                jobs=jobs,
                ahead=ahead,
                max_tokens=max_tokens,
                deadline=deadline,
                now=now,
            )
            if refused is not None:
                self._limits.give_back(tenant, 0)
                raise refused
        except Refused as refused:
            ADMISSIONS.labels(outcome="rejected", reason=refused.reason, model=self.model).inc()
            raise
        ADMISSIONS.labels(outcome="accepted", reason="ok", model=self.model).inc()

    def status(self) -> AdmissionStatus:
        """What a normal-priority submit meets now (for the overview; decides nothing)."""
        p = self._policy
        reading = self._monitor.snapshot()
        age = reading.age_s if math.isfinite(reading.age_s) else None
        try:
            lag = self._known()
        except Refused as refused:
            return AdmissionStatus(
                state="unknown",
                lag=None,
                lag_soft=p.soft,
                lag_hard=p.hard,
                reading_age_s=age,
                retry_after_s=refused.retry_after_s,
            )
        block_from, refuse_from = self.thresholds_now(Priority.NORMAL)
        state: AdmissionState = "open"
        hint: float | None = None
        if lag.lag >= block_from:
            state, reason = (
                ("refusing", "lag_hard")
                if lag.lag >= refuse_from
                else (
                    "throttling",
                    "lag_soft",
                )
            )
            hint = self._over(lag, reason, block_from, HINT_MAX_TOKENS).retry_after_s
        return AdmissionStatus(
            state=state,
            lag=lag.lag,
            lag_soft=p.soft,
            lag_hard=p.hard,
            reading_age_s=age,
            retry_after_s=hint,
        )

    def current_lag(self) -> int | None:
        """The lag as admission sees it now; None while it is unknown."""
        try:
            return self._known().lag
        except Refused:
            return None

    async def _admit(
        self,
        tenant: str,
        priority: Priority,
        prompt_tokens: int,
        max_tokens: int,
        deadline: datetime,
        now: datetime,
        graph: GraphShape | None = None,
    ) -> Admitted:
        lag = self._known()
        jobs = graph.jobs if graph is not None else 1
        tokens = prompt_tokens + max_tokens * jobs
        self._take(tenant, tokens, lag)
        try:
            self._check_deadline(lag, max_tokens, deadline, now, graph)
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
                retry_after_s=self._policy.clamp(wait_s),
                lag=lag.lag,
            )

    def _known(self) -> LagSnapshot:
        """The last reading plus what this process admitted since it began (a burst inside
        one interval is seen at once, not one interval late)."""
        lag = self._monitor.snapshot()
        if not lag.known:
            raise self._policy.unknown(lag)
        estimate = self.estimate.lag(lag.lag, lag.age_s)
        return replace(lag, lag=estimate) if estimate != lag.lag else lag

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
        graph: GraphShape | None = None,
    ) -> None:
        refused = self._policy.deadline_refusal(
            lag,
            running=self._running,
            measured_token_time_s=self._token_time_s,
            max_tokens=max_tokens,
            deadline=deadline,
            now=now,
            graph=graph,
        )
        if refused is not None:
            raise refused

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
        return self._policy.thresholds_now(priority, throttled=self._throttled)

    async def _block(self, priority: Priority, max_tokens: int) -> Admitted:
        self._blocked += 1
        BLOCKED.labels(model=self.model).set(self._blocked)
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
            BLOCKED.labels(model=self.model).set(self._blocked)

    def _over(self, lag: LagSnapshot, reason: str, target: int, max_tokens: int) -> Refused:
        return self._policy.over(lag, reason, target, max_tokens, running=self._running)
