"""The lag rule without a monitor, a clock or a source: readings in, snapshots out."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from aiokafka.errors import KafkaConnectionError
from sqlalchemy.exc import OperationalError

from producers.lag import rule
from producers.lag.estimate import LagEstimate
from producers.lag.monitor import LagMonitor, cause_of
from producers.lag.rule import LagState, Reading


def readings(*steps: tuple[float, Reading], smoothing: float = 0.5) -> LagState:
    """The state after each (time, reading) in turn, from none."""
    state = LagState()
    for now, reading in steps:
        state = rule.advance(state, reading, now=now, smoothing=smoothing)
    return state


def test_no_reading_is_unknown_and_keeps_the_cause() -> None:
    snap = rule.snapshot(LagState(), now=5.0, stale_after_s=2.0, cause="broker_unavailable")
    assert not snap.known
    assert snap.age_s == float("inf")
    assert snap.cause == "broker_unavailable"


def test_consumer_lag_is_never_negative_and_a_missing_commit_is_zero() -> None:
    assert rule.consumer_lag({0: 10, 1: 3, 2: 7}, {0: 4, 1: 5}) == {0: 6, 1: 0, 2: 7}


def test_unpublished_jobs_are_backlog_too() -> None:
    state = readings((0.0, Reading({0: 10}, {0: 4}, unpublished=5)))
    snap = rule.snapshot(state, now=0.0, stale_after_s=2.0)
    assert snap.lag == 11
    assert dict(snap.per_partition) == {0: 6}
    assert state.consumer_lag == 6


def test_open_counts_cap_each_partition_at_its_consumer_lag() -> None:
    state = readings((0.0, Reading({0: 10, 1: 10}, {0: 8, 1: 0}, open={0: 5, 1: 4})))
    assert dict(state.per_partition) == {0: 2, 1: 4}
    assert state.total == 6
    assert state.consumer_lag == 12


def test_rates_are_smoothed_per_second() -> None:
    state = readings(
        (0.0, Reading({0: 100}, {0: 0})),
        (2.0, Reading({0: 140}, {0: 20})),  # 40 arrived, 20 left, in 2 s
        (3.0, Reading({0: 140}, {0: 60})),  # 40 left in 1 s
    )
    assert state.arrival_rate == pytest.approx(10.0)  # 20/s, then 0/s halfway
    assert state.drain_rate == pytest.approx(25.0)  # 10/s, then 40/s halfway


def test_a_second_reading_at_the_same_instant_measures_no_rate() -> None:
    state = readings((1.0, Reading({0: 100}, {0: 0})), (1.0, Reading({0: 120}, {0: 50})))
    assert state.drain_rate is None
    assert state.arrival_rate is None
    assert state.total == 70


def test_an_empty_group_measures_no_drain_but_an_arrival_rate() -> None:
    state = readings((0.0, Reading({0: 0}, {0: 0})), (1.0, Reading({0: 0}, {0: 0})))
    assert state.drain_rate is None
    assert state.arrival_rate == 0.0


def test_stalled_since_the_last_reading_that_moved() -> None:
    state = readings(
        (0.0, Reading({0: 0}, {0: 0})),
        (1.0, Reading({0: 50}, {0: 0})),  # arrived, nothing left
        (4.0, Reading({0: 50}, {0: 0})),
    )
    assert rule.snapshot(state, now=4.0, stale_after_s=60.0).stalled_s == 4.0
    moved = rule.advance(state, Reading({0: 50}, {0: 1}), now=5.0, smoothing=0.5)
    assert rule.snapshot(moved, now=5.0, stale_after_s=60.0).stalled_s == 0.0


def test_a_reading_goes_stale_after_stale_after_s() -> None:
    state = readings((10.0, Reading({0: 1}, {0: 0})))
    assert rule.snapshot(state, now=12.0, stale_after_s=2.0).known
    late = rule.snapshot(state, now=12.5, stale_after_s=2.0)
    assert not late.known
    assert late.age_s == 2.5
    assert late.lag == 1  # the old numbers stay, marked unknown


def test_drain_time_at_the_drain_rate() -> None:
    state = readings((0.0, Reading({0: 10}, {0: 0})), (1.0, Reading({0: 10}, {0: 4})))
    snap = rule.snapshot(state, now=1.0, stale_after_s=2.0)
    assert snap.drain_time_s(0) == 0.0
    assert snap.drain_time_s(8) == 2.0
    assert rule.snapshot(LagState(), now=0.0, stale_after_s=2.0).drain_time_s(1) is None


def test_why_a_reading_failed() -> None:
    assert cause_of(OSError("refused")) == "database_unavailable"
    assert cause_of(TimeoutError()) == "database_unavailable"
    assert cause_of(OperationalError("SELECT 1", {}, Exception("down"))) == "database_unavailable"
    assert cause_of(KafkaConnectionError()) == "broker_unavailable"


class FailingSource:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def read(self, tally: Callable[[], int]) -> Reading:
        raise self.exc


class OneSource:
    async def read(self, tally: Callable[[], int]) -> Reading:
        return Reading({0: 7}, {0: 2}, unpublished=1)


async def test_refresh_keeps_why_it_failed_and_a_reading_clears_it() -> None:
    estimate = LagEstimate()
    monitor = LagMonitor(
        FailingSource(KafkaConnectionError()), estimate=estimate, interval_s=1, stale_after_s=1
    )
    assert not await monitor.refresh()
    assert monitor.snapshot().cause == "broker_unavailable"
    monitor._source = OneSource()
    for _ in range(3):
        estimate.record_admission()
    estimate.record_commit(3)  # in the reading: its refresh began after they were committed
    waiting = asyncio.ensure_future(monitor.next_update())
    await asyncio.sleep(0)
    assert await monitor.refresh()
    await asyncio.wait_for(waiting, 1)
    snap = monitor.snapshot()
    assert (snap.known, snap.lag, snap.cause) == (True, 6, None)
    assert estimate.lag(snap.lag, snap.age_s) == 6  # not 6 + 3
