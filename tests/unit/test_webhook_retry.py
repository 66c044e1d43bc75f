"""The retry schedule, full jitter, Retry-After and the verdict of an attempt."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from workers.webhooks.retry import AttemptResult, Outcome, RetrySchedule, judge, parse_retry_after

SPEC = RetrySchedule(
    steps_s=(0.0, 5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0),
    retry_after_max_s=36000.0,
)


def top(a: float, b: float) -> float:
    """The jitter at its ceiling: the schedule's own step."""
    return b


def bottom(a: float, b: float) -> float:
    return a


def test_the_schedule_without_jitter_is_the_steps() -> None:
    waits = [SPEC.after_failure(n, None, top) for n in range(1, SPEC.attempts + 1)]
    assert waits == [5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0, None]
    assert SPEC.wait_before(1, top) == 0.0  # the first attempt is immediate


def test_full_jitter_spreads_each_wait_over_zero_to_its_step() -> None:
    rng = random.Random(7)
    waits = [SPEC.after_failure(2, None, rng.uniform) for _ in range(2000)]
    assert all(w is not None and 0.0 <= w <= 300.0 for w in waits)
    spread = [w for w in waits if w is not None]
    assert min(spread) < 30.0
    assert max(spread) > 270.0
    assert 130.0 < sum(spread) / len(spread) < 170.0  # uniform: mean near half the step


def test_retry_after_is_a_floor_under_the_jittered_wait_and_capped() -> None:
    assert SPEC.after_failure(1, 60.0, bottom) == 60.0
    assert SPEC.after_failure(1, 1.0, top) == 5.0  # the schedule's wait is longer
    capped = RetrySchedule(steps_s=(0.0, 1.0), retry_after_max_s=10.0)
    assert capped.after_failure(1, 99999.0, bottom) == 10.0
    assert capped.after_failure(2, 5.0, bottom) is None  # no attempt left


def test_parse_retry_after() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(" 7 ") == 7.0
    assert parse_retry_after(format_datetime(now + timedelta(seconds=90), usegmt=True), now) == 90
    assert parse_retry_after(format_datetime(now - timedelta(seconds=90), usegmt=True), now) == 0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-5") is None


SHORT = RetrySchedule(steps_s=(0.0, 2.0, 4.0), retry_after_max_s=100.0)


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_only_2xx_delivers(status: int) -> None:
    assert judge(AttemptResult(status=status), 1, SHORT, top).outcome is Outcome.DELIVERED


@pytest.mark.parametrize("status", [None, 100, 301, 302, 307, 308, 400, 404, 429, 500, 503])
def test_anything_else_is_retried_until_the_last_attempt(status: int | None) -> None:
    answer = AttemptResult(status=status, error="x")
    assert judge(answer, 1, SHORT, top).outcome is Outcome.RETRY
    assert judge(answer, 2, SHORT, top).wait_s == 4.0
    last = judge(answer, 3, SHORT, top)
    assert last.outcome is Outcome.DEAD
    assert last.reason is not None
    assert "gave up after 3 attempts" in last.reason


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_counts_on_429_and_503(status: int) -> None:
    verdict = judge(AttemptResult(status=status, retry_after_s=50.0), 1, SHORT, top)
    assert verdict == judge(AttemptResult(status=status, retry_after_s=50.0), 1, SHORT, bottom)
    assert verdict.wait_s == 50.0


def test_retry_after_is_ignored_on_other_statuses() -> None:
    assert judge(AttemptResult(status=500, retry_after_s=50.0), 1, SHORT, top).wait_s == 2.0


def test_410_disables_and_a_refused_address_is_given_up_at_once() -> None:
    assert judge(AttemptResult(status=410), 1, SHORT, top).outcome is Outcome.GONE
    refused = judge(
        AttemptResult(status=None, error="refused: loopback", refused=True), 1, SHORT, top
    )
    assert refused.outcome is Outcome.DEAD
    assert refused.reason == "refused: loopback"
