"""The delivery loop: claim the deliveries that are due, send them concurrently, record
each attempt and schedule the next.

Nothing here sleeps on a delivery: a retry is a row whose ``next_attempt_at`` lies ahead,
so a delivery waiting hours for its next attempt holds neither a task nor an endpoint's
slot. The loop waits for the first of: a NOTIFY that a delivery was made, an attempt
finishing (a slot freed), the next due row's time, or the stop event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from datetime import UTC, datetime

from prometheus_client import Counter as MetricCounter

from plumbing.aio import wait_first
from plumbing.metrics import registry
from plumbing.retry import Stopped, outage, retrying
from plumbing.retry import count as count_retry
from schemas.constants import M_DEAD_LETTERED
from schemas.webhooks import DEAD_LETTER_SOURCE, M_WEBHOOK_ATTEMPTS, M_WEBHOOK_FINISHED
from workers.webhooks.attempt_repository import AttemptRepository, Claimed, Endpoint
from workers.webhooks.http import WebhookClient
from workers.webhooks.retry import Answer, Outcome, RetrySchedule, Uniform, judge
from workers.webhooks.signing import signed_headers

log = logging.getLogger(__name__)

WEBHOOKS = registry("webhooks")
ATTEMPTS = MetricCounter(
    M_WEBHOOK_ATTEMPTS, "Webhook attempts by outcome", ["outcome"], registry=WEBHOOKS
)
FINISHED = MetricCounter(
    M_WEBHOOK_FINISHED, "Webhook deliveries finished", ["state"], registry=WEBHOOKS
)
DEAD_LETTERED = MetricCounter(
    M_DEAD_LETTERED,
    "Records set aside as dead letters, by source and reason",
    ["source", "reason"],
    registry=WEBHOOKS,
)


def _disabled(deliveries: int) -> None:
    """Count deliveries dead-lettered because their endpoint was disabled (a 410)."""
    FINISHED.labels(state="dead").inc(deliveries)
    DEAD_LETTERED.labels(source=DEAD_LETTER_SOURCE, reason="endpoint_disabled").inc(deliveries)


# A lease outlasts an attempt's time limit by this much before the row comes due again.
LEASE_MARGIN_S = 30.0
# Shortest wait when a row is due but could not be claimed (another dispatcher holds it).
MIN_WAIT_S = 0.05
NO_SECRET = "no signing secret: create one with POST /v1/webhooks/secrets"


class Dispatcher:
    def __init__(
        self,
        repo: AttemptRepository,
        client: WebhookClient,
        *,
        schedule: RetrySchedule,
        uniform: Uniform,
        timeout_s: float,
        max_in_flight: int,
        per_endpoint: int,
    ) -> None:
        self._repo = repo
        self._client = client
        self._schedule = schedule
        self._uniform = uniform
        self._timeout_s = timeout_s
        self._max_in_flight = max_in_flight
        self._per_endpoint = per_endpoint
        self._wake = asyncio.Event()
        self._busy: Counter[Endpoint] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()

    def wake(self) -> None:
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                self._wake.clear()
                try:
                    wait = await retrying("webhook_claim", self._round, stop=stop, transient=outage)
                except Stopped:
                    break
                if wait is None or wait > 0:
                    await wait_first(stop, self._wake, limit_s=wait)
        finally:
            await self._drain()

    async def _round(self) -> float | None:
        """Claim and start what is due; how long to wait before looking again (0: at once,
        None: until woken)."""
        free = self._max_in_flight - len(self._tasks)
        if free <= 0:
            return None  # an attempt that ends wakes the loop
        claim = await self._repo.claim(
            limit=free,
            per_endpoint=self._per_endpoint,
            busy=self._busy,
            lease_s=self._timeout_s + LEASE_MARGIN_S,
        )
        for claimed in claim.claimed:
            self._start(claimed)
        if claim.dead:
            _disabled(claim.dead)
        if claim.claimed or claim.dead:
            return 0.0
        full = [e for e, n in self._busy.items() if n >= self._per_endpoint]
        until = await self._repo.seconds_until_due(full)
        return None if until is None else max(until, MIN_WAIT_S)

    def _start(self, claimed: Claimed) -> None:
        self._busy[claimed.endpoint] += 1
        task = asyncio.create_task(self._attempt(claimed), name=f"webhook-{claimed.id}")
        self._tasks.add(task)
        endpoint = claimed.endpoint

        def done(task: asyncio.Task[None]) -> None:
            self._done(task, endpoint)

        task.add_done_callback(done)

    def _done(self, task: asyncio.Task[None], endpoint: Endpoint) -> None:
        self._tasks.discard(task)
        self._busy[endpoint] -= 1
        if self._busy[endpoint] <= 0:
            del self._busy[endpoint]
        self._wake.set()

    async def _attempt(self, claimed: Claimed) -> None:
        """One attempt. A failure to record it leaves the row leased: it comes due again
        when the lease runs out, with the same webhook-id."""
        try:
            answer = await self._send(claimed)
            verdict = judge(answer, claimed.attempt, self._schedule, self._uniform)
            recorded = await asyncio.shield(self._repo.record(claimed, answer, verdict))
        except Exception as exc:
            # The row stays leased and comes due again when the lease runs out.
            if count_retry("webhook_record", exc) is None:
                log.exception("webhooks: attempt %d of %s failed", claimed.attempt, claimed.id)
            else:
                log.warning(
                    "webhooks: attempt %d of %s not recorded: %r", claimed.attempt, claimed.id, exc
                )
            return
        ATTEMPTS.labels(outcome=verdict.outcome.value).inc()
        if recorded.owned and verdict.outcome is not Outcome.RETRY:
            state = "delivered" if verdict.outcome is Outcome.DELIVERED else "dead"
            FINISHED.labels(state=state).inc()
            if verdict.code is not None:
                DEAD_LETTERED.labels(source=DEAD_LETTER_SOURCE, reason=verdict.code).inc()
        if recorded.disabled:
            _disabled(recorded.disabled)
        log.info(
            "webhook %s attempt %d to %s: %s %s",
            claimed.id,
            claimed.attempt,
            claimed.url,
            answer.status or answer.error,
            verdict.outcome.value,
        )

    async def _send(self, claimed: Claimed) -> Answer:
        secrets = await self._repo.secrets(claimed.tenant)
        if not secrets:
            return Answer(status=None, error=NO_SECRET)
        headers = signed_headers(claimed.id, claimed.body, secrets, datetime.now(UTC))
        return await self._client.post(claimed.url, claimed.body.encode("utf-8"), headers)

    async def _drain(self) -> None:
        """Let the attempts in flight finish (each is bounded by its time limit)."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(list(self._tasks), timeout=self._timeout_s + 1)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
