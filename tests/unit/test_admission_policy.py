"""The admission policy's pure rules, on lag snapshots made by hand: no monitor, no waiting."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from producers.admission.policy import REFUSALS, UNAVAILABLE, Refused
from producers.lag.rule import LagSnapshot
from schemas.jobs import Priority
from tests.support.admission import NOW, POLICY


def lag(records: int, drain_rate: float | None = 10.0, stalled_s: float = 0.0) -> LagSnapshot:
    return LagSnapshot(
        known=True,
        lag=records,
        per_partition={0: records},
        drain_rate=drain_rate,
        arrival_rate=None,
        age_s=0.0,
        stalled_s=stalled_s,
    )


def test_thresholds_by_priority_and_with_hysteresis() -> None:
    assert POLICY.thresholds(Priority.HIGH) == (200, 200)
    assert POLICY.thresholds(Priority.NORMAL) == (100, 200)
    assert POLICY.thresholds(Priority.LOW) == (50, 100)
    assert POLICY.thresholds_now(Priority.NORMAL, throttled=False) == (100, 200)
    assert POLICY.thresholds_now(Priority.NORMAL, throttled=True) == (90, 200)
    assert POLICY.thresholds_now(Priority.LOW, throttled=True) == (45, 100)
    assert POLICY.thresholds_now(Priority.HIGH, throttled=True) == (200, 200)


def test_clamp() -> None:
    assert POLICY.clamp(0.1) == POLICY.retry_min_s
    assert POLICY.clamp(7.0) == 7.0
    assert POLICY.clamp(1e6) == POLICY.retry_max_s


def test_a_group_consumes_nothing_only_when_stalled_long_with_nothing_running() -> None:
    assert POLICY.consumes_nothing(lag(5, stalled_s=10.0), running=0)
    assert not POLICY.consumes_nothing(lag(5, stalled_s=9.9), running=0)
    assert not POLICY.consumes_nothing(lag(5, stalled_s=60.0), running=1)
    assert not POLICY.consumes_nothing(lag(0, stalled_s=60.0), running=0)


def test_retry_after_at_the_drain_rate_else_from_the_running_jobs_else_the_most() -> None:
    assert POLICY.retry_after_s(lag(300), 100, 10, running=0) == pytest.approx(10.0)
    # Not measured: 4 running jobs of 100 tokens at 0.01 s end one per 0.25 s.
    assert POLICY.retry_after_s(lag(300, None), 100, 100, running=4) == pytest.approx(25.0)
    assert POLICY.retry_after_s(lag(300, None), 100, 100, running=0) == POLICY.retry_max_s
    assert POLICY.retry_after_s(lag(300), 1, 10, running=0) == POLICY.retry_min_s


def test_over_says_how_far_behind_and_when_to_come_back() -> None:
    refused = POLICY.over(lag(250), "lag_hard", 100, 10, running=0)
    assert (refused.reason, refused.status, refused.lag) == ("lag_hard", 429, 250)
    assert refused.retry_after_s == pytest.approx(15.0)
    assert "worker running" not in str(refused)
    idle = POLICY.over(lag(250, stalled_s=30.0), "lag_hard", 100, 10, running=0)
    assert "is any worker running?" in str(idle)
    assert idle.retry_after_s == POLICY.retry_max_s


def test_an_unknown_lag_is_refused_as_unavailable() -> None:
    unknown = POLICY.unknown(replace(lag(0), known=False))
    assert (unknown.reason, unknown.status, unknown.lag) == ("lag_unknown", 503, None)
    assert unknown.retry_after_s == pytest.approx(1.0)  # two lag intervals
    cause = POLICY.unknown(replace(lag(0), known=False, cause="database_unavailable"))
    assert (cause.reason, cause.status) == ("database_unavailable", 503)


def deadline(
    records: int,
    ttl_s: float,
    *,
    running: int = 0,
    aware: bool = True,
    drain_rate: float | None = 10.0,
    measured_after: int = 0,
    measured: float | None = None,
) -> Refused | None:
    """The deadline rule for a job of 10 tokens due in ``ttl_s``."""
    policy = replace(POLICY, deadline_aware=aware, measured_after=measured_after)
    return policy.deadline_refusal(
        lag(records, drain_rate),
        running=running,
        measured_token_time_s=measured,
        max_tokens=10,
        deadline=NOW + timedelta(seconds=ttl_s),
        now=NOW,
    )


def test_the_deadline_rule() -> None:
    # 50 ahead at 10/s: 5 s of queue, plus 10 tokens x 0.01 s of service.
    refused = deadline(50, 5.0)
    assert refused is not None
    assert refused.reason == "deadline_unreachable"
    assert refused.retry_after_s == pytest.approx(5.0)
    assert deadline(50, 5.2) is None
    assert deadline(50, 3.2, running=20) is None  # running jobs are not queue ahead
    assert deadline(50, 1.0, aware=False) is None


def test_the_batch_rule() -> None:
    def batch(jobs: int, ahead: int, ttl_s: float, running: int = 0) -> Refused | None:
        return POLICY.batch_refusal(
            lag(50),
            running=running,
            measured_token_time_s=None,
            jobs=jobs,
            ahead=ahead,
            max_tokens=10,
            deadline=NOW + timedelta(seconds=ttl_s),
            now=NOW,
        )

    # Its last job waits for the 50 queued, the 20 held ahead and its 29 others: 9.9 s at
    # 10/s, plus 0.1 s of service.
    assert batch(30, 20, 10.0) is None
    refused = batch(30, 20, 9.5)
    assert refused is not None
    assert refused.reason == "deadline_unreachable"
    assert refused.retry_after_s == pytest.approx(POLICY.clamp(0.5))
    assert batch(30, 20, 9.5, running=5) is None  # running jobs are not queue ahead


def test_no_deadline_refusal_without_a_prediction() -> None:
    assert deadline(50, 0.0, drain_rate=None) is None  # no drain rate measured
    assert deadline(0, 6.0, measured_after=8) is None  # the speed is not measured yet
    # 10 tokens at the measured 1 s each: 10 s, past the deadline.
    assert deadline(0, 6.0, measured_after=8, measured=1.0) is not None


def test_every_refusal_has_a_meaning() -> None:
    assert set(REFUSALS) >= UNAVAILABLE
    for reason in REFUSALS:
        refused = Refused(reason, "x", retry_after_s=1.0, lag=None)
        assert refused.status == (503 if reason in UNAVAILABLE else 429)
