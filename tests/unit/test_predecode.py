"""The pre-decode gate's verdicts, the speed it predicts with, and the notices it hears."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from plumbing.notify import JobNotice
from schemas.jobs import JobKind
from schemas.states import JobState
from workers.gate import Candidate, Drop, PreDecodeGate, lease_lapsed
from workers.kv import ExpectedOutput, SpeedMeter

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def candidate(**changes: object) -> Candidate:
    base: dict[str, object] = {
        "job_id": "j",
        "state": JobState.DISPATCHED,
        "kind": JobKind.COMPLETE,
        "prompt_tokens": 1000,
        "max_tokens": 500,
        "deadline": NOW + timedelta(seconds=60),
        "abandon_after_s": None,
        "last_seen_at": NOW,
        "db_now": NOW,
    }
    base.update(changes)
    return Candidate(**base)  # type: ignore[arg-type]


def measured(decode_s_per_token: float = 0.02, prefill_s_per_token: float = 0.0001) -> SpeedMeter:
    speed = SpeedMeter(window=16, min_samples=4)
    for _ in range(4):
        speed.record(
            prompt_tokens=1000,
            first_token_s=1000 * prefill_s_per_token,
            output_tokens=101,
            total_s=1000 * prefill_s_per_token + 100 * decode_s_per_token,
        )
    return speed


def gate(speed: SpeedMeter | None = None, *, drop_unreachable: bool = True) -> PreDecodeGate:
    return PreDecodeGate(
        speed=speed or measured(), expected=ExpectedOutput(), drop_unreachable=drop_unreachable
    )


def test_a_fit_job_runs() -> None:
    assert gate().verdict(candidate(), NOW) is None


def test_a_passed_deadline_expires() -> None:
    drop = gate().verdict(candidate(deadline=NOW), NOW)
    assert drop == Drop(state=JobState.EXPIRED, reason="deadline_passed")
    assert drop.error("before_decode")["code"] == "deadline_passed"


def test_an_unreachable_deadline_expires_and_can_be_turned_off() -> None:
    # 0.1 s of prefill + 499 tokens at 20 ms = 10.08 s of service: a 10 s deadline is short.
    job = candidate(deadline=NOW + timedelta(seconds=10))
    assert gate().verdict(job, NOW) == Drop(state=JobState.EXPIRED, reason="deadline_unreachable")
    assert gate(drop_unreachable=False).verdict(job, NOW) is None
    assert gate().verdict(candidate(deadline=NOW + timedelta(seconds=10.2)), NOW) is None


def test_no_unreachable_drop_before_the_speed_is_measured() -> None:
    unmeasured = SpeedMeter(min_samples=4)
    job = candidate(deadline=NOW + timedelta(seconds=0.001))
    assert gate(unmeasured).verdict(job, NOW) is None


def test_the_expected_output_sizes_the_prediction() -> None:
    expected = ExpectedOutput(observed=True, quantile=0.5, min_samples=1, window=8)
    expected.record(JobKind.COMPLETE, 50)
    predecode = PreDecodeGate(speed=measured(), expected=expected)
    # 50 expected tokens, not 500: about 1.1 s, well inside 10 s.
    assert predecode.verdict(candidate(deadline=NOW + timedelta(seconds=10)), NOW) is None


def test_a_lapsed_lease_is_abandoned_by_the_database_clock() -> None:
    job = candidate(
        abandon_after_s=5.0,
        last_seen_at=NOW - timedelta(seconds=6),
        db_now=NOW,
    )
    # The lease is judged by the database's clock (db_now), which stamped last_seen_at.
    assert gate().verdict(job, NOW - timedelta(seconds=30)) == Drop(
        state=JobState.ABANDONED, reason="heartbeat_lapsed"
    )
    fresh = candidate(abandon_after_s=5.0, last_seen_at=NOW - timedelta(seconds=4), db_now=NOW)
    assert gate().verdict(fresh, NOW) is None
    assert not lease_lapsed(None, NOW - timedelta(days=1), NOW)


@pytest.mark.parametrize(
    ("state", "reason"),
    [(JobState.CANCELLED, "cancelled"), (JobState.ABANDONED, "disconnected")],
)
def test_a_job_already_stopped_is_let_go_without_a_write(state: JobState, reason: str) -> None:
    drop = gate().verdict(candidate(state=state, reason=reason), NOW)
    assert drop == Drop(state=state, reason=reason, store_state=False)


def test_a_stopped_job_wins_over_a_passed_deadline() -> None:
    job = candidate(state=JobState.CANCELLED, reason="cancelled", deadline=NOW)
    drop = gate().verdict(job, NOW)
    assert drop is not None
    assert drop.state is JobState.CANCELLED


def test_speed_is_the_median_of_recent_jobs() -> None:
    speed = SpeedMeter(window=3, min_samples=3)
    for per_token in (0.01, 0.02, 0.03, 0.5):  # the first falls out of the window
        speed.record(prompt_tokens=10, first_token_s=0.0, output_tokens=11, total_s=per_token * 10)
    assert speed.samples == 3
    assert speed.service_s(prompt_tokens=10, output_tokens=101) == pytest.approx(3.0)


def test_notices_parse() -> None:
    notice = JobNotice.parse("abc cancelled 1700000000.25 cancelled")
    assert notice == JobNotice(
        job_id="abc", state="cancelled", at=1700000000.25, reason="cancelled"
    )
    assert JobNotice.parse("abc expired 12") == JobNotice(
        job_id="abc", state="expired", at=12.0, reason="expired"
    )
    assert JobNotice.parse("abc succeeded 12 succeeded batch") == JobNotice(
        job_id="abc", state="succeeded", at=12.0, reason="succeeded", in_batch=True
    )
    assert JobNotice.parse("abc succeeded 12 succeeded -") == JobNotice(
        job_id="abc", state="succeeded", at=12.0, reason="succeeded", in_batch=False
    )
    assert JobNotice.parse("garbage") is None
    assert JobNotice.parse("a b notanumber") is None
