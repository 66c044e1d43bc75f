from producers.lag import LagMonitor
from tests.unit.test_admission import FakeClock, NoSource


def make() -> tuple[LagMonitor, FakeClock]:
    clock = FakeClock()
    return LagMonitor(
        NoSource(), interval_s=0.5, stale_after_s=2, clock=clock, smoothing=0.5
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
