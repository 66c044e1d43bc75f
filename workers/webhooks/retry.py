"""What happens after a webhook attempt: delivered, retried later, or given up (pure).

The schedule is a list of waits, one before each attempt (Standard Webhooks suggests
immediately, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h). Each wait is drawn uniformly from
``[0, step]`` (full jitter), so receivers that failed together are not retried together;
a ``Retry-After`` on 429 or 503 is a floor under that wait.
"""

from __future__ import annotations

import email.utils
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Protocol


class Uniform(Protocol):
    """``random.Random().uniform``: the jitter's source, a seam for tests."""

    def __call__(self, a: float, b: float, /) -> float: ...


@dataclass(frozen=True, kw_only=True)
class RetrySchedule:
    steps_s: tuple[float, ...]
    retry_after_max_s: float

    @property
    def attempts(self) -> int:
        return len(self.steps_s)

    def wait_before(self, attempt: int, uniform: Uniform) -> float:
        """Seconds to wait before attempt number ``attempt`` (1-based), jittered."""
        step = self.steps_s[attempt - 1]
        return uniform(0.0, step) if step > 0 else 0.0

    def after_failure(
        self, attempt: int, retry_after_s: float | None, uniform: Uniform
    ) -> float | None:
        """The wait before the next attempt once attempt ``attempt`` failed; None when it
        was the last one."""
        if attempt >= self.attempts:
            return None
        wait = self.wait_before(attempt + 1, uniform)
        if retry_after_s is not None:
            wait = max(wait, min(retry_after_s, self.retry_after_max_s))
        return wait


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP-date; None if absent
    or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


@dataclass(frozen=True, kw_only=True)
class AttemptResult:
    """How one attempt went. ``status`` is None when no response came (DNS, connect,
    timeout, refused by the SSRF policy, no secret to sign with)."""

    status: int | None
    error: str | None = None
    retry_after_s: float | None = None
    refused: bool = False  # the address policy refused the destination: never retried
    duration_ms: float = 0.0


class Outcome(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    DEAD = "dead"
    GONE = "gone"  # 410: the endpoint is disabled, this delivery dead-lettered


@dataclass(frozen=True, kw_only=True)
class Verdict:
    outcome: Outcome
    wait_s: float = 0.0  # before the next attempt, for RETRY
    reason: str | None = None  # why it was given up, for DEAD and GONE
    code: str | None = None  # the same as a stable label: gone, refused, retries_exhausted


def judge(
    answer: AttemptResult, attempt: int, schedule: RetrySchedule, uniform: Uniform
) -> Verdict:
    """Only a 2xx delivers; a 410 disables the endpoint; a refused address is given up at
    once; anything else (3xx included: redirects are never followed) is retried on the
    schedule until the last attempt."""
    status = answer.status
    if status is not None and 200 <= status < 300:
        return Verdict(outcome=Outcome.DELIVERED)
    if status == 410:
        return Verdict(outcome=Outcome.GONE, reason="endpoint answered 410 Gone", code="gone")
    if answer.refused:
        return Verdict(
            outcome=Outcome.DEAD, reason=answer.error or "destination refused", code="refused"
        )
    honoured = answer.retry_after_s if status in (429, 503) else None
    wait = schedule.after_failure(attempt, honoured, uniform)
    if wait is None:
        last = f"HTTP {status}" if status is not None else (answer.error or "no response")
        return Verdict(
            outcome=Outcome.DEAD,
            reason=f"gave up after {attempt} attempts (last: {last})",
            code="retries_exhausted",
        )
    return Verdict(outcome=Outcome.RETRY, wait_s=wait)
