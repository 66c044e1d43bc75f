"""The delivery loop: claim the deliveries that are due, send them concurrently, record
each attempt and schedule the next.

Nothing here sleeps on a delivery: a retry is a row whose ``next_attempt_at`` lies ahead,
so a delivery waiting hours for its next attempt holds neither a task nor an endpoint's
slot. A claim is one statement, which also says when the next delivery comes due; the loop
then sleeps, without a statement, until the first of: that time, a delivery made here or
announced by NOTIFY (another dispatcher's, a redelivery), a retry recorded here coming due,
a slot freed that the last claim found taken (an attempt ended to an endpoint it counted
full, or while it ran), or the stop event; and never longer than ``claim_every_s``, so a
delivery whose wake was missed is claimed all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Protocol

from prometheus_client import Counter as MetricCounter
from prometheus_client import Gauge

from plumbing.metrics import registry
from plumbing.retry import Stopped, outage, retrying, wait_first
from plumbing.retry import count as count_retry
from schemas.constants import M_DEAD_LETTERED
from schemas.webhooks import (
    DEAD_LETTER_SOURCE,
    M_WEBHOOK_ATTEMPTS,
    M_WEBHOOK_FINISHED,
    M_WEBHOOK_OLDEST_DUE,
)
from workers.webhooks.attempt_repository import Attempted, Recorded
from workers.webhooks.claim_repository import Claim, ClaimedDelivery, Endpoint
from workers.webhooks.recorder import Recorder
from workers.webhooks.retry import AttemptResult, Outcome, RetrySchedule, Uniform, Verdict, judge
from workers.webhooks.signing import signed_headers

log = logging.getLogger(__name__)

WEBHOOKS = registry("webhooks")
ATTEMPTS = MetricCounter(
    M_WEBHOOK_ATTEMPTS, "Webhook attempts by outcome", ["outcome"], registry=WEBHOOKS
)
FINISHED = MetricCounter(
    M_WEBHOOK_FINISHED, "Webhook deliveries finished", ["state"], registry=WEBHOOKS
)
OLDEST_DUE = Gauge(
    M_WEBHOOK_OLDEST_DUE,
    "Seconds the oldest due delivery left unclaimed has been due, as of the last claim",
    registry=WEBHOOKS,
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


class Claims(Protocol):
    """Takes due deliveries (``ClaimRepository``)."""

    async def claim(
        self, *, limit: int, per_endpoint: int, busy: Mapping[Endpoint, int], lease_s: float
    ) -> Claim: ...


class Attempts(Protocol):
    """Records what attempts did (``AttemptRepository``)."""

    async def record(self, done: Sequence[Attempted]) -> set[str]: ...

    async def give_up(
        self, claimed: ClaimedDelivery, answer: AttemptResult, verdict: Verdict
    ) -> Recorded: ...

    async def give_up_disabled(self, delivery_ids: Sequence[str]) -> int: ...


class Poster(Protocol):
    """Sends one attempt (``WebhookClient``)."""

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> AttemptResult: ...


class Dispatcher:
    def __init__(
        self,
        claims: Claims,
        attempts: Attempts,
        client: Poster,
        *,
        schedule: RetrySchedule,
        uniform: Uniform,
        timeout_s: float,
        max_in_flight: int,
        per_endpoint: int,
        claim_every_s: float,
        tag: str = "",
    ) -> None:
        self._claims = claims
        self._attempts = attempts
        self._recorder = Recorder(attempts.record)
        self._client = client
        self._schedule = schedule
        self._uniform = uniform
        self._timeout_s = timeout_s
        self._lease_s = timeout_s + LEASE_MARGIN_S
        self._max_in_flight = max_in_flight
        self._per_endpoint = per_endpoint
        self._tag = tag  # the NOTIFY payload of this dispatcher's own new deliveries
        self._claim_every_s = claim_every_s
        self._wake = asyncio.Event()
        # Loop time of the next claim (0: at once), at most claim_every_s ahead.
        self._next_claim = 0.0
        self._claiming = False  # a claim is running: what it saw of the slots may be stale
        self._held = False  # the last claim stopped for want of a free slot here
        self._full: frozenset[Endpoint] = frozenset()  # endpoints the last claim found full
        self._busy: Counter[Endpoint] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._due_since: float | None = None  # monotonic time the oldest due row came due
        OLDEST_DUE.set_function(self.oldest_due_s)

    def wake(self) -> None:
        """Claim at once: something may have come due."""
        self._next_claim = 0.0
        self._wake.set()

    def notified(self, payload: str) -> None:
        """A NOTIFY on the webhooks channel: a delivery made or revived elsewhere (this
        dispatcher's own, tagged, were seen to when they were made)."""
        if payload != self._tag:
            self.wake()

    def due_in(self, seconds: float) -> None:
        """A delivery comes due in ``seconds``: claim then (at once when it is due)."""
        if seconds <= 0:
            self.wake()
            return
        at = asyncio.get_running_loop().time() + seconds
        if at < self._next_claim:
            self._next_claim = at
            self._wake.set()

    def oldest_due_s(self) -> float:
        """How long the oldest delivery that was due and unclaimed at the last claim has
        been due (0: none was)."""
        since = self._due_since
        return 0.0 if since is None else max(0.0, time.monotonic() - since)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not stop.is_set():
                self._wake.clear()
                if loop.time() >= self._next_claim:
                    # The latest the next claim comes: due_in() and wake() bring it nearer.
                    self._next_claim = loop.time() + self._claim_every_s
                    try:
                        wait = await retrying(
                            "webhook_claim", self._round, stop=stop, transient=outage
                        )
                    except Stopped:
                        break
                    if wait is not None:
                        self.due_in(wait)
                    continue
                await wait_first(stop, self._wake, limit_s=self._next_claim - loop.time())
        finally:
            await self._drain()

    async def _round(self) -> float | None:
        """Claim and start what is due; how long until the next claim (0: at once, None:
        until woken, or ``claim_every_s``)."""
        free = self._max_in_flight - len(self._tasks)
        if free <= 0:
            self._held = True  # an attempt that ends wakes the loop
            return None
        self._claiming = True
        try:
            claim = await self._claims.claim(
                limit=free, per_endpoint=self._per_endpoint, busy=self._busy, lease_s=self._lease_s
            )
        finally:
            self._claiming = False
        self._full = claim.full  # an attempt that ends to one of them wakes the loop
        due_for = claim.due_for_s
        self._due_since = None if due_for is None else time.monotonic() - due_for
        for claimed in claim.claimed:
            self._start(claimed)
        if claim.disabled:
            await self._give_up_disabled(claim.disabled)
        if len(claim.claimed) >= free:
            self._held = True  # full: an attempt that ends wakes the loop
            return None
        if claim.wait_s is None or claim.wait_s > 0:
            return claim.wait_s
        # Due now: more than one claim takes, or locked by another dispatcher.
        return 0.0 if claim.claimed or claim.disabled else MIN_WAIT_S

    async def _give_up_disabled(self, ids: list[str]) -> None:
        try:
            dead = await self._attempts.give_up_disabled(ids)
        except Exception as exc:
            # Still leased: they come due again when the lease runs out.
            count_retry("webhook_record", exc)
            log.warning("webhooks: %d deliveries to disabled endpoints kept: %r", len(ids), exc)
            self.due_in(self._lease_s)
            return
        if dead:
            _disabled(dead)

    def _start(self, claimed: ClaimedDelivery) -> None:
        self._busy[claimed.endpoint] += 1
        task = asyncio.create_task(self._attempt(claimed), name=f"webhook-{claimed.id}")
        self._tasks.add(task)
        endpoint = claimed.endpoint

        def done(task: asyncio.Task[None]) -> None:
            self._done(task, endpoint)

        task.add_done_callback(done)

    def _done(self, task: asyncio.Task[None], endpoint: Endpoint) -> None:
        """A slot is free: claim again if the last claim went without it (it found this
        endpoint, or the dispatcher, full), or if a claim is running (the slots it counted
        taken include this one)."""
        self._tasks.discard(task)
        self._busy[endpoint] -= 1
        if self._busy[endpoint] <= 0:
            del self._busy[endpoint]
        if self._held or self._claiming or endpoint in self._full:
            self._held = False
            self._full = self._full - {endpoint}
            self.wake()

    async def _attempt(self, claimed: ClaimedDelivery) -> None:
        """One attempt. A failure to record it leaves the row leased: it comes due again
        when the lease runs out, with the same webhook-id."""
        leased_for = self._lease_s
        started = asyncio.get_running_loop().time()
        try:
            answer = await self._send(claimed)
            verdict = judge(answer, claimed.attempt, self._schedule, self._uniform)
            recorded = await self._record(claimed, answer, verdict)
        except Exception as exc:
            if count_retry("webhook_record", exc) is None:
                log.exception("webhooks: attempt %d of %s failed", claimed.attempt, claimed.id)
            else:
                log.warning(
                    "webhooks: attempt %d of %s not recorded: %r", claimed.attempt, claimed.id, exc
                )
            self.due_in(started + leased_for - asyncio.get_running_loop().time())
            return
        ATTEMPTS.labels(outcome=verdict.outcome.value).inc()
        if recorded.owned and verdict.outcome is Outcome.RETRY:
            self.due_in(verdict.wait_s)
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

    async def _record(
        self, claimed: ClaimedDelivery, answer: AttemptResult, verdict: Verdict
    ) -> Recorded:
        """Delivered and retried attempts are written together (``Recorder``); one after
        which the delivery is given up takes its own transaction."""
        if verdict.outcome in (Outcome.DELIVERED, Outcome.RETRY):
            attempted = Attempted(claimed=claimed, answer=answer, verdict=verdict)
            return Recorded(owned=await self._recorder.record(attempted))
        return await asyncio.shield(self._attempts.give_up(claimed, answer, verdict))

    async def _send(self, claimed: ClaimedDelivery) -> AttemptResult:
        if not claimed.secrets:
            return AttemptResult(status=None, error=NO_SECRET)
        headers = signed_headers(claimed.id, claimed.body, claimed.secrets, datetime.now(UTC))
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
