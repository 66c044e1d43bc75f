from __future__ import annotations

from collections.abc import Callable

from producers.lag.estimate import LagEstimate
from producers.lag.monitor import LagMonitor
from producers.lag.rule import Reading
from tests.support.admission import FakeClock, NoSource


def make() -> tuple[LagMonitor, FakeClock]:
    clock = FakeClock()
    return LagMonitor(
        NoSource(),
        estimate=LagEstimate(clock),
        interval_s=0.5,
        stale_after_s=2,
        clock=clock,
        smoothing=0.5,
    ), clock


def test_lag_is_the_sum_over_partitions() -> None:
    m, _ = make()
    m.update({0: 10, 1: 5, 2: 0}, {0: 4, 1: 5})
    snap = m.snapshot()
    assert snap.known
    assert snap.lag == 6
    assert dict(snap.per_partition) == {0: 6, 1: 0, 2: 0}
    assert snap.drain_rate is None  # one reading measures no rate


def test_rates_come_from_offset_movement_and_are_smoothed() -> None:
    m, clock = make()
    m.update({0: 100}, {0: 0})
    clock.t = 1
    m.update({0: 120}, {0: 10})  # 10 drained, 20 arrived in 1 s
    assert m.snapshot().drain_rate == 10
    assert m.snapshot().arrival_rate == 20
    clock.t = 2
    m.update({0: 120}, {0: 30})  # 20 drained in 1 s: smoothed halfway
    assert m.snapshot().drain_rate == 15
    assert m.snapshot().drain_time_s(30) == 2


def test_idle_group_keeps_its_drain_rate() -> None:
    m, clock = make()
    m.update({0: 10}, {0: 0})
    clock.t = 1
    m.update({0: 10}, {0: 10})
    clock.t = 2
    m.update({0: 10}, {0: 10})  # nothing to drain is not a drain rate of zero
    assert m.snapshot().drain_rate == 10


def test_reading_goes_stale() -> None:
    m, clock = make()
    m.update({0: 1}, {0: 0})
    clock.t = 3
    assert not m.snapshot().known


def test_open_lag_leaves_out_records_whose_jobs_ended() -> None:
    m, _ = make()
    # 10 records past the commit point of partition 0, of which 3 jobs have not ended.
    m.update({0: 10, 1: 5}, {0: 0, 1: 5}, open={0: 3})
    snap = m.snapshot()
    assert snap.lag == 3
    assert dict(snap.per_partition) == {0: 3, 1: 0}


def test_open_lag_is_never_above_the_consumer_lag() -> None:
    m, _ = make()
    m.update({0: 10}, {0: 8}, open={0: 5})  # a count past the end cannot add records
    assert m.snapshot().lag == 2


def test_open_drain_rate_counts_jobs_that_end_before_the_commit_moves() -> None:
    m, clock = make()
    m.update({0: 100}, {0: 0}, open={0: 100})
    clock.t = 1
    # 10 jobs ended behind a running one: the commit point did not move.
    m.update({0: 100}, {0: 0}, open={0: 90})
    assert m.snapshot().drain_rate == 10
    clock.t = 2
    # The commit point jumps past them and 10 more end: only those 10 are new.
    m.update({0: 100}, {0: 20}, open={0: 80})
    assert m.snapshot().drain_rate == 10


def test_a_backlog_that_does_not_move_is_stalled() -> None:
    clock = FakeClock()
    monitor = LagMonitor(
        NoSource(), estimate=LagEstimate(clock), interval_s=0.5, stale_after_s=60.0, clock=clock
    )
    monitor.update({0: 0}, {0: 0})
    clock.t = 1.0
    monitor.update({0: 50}, {0: 0})  # 50 arrive, none leave
    clock.t = 9.0
    monitor.update({0: 50}, {0: 0})
    assert monitor.snapshot().stalled_s == 9.0  # since the last reading that was empty
    clock.t = 10.0
    monitor.update({0: 50}, {0: 10})  # ten left: it moves
    assert monitor.snapshot().stalled_s == 0.0
    clock.t = 15.0
    monitor.update({0: 50}, {0: 50})  # empty: nothing to be stalled on
    assert monitor.snapshot().stalled_s == 0.0


class Handed:
    """A source that hands over the readings it is given (another replica's), then None."""

    def __init__(self) -> None:
        self.next: Reading | None = None

    async def read(self, tally: Callable[[], int]) -> Reading | None:
        found, self.next = self.next, None
        return found


async def test_a_reading_taken_elsewhere_keeps_its_age() -> None:
    clock, source = FakeClock(), Handed()
    m = LagMonitor(
        source,
        estimate=LagEstimate(clock),
        interval_s=0.5,
        stale_after_s=2,
        clock=clock,
        smoothing=0.5,
    )
    clock.t = 10
    source.next = Reading({0: 10}, {0: 4}, age_s=1.5)
    assert await m.refresh()
    assert m.snapshot().age_s == 1.5
    clock.t = 10.6  # past the bound, counted from when the reading began
    assert not m.snapshot().known


async def test_no_new_reading_changes_nothing() -> None:
    clock, source = FakeClock(), Handed()
    m = LagMonitor(
        source,
        estimate=LagEstimate(clock),
        interval_s=0.5,
        stale_after_s=2,
        clock=clock,
        smoothing=0.5,
    )
    source.next = Reading({0: 100}, {0: 0})
    assert await m.refresh()
    clock.t = 1
    source.next = Reading({0: 120}, {0: 10})
    assert await m.refresh()
    assert m.snapshot().drain_rate == 10
    clock.t = 2
    assert not await m.refresh()  # nothing new: no sample of zero drained
    assert m.snapshot().drain_rate == 10
    assert m.snapshot().age_s == 1
    clock.t = 3
    source.next = Reading({0: 120}, {0: 10}, age_s=2.5)  # older than the one it has
    assert not await m.refresh()
    assert m.snapshot().age_s == 2


async def test_admissions_since_a_shared_reading_began_are_unseen_by_it() -> None:
    clock, source = FakeClock(), Handed()
    estimate = LagEstimate(clock)
    m = LagMonitor(
        source,
        estimate=estimate,
        interval_s=0.5,
        stale_after_s=5,
        clock=clock,
        smoothing=0.5,
    )
    for _ in range(12):
        estimate.record_admission()
    committed = 0
    for t, count in ((0.0, 0), (0.5, 3), (1.0, 7), (1.5, 12)):
        clock.t = t
        estimate.record_commit(count - committed)
        committed = count
        source.next = Reading({0: 1}, {0: 0}, age_s=0.7) if t == 1.5 else None
        await m.refresh()
    # Begun at 0.8: it saw the 3 committed by the refresh at 0.5, not the 4 committed by
    # 1.0: the 9 admitted after those 3 are added to its lag of 1.
    assert estimate.lag(1, reading_age_s=0.7) == 1 + 9
